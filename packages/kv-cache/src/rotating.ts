// RotatingKVCache: a sliding-window ring with `keep` fixed tokens (mlx-lm's RotatingKVCache), over any codec.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type KvCodec, plainCodec } from "./codec.ts";
import { makeState } from "./growable.ts";
import { createCausalMask } from "./mask.ts";
import { catTokens, disposeAll, PlaneLayout, replaceAll, tokens, writeTokens, growTokens } from "./planes.ts";
import { type Cache, type CacheState, type KvView, type Mask, fail, checkTrim } from "./types.ts";

/**
 * Single tokens are written in place into a ring of `maxSize` slots (the first
 * `keep` never rotate out); a multi-token chunk first puts the ring in
 * temporal order, trims to maxSize - 1 tokens and appends the chunk, so every
 * token of the chunk sees a full window. Same op sequence as mlx-lm.
 * State slots: the codec's planes as stored (the ring, not temporal order);
 * meta { offset, idx, keep, maxSize }.
 */
export class RotatingKVCache extends PlaneLayout implements Cache {
  static readonly step = 256;
  #offset = 0;
  #idx = 0;
  minimumReusableOffset = 0;

  constructor(
    readonly maxSize: number,
    readonly keep = 0,
    readonly codec: KvCodec = plainCodec,
  ) {
    super();
    if (!Number.isInteger(maxSize) || maxSize <= 0) fail(`RotatingKVCache: maxSize must be a positive integer, got ${maxSize}`);
    if (!Number.isInteger(keep) || keep < 0 || keep >= maxSize) fail(`RotatingKVCache: keep must be in [0, maxSize), got ${keep}`);
  }

  get offset(): number {
    return this.#offset;
  }

  #cap(): number {
    return this._planes ? this._planes[0]!.shape[2]! : 0;
  }

  /** Drop `trim` tokens after the first `keep`, then append. */
  #trim(trim: number, p: MlxArray, append?: MlxArray): MlxArray {
    const parts: MlxArray[] = [];
    const made: MlxArray[] = [];
    if (trim > 0) {
      made.push(tokens(p, 0, this.keep), tokens(p, trim + this.keep, p.shape[2]!));
      parts.push(...made);
    } else parts.push(p);
    if (append) parts.push(append);
    try {
      return catTokens(parts);
    } finally {
      disposeAll(made);
    }
  }

  #temporalOrder(p: MlxArray): MlxArray {
    const t = p.shape[2]!;
    if (this.#idx === t) return p.retain();
    if (this.#idx < this.#offset) {
      using a = tokens(p, 0, this.keep);
      using b = tokens(p, this.#idx, t);
      using c = tokens(p, this.keep, this.#idx);
      return catTokens([a, b, c]);
    }
    return tokens(p, 0, this.#idx);
  }

  #updateConcat(enc: MlxArray[], n: number): void {
    if (!this._planes) this._planes = enc.map((e) => e.retain());
    else {
      const planes = this._planes;
      replaceAll(planes, (p) => this.#temporalOrder(p));
      this.#idx = planes[0]!.shape[2]!;
      const trim = this.#idx - this.maxSize + 1;
      replaceAll(planes, (p, i) => this.#trim(trim, p, enc[i]));
    }
    this.#offset += n;
    this.#idx = this.#cap();
  }

  #updateInPlace(enc: MlxArray[], n: number): void {
    const prev = this.#offset;
    if (!this._planes || (prev >= this.#cap() && this.#cap() < this.maxSize)) {
      const size = Math.min(RotatingKVCache.step, this.maxSize - prev);
      this._planes = growTokens(this._planes, enc, size);
      this.#idx = prev;
    }
    const planes = this._planes;
    const trim = this.#cap() - this.maxSize;
    if (trim > 0) {
      replaceAll(planes, (p) => this.#trim(trim, p));
      this.#idx = this.maxSize;
    }
    if (this.#idx === this.maxSize) this.#idx = this.keep;
    replaceAll(planes, (p, i) => writeTokens(p, enc[i]!, this.#idx));
    this.#offset += n;
    this.#idx += n;
  }

  updateAndFetch(k: MlxArray, v: MlxArray): KvView {
    this.codec.check(k, v);
    if (this._planes && this._planes[0]!.shape[0] !== k.shape[0]) {
      fail(`RotatingKVCache.updateAndFetch: batch ${k.shape[0]} does not match the cache's ${this._planes[0]!.shape[0]}`);
    }
    const enc = this.codec.encode(k, v);
    const n = k.shape[2]!;
    try {
      if (n === 1) this.#updateInPlace(enc, n);
      else this.#updateConcat(enc, n);
    } finally {
      disposeAll(enc);
    }
    return this.codec.view(this.#fetch(), Math.min(this.#offset, this.#cap()));
  }

  #fetch(): MlxArray[] {
    const planes = this._planes!;
    if (this.#offset < this.#cap()) return planes.map((p) => tokens(p, 0, this.#offset));
    return planes.map((p) => p.retain());
  }

  /** mlx-lm's RotatingKVCache.make_mask, with "causal" where no window bites. */
  makeMask(n: number, window: number | null): Mask {
    if (n > 1) {
      const w = window ?? this.maxSize;
      const offset = Math.min(this.maxSize - 1, this.#offset);
      if (offset + n > w) return createCausalMask(n, offset, w);
      return "causal";
    }
    if (window === null) return null;
    if (this.#offset >= window && this.maxSize > window) {
      let idx = this.#idx;
      if (idx >= this.maxSize) idx = 0;
      const size = this.#offset < this.maxSize ? this.#offset + 1 : this.maxSize;
      using r = mx.arange(size);
      using m = mx.greater_equal(r, size - window);
      return mx.roll(m, idx + 1);
    }
    return null;
  }

  state(): CacheState {
    const tensors = this._planes && this.#offset ? this.#fetch() : [];
    return makeState(this.signature(), tensors, { offset: this.#offset, idx: this.#idx, keep: this.keep, maxSize: this.maxSize });
  }

  restoreState(state: CacheState): void {
    if (state.signature !== this.signature()) fail(`RotatingKVCache.restoreState: state is ${state.signature}, this cache is ${this.signature()}`);
    const { offset, idx } = state.meta;
    // After a multi-token chunk the buffer (and idx) can hold up to maxSize + L - 1 tokens.
    const held = state.tensors[0]?.shape[2] ?? 0;
    if (offset === undefined || idx === undefined || offset < 0 || idx < 0 || idx > Math.max(this.maxSize, held)) {
      fail("RotatingKVCache.restoreState: meta.offset/idx missing or invalid");
    }
    const want = this.codec.kPlanes + this.codec.vPlanes;
    if (state.tensors.length !== (offset === 0 ? 0 : want)) {
      fail(`RotatingKVCache.restoreState: ${this.codec.name} needs ${want} tensors, got ${state.tensors.length}`);
    }
    const len = Math.min(offset, this.maxSize + 0);
    for (const t of state.tensors) {
      if (t.ndim !== 4 || t.shape[2]! < Math.min(len, t.shape[2]!) || t.shape[2]! > offset) {
        fail(`RotatingKVCache.restoreState: tensor ${t.describe()} does not fit offset ${offset}`);
      }
    }
    disposeAll(this._planes);
    this._planes = state.tensors.length ? [...state.tensors] : null;
    this.#offset = offset;
    this.#idx = idx;
  }

  isTrimmable(): boolean {
    return this.#offset < this.maxSize;
  }

  /**
   * Whether `trim(n)` is exact now. Before the window has rotated anything out, any n. After,
   * only right after a multi-token chunk: the buffer is then in temporal order and holds
   * maxSize - 1 + L tokens, so dropping up to L - 1 of its newest tokens still leaves a full
   * window (speculative verification relies on this; docs/speculative.md).
   */
  canTrim(n: number): boolean {
    if (!Number.isInteger(n) || n < 0 || n > this.#offset) return false;
    if (n === 0 || this.#offset < this.maxSize) return true;
    const cap = this.#cap();
    return this.#idx === cap && (cap - n >= this.maxSize || cap === this.#offset);
  }

  trim(n: number): number {
    checkTrim("RotatingKVCache.trim", n, this.#offset);
    if (!this.canTrim(n)) fail(`RotatingKVCache.trim: the window has wrapped (offset ${this.#offset}); the ${n} tokens before the newest are gone`);
    if (n > 0 && this.#offset >= this.maxSize) {
      // Temporal-order buffer: cut the newest n tokens off its end.
      const keepTo = this.#cap() - n;
      replaceAll(this._planes!, (p) => tokens(p, 0, keepTo));
      this.#idx = keepTo;
    } else this.#idx -= n;
    this.#offset -= n;
    return n;
  }

  signature(): string {
    return `rotating:${this.maxSize}:${this.keep}:${this.codec.name}`;
  }
}
