() => {
  // Browser first glyph: from Enter (or the send button, or Retry) to the first glyph of the *new* answer on
  // screen. Each answer is one bot group in the chatbot; the question's answer is the group at the index the
  // chat had groups when it was sent (Retry: the last group, once the old answer, captioned, has gone). The
  // time is taken after the next frame is painted (requestAnimationFrame runs before the paint, the task after
  // it runs after). Once the answer's caption is drawn, the page writes the time into it (its title and its first
  // figure, as the server words them: app/chat/text.py) and sends it to the server through its private report box
  // (#pd-glyph-report), which stores it with the answer. The chatbot is not drawn again for it: a redraw would
  // unmark a 👍 given meanwhile.
  const state = window.__pdGlyph = window.__pdGlyph || {pending: null, measured: [], byAnswer: {}, reported: {}};
  const answers = () => [...document.querySelectorAll('#chatbot .message.bot')];
  const captioned = (group) => !!group.querySelector('.thought-group');
  // An answer's own text: its messages that are not a caption (those fold under a title).
  const text = (group) => [...group.querySelectorAll('[data-testid=bot]')]
    .filter(m => !m.querySelector('.thought-group')).map(m => m.innerText).join('').trim();
  // retry: the answer replaces the last one (Retry, Continue, an edited question); asked: a question not from the
  // box (a suggested one).
  const start = (retry, asked = false) => {
    if (!retry && !asked && !(document.querySelector('#message textarea')?.value || '').trim()) return;  // nothing sent
    // A notice alone in the last group (a refusal, "describe your question first") gives way to the answer: the
    // answer takes its place, once the server's first update has removed it. Until then that group is the notice,
    // which is no text of the answer: its text is kept, to be told apart.
    const groups = answers(), last = groups[groups.length - 1];
    const notice = !!last && !captioned(last) && last.innerText.trim().startsWith(TEXT.notice.trim());
    const index = retry ? Math.max(groups.length - 1, 0) : groups.length - (notice ? 1 : 0);
    delete state.byAnswer[index]; delete state.reported[index];
    state.pending = {t0: performance.now(), index, retry, bot: lastBot(), notice: notice ? text(last) : '', bots: botCount(),
                     users: document.querySelectorAll('#chatbot [data-testid=user]').length};
  };
  const report = (ms) => {
    const box = document.querySelector('#pd-glyph-report textarea');
    if (!box) return;
    box.value = String(ms);
    box.dispatchEvent(new Event('input', {bubbles: true}));
    setTimeout(() => document.querySelector('#pd-glyph-send')?.click(), 0);  // once the box holds the value
  };
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.target.closest('#message')) start(false);
  }, true);
  document.addEventListener('click', (e) => {
    if (e.target.closest('#send')) start(false);
    if (e.target.closest('#retry, #continue')) start(true);
    if (e.target.closest('#chatbot .example')) start(false, true);
    // An edited question's ✓ (the first button under the message whose edit box is open): its answer replaces
    // the last.
    const edited = e.target.closest('#chatbot .message-buttons-right button');
    const editing = edited && edited.closest('.message-buttons-right').previousElementSibling;
    if (editing && editing.querySelector('.edit-textarea') && !edited.previousElementSibling) start(true);
    if (e.target.closest('#conversations, #new-conversation')) {
      state.byAnswer = {}; state.reported = {}; state.pending = null;
    }
    // The next question begins a new conversation (static/clear_box.js), however soon it is sent.
    const option = e.target.closest('#template [data-testid=dropdown-option]');
    const current = document.querySelector('#template input')?.value;
    if (e.target.closest('#new-conversation, #delete') || (option && option.innerText.trim() !== current)) {
      window.__pdFresh = true;
    }
    if (e.target.closest('#conversations')) window.__pdFresh = false;
  }, true);
  // What the customer typed survives a reload and a server restart (after which Gradio reloads the page): the
  // box's text is kept in the browser as it is typed, and a question on its way until the page shows it.
  const TEXT = /*PD_TEXT*/{};
  // Deleting a conversation asks first: a click the customer takes back reaches no handler (window's capture phase
  // runs before the page's and Gradio's own).
  window.addEventListener('click', (e) => {
    if (e.target.closest && e.target.closest('#delete') && !window.confirm(TEXT.delete_confirm)) {
      e.stopImmediatePropagation();
      e.preventDefault();
    }
  }, true);
  const DRAFT = 'prefixdesk-draft', SENDING = 'prefixdesk-sending';
  const keep = (k, v) => { try { if (v) localStorage.setItem(k, v); else localStorage.removeItem(k); } catch (e) {} };
  const kept = (k) => { try { return localStorage.getItem(k) || ''; } catch (e) { return ''; } };
  const box = () => document.querySelector('#message textarea');
  const fill = (text) => {
    const b = box();
    if (b && !b.value && text) { b.value = text; b.dispatchEvent(new Event('input', {bubbles: true})); }
  };
  const lastQuestion = () => {
    const asked = [...document.querySelectorAll('#chatbot [data-testid=user]')];
    return asked.length ? asked[asked.length - 1].innerText.trim() : null;
  };
  let touched = false;
  document.addEventListener('input', (e) => {
    if (e.isTrusted && e.target.closest('#message')) { touched = true; keep(DRAFT, e.target.value); }
  }, true);
  document.addEventListener('keydown', (e) => { if (e.target.closest('#message')) touched = true; }, true);
  const restore = (tries) => {
    if (!document.querySelector('#template input')?.value) { if (tries > 0) setTimeout(() => restore(tries - 1), 100); return; }
    setTimeout(() => {  // the load event has drawn the open conversation by now
      if (touched) return;  // the customer is typing or has sent already: their box is theirs
      const sending = kept(SENDING);
      if (sending && lastQuestion() === sending.trim()) keep(SENDING, '');
      fill(kept(DRAFT) || kept(SENDING));
    }, 300);
  };
  restore(300);
  // The box keeps at most its maxlength (the desk's limit on a message): the browser cuts a longer paste without a
  // word, so the page says so, with the limit, under the composer until the box is short of the limit again.
  const pasteCut = (show) => {
    let note = document.querySelector('#pd-paste-cut');
    if (!show) { if (note) note.remove(); return; }
    const row = document.querySelector('#pd-composer');
    if (!row) return;
    if (!note) {
      note = document.createElement('div');
      note.id = 'pd-paste-cut';
      note.setAttribute('role', 'status');
      row.after(note);
    }
    note.textContent = TEXT.notice + TEXT.pasted_cut.replaceAll('{limit}', String(box().maxLength));
  };
  document.addEventListener('paste', (e) => {
    const b = e.target.closest && e.target.closest('#message textarea');
    if (!b || !(b.maxLength > 0)) return;
    const pasted = (e.clipboardData && e.clipboardData.getData('text')) || '';
    const left = b.value.length - ((b.selectionEnd || 0) - (b.selectionStart || 0));
    pasteCut(left + pasted.length > b.maxLength);
  }, true);
  document.addEventListener('input', (e) => {
    const b = e.target.closest && e.target.closest('#message textarea');
    if (b && b.value.length < b.maxLength) pasteCut(false);
  }, true);
  // Copy gives the answer as the customer reads it, and only the answer. Gradio's copy button sits under a group (the
  // messages of one turn) and copies all of it: each message's value on a line of its own, a captioned one as
  // "title\n  details" — so an answer's copy carried its caption. An answer's value is the HTML made from its
  // Markdown (app/chat/markdown.py), one <div class="pd-md"> each; what lies outside those (the caption, written
  // after it) is no part of the answer. (Without the clipboard API, on a page not served over https, Gradio copies
  // through a textarea of its own: the copy event below.) The value is read as HTML in an inert document (DOMParser:
  // nothing loads or runs) and each answer written as lines of text: paragraphs, list items ("- ", "1. "), code and
  // quotes on lines of their own.
  const plain = (value) => {
    const doc = new DOMParser().parseFromString(String(value), 'text/html');
    const walker = doc.createTreeWalker(doc.body, NodeFilter.SHOW_TEXT), gaps = [];
    while (walker.nextNode()) {  // the line breaks between tags are the HTML's, not the answer's
      const node = walker.currentNode;
      if (/^\s*$/.test(node.data) && node.data.includes('\n') && !node.parentElement.closest('pre')) gaps.push(node);
    }
    gaps.forEach((node) => node.remove());
    for (const br of doc.querySelectorAll('br')) br.replaceWith('\n');
    for (const list of doc.querySelectorAll('ol, ul')) {
      [...list.children].forEach((li, i) => {
        li.prepend(list.tagName === 'OL' ? `${i + 1}. ` : '- ');
        li.append('\n');
      });
      if (list.parentElement.closest('li')) list.prepend('\n');
    }
    for (const block of doc.querySelectorAll('p, pre, blockquote, h1, h2, h3, h4, h5, h6, hr, ol, ul, div')) {
      block.append('\n\n');
    }
    return [...doc.querySelectorAll('.pd-md')].map((answer) => answer.textContent.replace(/\n{3,}/g, '\n\n').trim())
      .join('\n\n');
  };
  const ANSWER = 'class="pd-md';
  if (navigator.clipboard && navigator.clipboard.writeText) {
    const write = navigator.clipboard.writeText.bind(navigator.clipboard);
    navigator.clipboard.writeText = (value) => write(String(value).includes(ANSWER) ? plain(value) : value);
  }
  document.addEventListener('copy', (e) => {  // Gradio's own textarea, selected and copied (no clipboard API)
    const area = e.target;
    if (!(area instanceof HTMLTextAreaElement) || area.parentElement !== document.body || !area.value.includes(ANSWER)) return;
    e.clipboardData.setData('text/plain', plain(area.value));
    e.preventDefault();
  }, true);
  // Gradio names a thumb it has marked, and the chat's scroll-down arrow, in English of its own ("Liked",
  // "Disliked", "Scroll down": not in its translations): the page's words instead, as it sets them (an attribute
  // alone changes).
  const THUMBS = {Liked: TEXT.liked, Disliked: TEXT.disliked, 'Scroll down': TEXT.scroll_down};
  const thumbs = () => {
    for (const b of document.querySelectorAll('#chatbot button[aria-label=Liked], #chatbot button[aria-label=Disliked], '
                                              + '#chatbot button[aria-label="Scroll down"]')) {
      const said = THUMBS[b.getAttribute('aria-label')];
      b.setAttribute('aria-label', said);
      if (b.hasAttribute('title')) b.setAttribute('title', said);
    }
  };
  new MutationObserver(thumbs).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                         attributeFilter: ['aria-label', 'title']});
  // An answer's links (app/chat/markdown.py) say nofollow: Gradio's sanitizer writes its own rel over theirs.
  const REL = 'noopener noreferrer nofollow';
  new MutationObserver(() => {
    for (const a of document.querySelectorAll('#chatbot .pd-md a[href]')) {
      if (a.getAttribute('rel') !== REL) a.setAttribute('rel', REL);
    }
    const sending = kept(SENDING);
    if (sending && lastQuestion() === sending.trim()) keep(SENDING, '');  // the server has it
    // Gradio's own "connection lost" toast, in the page's language; the question goes back to the box.
    for (const toast of document.querySelectorAll('[data-testid=toast-body]:not([data-pd])')) {
      if (!/Connection/i.test(toast.innerText)) continue;
      toast.dataset.pd = '1';
      const text = toast.querySelector('[data-testid=toast-text]');
      if (text) text.innerText = TEXT.offline || text.innerText;
      const title = toast.querySelector('.toast-title-row span');
      if (title) title.innerText = TEXT.offline_title || title.innerText;
      fill(kept(SENDING));
      if (state.pending) state.pending.done = true;  // nothing more comes for it: the composer is free again
      composer();
    }
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
  // The composer says what can be done now: Stop only while an answer streams, Retry only when it has ended,
  // Continue only under an answer cut off at its length.
  const lastBot = () => {
    const bots = document.querySelectorAll('#chatbot [data-testid=bot]');
    return bots.length ? bots[bots.length - 1].innerText.trim() : '';
  };
  const botCount = () => document.querySelectorAll('#chatbot [data-testid=bot]').length;
  const composer = () => {
    const p = state.pending, groups = answers(), last = groups[groups.length - 1];
    if (p && !p.done) {
      const group = groups[p.index], bot = lastBot();
      const answered = group && captioned(group) && (!p.retry || p.fresh);
      // A notice ends it too (a refusal, a person's conversation): a new one, even when it says what the last
      // one said (a second break-off), and the one notice that a person has the conversation once it has moved
      // under the message just sent (the server shows one, under the customer's last message: app/chat/render.py).
      const said = [...document.querySelectorAll('#chatbot [data-testid=user], #chatbot [data-testid=bot]')];
      const lastSaid = said[said.length - 1];
      const asked = document.querySelectorAll('#chatbot [data-testid=user]').length > p.users;
      const noticed = bot.startsWith(TEXT.notice.trim());
      const refused = noticed && ((bot !== p.bot || botCount() !== p.bots)
                                  || (asked && !!lastSaid && lastSaid.dataset.testid === 'bot'));
      if (answered || refused) p.done = true;
    }
    const streaming = !!p && !p.done;
    // Continue: only when the group's last message is the cut-off answer's caption (not a notice after it, such
    // as a person taking the conversation over).
    const bots = last ? [...last.querySelectorAll('[data-testid=bot]')] : [];
    const final = bots[bots.length - 1];
    const title = final && final.querySelector('.thought-group .title');
    const row = document.querySelector('#pd-composer');  // (Gradio scopes the page's CSS to its container)
    if (!row) return;
    row.classList.toggle('pd-streaming', streaming);
    row.classList.toggle('pd-cut', !streaming && !!title && title.innerText.includes(TEXT.cut_off));
    // "Talk to a person" only while no person has the conversation: the chat's last word on it decides.
    let person = false;
    const botMessages = [...document.querySelectorAll('#chatbot [data-testid=bot]')];
    for (let i = botMessages.length - 1; i >= 0; i--) {  // from the end: the last notice on it is all that counts
      const said = botMessages[i].textContent;
      if (said.includes(TEXT.waiting_person) || said.includes(TEXT.with_person)) { person = true; break; }
      if (said.includes(TEXT.released)) break;
    }
    document.querySelector('#pd-actions')?.classList.toggle('pd-with-person', person);
  };
  // Captions and the sidebar's conversations say when in UTC ("2026-12-01 08:03 UTC"); the customer reads their own
  // clock: "16:03" today, "11-30 16:03" before.
  const UTC = /(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d) UTC/;
  const two = (n) => String(n).padStart(2, '0');
  const local = (m) => {
    const d = new Date(Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5])), now = new Date();
    const time = `${two(d.getHours())}:${two(d.getMinutes())}`;
    return d.toDateString() === now.toDateString() ? time : `${two(d.getMonth() + 1)}-${two(d.getDate())} ${time}`;
  };
  const SIDEBAR_UTC = new RegExp('^' + UTC.source);  // a conversation's label begins with it (its title follows)
  const localTimes = () => {
    for (const label of document.querySelectorAll('#conversations label span')) {
      const node = [...label.childNodes].find((n) => n.nodeType === Node.TEXT_NODE && n.data.trim());
      const m = node && node.data.trimStart().match(SIDEBAR_UTC);
      if (m) node.data = node.data.trimStart().replace(SIDEBAR_UTC, local(m));
    }
    for (const el of document.querySelectorAll('#chatbot .thought-group')) {
      const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
      for (let node = walk.nextNode(); node; node = walk.nextNode()) {
        const m = node.data.match(UTC);
        if (m) node.data = node.data.replace(UTC, local(m));
      }
    }
  };
  // The caption as the server will store it: "已回复 · …" → "1.2 秒内开始回复 · …" (seconds rounded up to a tenth, as
  // app/chat/text.py:seconds), and the first figure's "—" → the milliseconds. Only text still saying neither changes.
  const seconds = (ms) => { const tenths = Math.max(1, Math.ceil(ms / 100)); return `${Math.floor(tenths / 10)}.${tenths % 10}`; };
  const timed = (group, ms) => {
    const captions = group.querySelectorAll('.thought-group');
    const caption = captions[captions.length - 1];
    const unmeasured = TEXT.first_text.replace('{ms}', '—'), measured = TEXT.first_text.replace('{ms}', String(ms));
    const walk = document.createTreeWalker(caption, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      if (node.data.trimStart().startsWith(TEXT.answered + ' ·')) {
        node.data = node.data.replace(TEXT.answered, TEXT.answered_in.replace('{s}', seconds(ms)));
      }
      if (node.data.includes(unmeasured)) node.data = node.data.replace(unmeasured, measured);
    }
  };
  // Each measured answer whose caption is drawn: the time written into it, and reported once.
  const captions = () => {
    for (const [index, ms] of Object.entries(state.byAnswer)) {
      const group = answers()[+index];
      if (!group || !captioned(group)) continue;
      timed(group, ms);  // again whenever Gradio draws the caption anew (opened, or redrawn from the answer's value)
      if (!state.reported[index]) { state.reported[index] = true; report(ms); }
    }
  };
  new MutationObserver(() => {
    localTimes();
    composer();
    const p = state.pending;
    if (p && p.t1 === undefined) {
      const group = answers()[p.index];
      // A retried answer counts once the old one (captioned) has given way to the streaming one, and an answer in
      // a notice's place once the notice has gone.
      if (p.retry && (!group || !captioned(group))) p.fresh = true;
      if (p.notice && (!group || text(group) !== p.notice)) p.noticeGone = true;
      if (group && text(group) && (!p.retry || p.fresh) && (!p.notice || p.noticeGone)) {
        p.t1 = performance.now();
        requestAnimationFrame(() => setTimeout(() => {
          const ms = Math.round(performance.now() - p.t0);
          state.byAnswer[p.index] = ms;
          state.measured.push(ms);
          captions();  // the answer may have ended meanwhile, with nothing more to draw
        }, 0));
      }
    }
    captions();
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
