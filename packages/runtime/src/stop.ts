// Stop strings over streamed text: hold back any tail that could still become a stop string.

export class StopMatcher {
  #text = "";
  #emitted = 0;
  readonly stops: string[];
  constructor(stops: readonly string[] = []) {
    this.stops = stops.filter((s) => s.length > 0);
  }

  /** Add decoded text; returns the part that is now safe to emit and whether a stop string was hit. */
  push(delta: string): { text: string; stopped: boolean } {
    this.#text += delta;
    let cut = -1;
    for (const s of this.stops) {
      const i = this.#text.indexOf(s, Math.max(0, this.#emitted - s.length + 1));
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      const out = this.#text.slice(this.#emitted, cut);
      this.#text = this.#text.slice(0, cut);
      this.#emitted = cut;
      return { text: out, stopped: true };
    }
    // Keep back the longest suffix that is a proper prefix of some stop string.
    let hold = 0;
    for (const s of this.stops) {
      for (let k = Math.min(s.length - 1, this.#text.length - this.#emitted); k > hold; k--) {
        if (this.#text.endsWith(s.slice(0, k))) {
          hold = k;
          break;
        }
      }
    }
    const end = this.#text.length - hold;
    const out = this.#text.slice(this.#emitted, end);
    this.#emitted = end;
    return { text: out, stopped: false };
  }

  /** At the end: whatever was held back. */
  flush(): string {
    const out = this.#text.slice(this.#emitted);
    this.#emitted = this.#text.length;
    return out;
  }

  /** All text accepted so far (stop string excluded). */
  get text(): string {
    return this.#text;
  }
}
