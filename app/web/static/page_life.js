// A page's liveness without a held connection (app/web/sessions.py). Gradio's page kept a heartbeat stream open
// so that the server learned when it closed; a browser holds six connections per host, so six open tabs (chat
// or console) held them all and a seventh never loaded. The server tells Gradio's page to open none
// (app/web/gradio_state.py); this page says it is alive in one short request every 15 s instead (a background
// tab's timers run once a minute), and that it was closed, when it is.
(() => {
  const hash = window.__gradio_session_hash__;
  if (!hash) return;
  const root = ((window.gradio_config && window.gradio_config.root) || '/').replace(/\/?$/, '/');
  const url = new URL(`gradio_api/heartbeat/${hash}`, new URL(root, location.href)).href;
  const alive = () => fetch(url, {credentials: 'same-origin', cache: 'no-store'}).then(
    (r) => r.arrayBuffer(), () => {});
  alive();
  setInterval(alive, 15000);
  addEventListener('pagehide', () => navigator.sendBeacon(url));
  addEventListener('pageshow', (e) => { if (e.persisted) alive(); });  // back from the browser's page cache
})();
