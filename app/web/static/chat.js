() => {
  // Browser first glyph: from Enter (or the send button) to the first glyph of the *new* answer on screen.
  // Each answer is one bot group in the chatbot; the question's answer is the group at the index the
  // chat had groups when it was sent (the previous answers come before it). The time is taken after
  // the next frame is painted (requestAnimationFrame runs before the paint, the task after it runs
  // after), and the caption's details show it for that answer. On a phone the sidebar starts closed.
  const state = window.__pdGlyph = window.__pdGlyph || {pending: null, measured: [], byAnswer: {}};
  const answers = () => [...document.querySelectorAll('#chatbot .message.bot')];
  // An answer's own text: its messages that are not a caption or notice (those fold under a title).
  const text = (group) => [...group.querySelectorAll('[data-testid=bot]')]
    .filter(m => !m.querySelector('.thought-group')).map(m => m.innerText).join('').trim();
  const start = () => { state.pending = {t0: performance.now(), index: answers().length}; };
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.target.closest('#message')) start();
  }, true);
  document.addEventListener('click', (e) => {
    if (e.target.closest('#send')) start();
    if (e.target.closest('#retry')) { delete state.byAnswer[answers().length - 1]; state.pending = null; }
    if (e.target.closest('#conversations, #new-conversation')) { state.byAnswer = {}; state.pending = null; }
  }, true);
  new MutationObserver(() => {
    const p = state.pending;
    if (p && p.t1 === undefined) {
      const group = answers()[p.index];
      if (group && text(group)) {
        p.t1 = performance.now();
        requestAnimationFrame(() => setTimeout(() => {
          const ms = Math.round(performance.now() - p.t0);
          state.byAnswer[p.index] = ms;
          state.measured.push(ms);
        }, 0));
      }
    }
    for (const span of document.querySelectorAll('#chatbot .pd-glyph:not([data-filled])')) {
      const ms = state.byAnswer[answers().indexOf(span.closest('.message.bot'))];
      if (ms !== undefined) { span.textContent = String(ms); span.dataset.filled = '1'; }
    }
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
  if (window.matchMedia('(max-width: 640px)').matches) {
    const close = (tries) => {
      const bar = document.querySelector('#pd-sidebar');
      if (bar && bar.classList.contains('open')) bar.querySelector('.toggle-button').click();
      else if (tries > 0) setTimeout(() => close(tries - 1), 50);
    };
    close(100);
  }
}
