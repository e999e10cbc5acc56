// Where a followed job's output stands, so that a stream opened again after its master went
// away (restarted, or another took over) neither repeats nor loses a line: the page's copy
// of mgpu/client/resume.py's Resume (its docstring says why each part is needed). Asked with
// marks=1, a master says how far its records are stored for good ({"stored": N}); a
// reopening starts there, and the records after it are checked against the offset (`at`)
// each run's stream (`ep`, `n`, `s`) was shown up to.
"use strict";

class OutputRewind extends Error {}
// Records were skipped: open the stream again from resume.since() (its start).

class OutputResume {
  constructor() {
    this.seen = 0;        // the position after the last output record received
    this.durable = 0;     // records stored for good, whichever master leads next
    this.marked = false;  // whether this open's master says how far it stored
    this.shown = new Map(); // each run's stream: the offset its shown text ends at
    this.check = null;    // after a reopening: the streams whose first record is unchecked
    this.rewound = false; // this open is a rewind to the start already
    this.before = 0;      // the furthest position received before a reopening
  }

  since() { return this.durable; }

  mark(stored) {
    if (!Number.isInteger(stored)) return;
    this.marked = true;
    this.durable = Math.max(0, Math.min(stored, this.seen)); // never past what was received
  }

  reopen() {
    this.restart(this.durable);
    this.rewound = false;
  }

  restart(at) {
    this.check = new Set(this.shown.keys());
    this.before = Math.max(this.before, this.seen);
    this.seen = this.durable = at;
    this.marked = false;
  }

  // The text of an output record to show (maybe its end only), or null when it was shown
  // already. Throws OutputRewind when records were skipped.
  take(rec) {
    this.seen += 1;
    if (!this.marked) this.durable = this.seen;
    let text = rec.d;
    const at = rec.at;
    if (!Number.isInteger(at)) return this.seen <= this.before ? null : text;
    const key = JSON.stringify([rec.ep ?? null, rec.n ?? null, rec.s ?? null]);
    const last = this.shown.get(key);
    if (last !== undefined && this.check !== null) {
      if (at <= last) return null; // shown before the stream broke
      const data = new TextEncoder().encode(text);
      const start = at - data.length;
      if (this.check.has(key)) {
        this.check.delete(key);
        if (start > last && !this.rewound) {
          this.seen -= 1; // not shown: received again after the rewind
          this.restart(0);
          this.rewound = true;
          throw new OutputRewind();
        }
      }
      if (start < last) text = new TextDecoder().decode(data.slice(last - start));
    }
    this.shown.set(key, at);
    return text;
  }
}
