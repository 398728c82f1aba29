(...inputs) => {
  if (window.__pdFresh) { inputs[2] = null; window.__pdFresh = false; }
  const box = document.querySelector('#message textarea');
  if (box) {
    try { localStorage.setItem('prefixdesk-sending', box.value); localStorage.removeItem('prefixdesk-draft'); }
    catch (e) {}
    box.value = ''; box.dispatchEvent(new Event('input', {bubbles: true}));
  }
  return inputs;
}
