(...inputs) => {
  if (window.__pdFresh) { inputs[1] = null; window.__pdFresh = false; }
  return inputs;
}
