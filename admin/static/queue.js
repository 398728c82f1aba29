() => {
  // The queue that calls (admin/queue_ui.py): the count of customers waiting for a person in the tab's
  // title, and for each customer who starts waiting, while this operator has "Notify me" on, a short sound and
  // a browser notification (if the browser allows them). The choice is kept in this browser, per operator.
  const TEXT = /*PD_TEXT*/{};
  const q = window.pdQueue = window.pdQueue || {
    seen: null,  // the ids waiting at the last check (null before the first: those waiting already do not call)
    operator: '',
    ctx: null,
    key: () => 'prefixdesk-notify:' + q.operator,
    wanted: () => {
      if (!q.operator) return false;
      try { return localStorage.getItem(q.key()) === 'on'; } catch (e) { return false; }
    },
    // From the toggle (a click: the browser lets the page ask for notifications and start its sound now).
    setNotify: (on) => {
      if (!q.operator) return;
      try { localStorage.setItem(q.key(), on ? 'on' : 'off'); } catch (e) {}
      if (!on) return;
      q.audio();
      if ('Notification' in window && Notification.permission !== 'denied') {  // asks the browser once
        try { Notification.requestPermission(); } catch (e) {}
      }
    },
    audio: () => {
      const Ctx = window.AudioContext || window.webkitAudioContext;
      if (!q.ctx && Ctx) q.ctx = new Ctx();
      if (q.ctx && q.ctx.state === 'suspended') q.ctx.resume().catch(() => {});
      return q.ctx;
    },
    // A short two-note chime, ``after_s`` from now (customers who arrive together chime one after another).
    chime: (after_s = 0) => {
      const ctx = q.audio();
      if (!ctx) return;
      const start = ctx.currentTime + after_s;
      [[880, 0], [1320, 0.16]].forEach(([hz, at]) => {
        const tone = ctx.createOscillator(), gain = ctx.createGain();
        tone.type = 'sine';
        tone.frequency.value = hz;
        gain.gain.setValueAtTime(0.0001, start + at);
        gain.gain.exponentialRampToValueAtTime(0.2, start + at + 0.02);
        gain.gain.exponentialRampToValueAtTime(0.0001, start + at + 0.3);
        tone.connect(gain).connect(ctx.destination);
        tone.start(start + at);
        tone.stop(start + at + 0.32);
      });
    },
    notice: (id) => {
      if (!('Notification' in window) || Notification.permission !== 'granted') return;
      try {
        const n = new Notification(TEXT.queue_notice_title,
                                   {body: TEXT.queue_notice_body.replace('{id}', id), tag: 'prefixdesk-' + id});
        n.onclick = () => { window.focus(); n.close(); };
      } catch (e) {}
    },
    // Each check's JSON ({count, ids, operator}); returns the toggle as this operator left it.
    update: (data) => {
      let queue;
      try { queue = JSON.parse(data); } catch (e) { return q.wanted(); }
      if (!queue || typeof queue.count !== 'number' || !Array.isArray(queue.ids)) return q.wanted();
      q.operator = String(queue.operator || '');
      const plain = document.title.replace(/^\(\d+\) /, '');
      document.title = queue.count > 0 ? `(${queue.count}) ${plain}` : plain;
      const fresh = q.seen === null ? [] : queue.ids.filter((id) => !q.seen.has(id));
      q.seen = new Set(queue.ids);
      if (fresh.length && q.wanted()) {
        fresh.forEach((id, i) => { q.chime(i * 0.6); q.notice(id); });
      }
      return q.wanted();
    },
  };
}
