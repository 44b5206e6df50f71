// PrefillRow: one physical row with left (and optional right) padding, for prefilling a request inside a padded batch.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { checkKv, type KvCodec, plainCodec } from "./codec.ts";
import { KVCache, makeState } from "./growable.ts";
import { linearMask } from "./mask.ts";
import { disposeAll, tokens } from "./planes.ts";
import { paddedCausalMask } from "./rows.ts";
import { type Cache, type CacheState, type KvView, type Mask, fail } from "./types.ts";

/** Padding of a prefill row: left padding (empty row only) and trailing padding of the next chunk. */
export interface RowPadding {
  leftPadding?: number | readonly [number];
  rightPadding?: number | readonly [number];
}

const one = (what: string, v: number | readonly [number] | undefined): number => {
  const x = typeof v === "number" || v === undefined ? v : v.length === 1 ? v[0] : Number.NaN;
  if (x === undefined) return 0;
  if (!Number.isInteger(x) || x < 0) fail(`PrefillRow.prepare: ${what} must be a non-negative integer (or [n]), got ${JSON.stringify(v)}`);
  return x;
};

/**
 * A full-attention row whose physical tokens include padding that is never
 * attended: `leftPadding` tokens in front (declared before the first
 * update) and, optionally, `rightPadding` tokens at the end of the next
 * chunk. `physicalLength` counts every stored token; `offset` counts valid
 * tokens only; `positionOffset` (= physicalLength - leftPadding) is the RoPE
 * position of the next physical token. Masks hide the padding
 * ([1, 1, n, physicalLength + n] boolean while there is left padding, else
 * KVCache's rule). `finalize()` drops the right padding and the left
 * padding, leaving a compact row; `removeLeftPadding(n)` drops some of the
 * left padding. `state()` and `extract()` never contain padding: the
 * snapshot is a KVCache snapshot (signature = the codec's, slots = its
 * planes sliced to the valid tokens, meta { offset }).
 */
export class PrefillRow implements Cache {
  #inner: KVCache;
  #lp = 0;
  /** Declared trailing padding of the next chunk. */
  #right = 0;
  /** The right-padded chunk has been written: no more updates until finalize(). */
  #sealed = false;
  minimumReusableOffset = 0;

  constructor(readonly codec: KvCodec = plainCodec) {
    this.#inner = new KVCache(codec);
  }

  /** Continue an existing compact KVCache as a prefill row (takes ownership of it). */
  static wrap(cache: KVCache): PrefillRow {
    if (!(cache instanceof KVCache)) fail("PrefillRow.wrap: expected a KVCache");
    if (cache.planes && cache.planes[0]!.shape[0] !== 1) fail(`PrefillRow.wrap: the cache holds ${cache.planes[0]!.shape[0]} rows, a prefill row is one`);
    const row = new PrefillRow(cache.codec);
    row.#inner.dispose();
    row.#inner = cache;
    row.minimumReusableOffset = cache.minimumReusableOffset;
    cache.minimumReusableOffset = 0;
    return row;
  }

  /** Stored tokens, padding included. */
  get physicalLength(): number {
    return this.#inner.offset;
  }

  get leftPadding(): number {
    return this.#lp;
  }

  /** Declared trailing padding of the current chunk (0 when none). */
  get rightPadding(): number {
    return this.#right;
  }

  /** The RoPE position of the next physical token: physicalLength - leftPadding (negative inside the left padding). */
  get positionOffset(): number {
    return this.#inner.offset - this.#lp;
  }

  /** Cache contract: the RoPE position of the next physical token (= positionOffset), as a batch of one. */
  positions(): readonly number[] {
    return [this.positionOffset];
  }

  /** Valid tokens (padding excluded). */
  get offset(): number {
    return Math.max(0, this.positionOffset - (this.#sealed ? this.#right : 0));
  }

  /** Declare padding: left padding on an empty row; right padding of the next chunk (its last `n` tokens are padding). */
  prepare(padding: RowPadding): void {
    const left = one("leftPadding", padding.leftPadding);
    const right = one("rightPadding", padding.rightPadding);
    if (this.#sealed) fail("PrefillRow.prepare: a right-padded chunk is pending; call finalize() first");
    if (left > 0) {
      if (this.#inner.offset > 0) fail("PrefillRow.prepare: left padding can only be added to an empty row");
      this.#lp += left;
    }
    if (padding.rightPadding !== undefined) this.#right = right;
  }

  updateAndFetch(k: MlxArray, v: MlxArray): KvView {
    checkKv("PrefillRow.updateAndFetch", k, v);
    if (k.shape[0] !== 1) fail(`PrefillRow.updateAndFetch: a prefill row is one row, got keys ${k.describe()}`);
    if (this.#sealed) fail("PrefillRow.updateAndFetch: the right-padded chunk was written; call finalize() before more tokens");
    if (this.#right > k.shape[2]!) fail(`PrefillRow.updateAndFetch: right padding ${this.#right} is longer than the chunk (${k.shape[2]} tokens)`);
    using view = this.#inner.updateAndFetch(k, v);
    if (this.#right > 0) this.#sealed = true;
    const planes = view.planes.map((p) => p.retain());
    return this.codec.view(planes, this.offset);
  }

  /** The mask for the next `n` physical tokens: causal (and windowed) over physical positions, padding hidden. */
  makeMask(n: number, window: number | null): Mask {
    if (this.#lp === 0) return linearMask(n, this.#inner.offset, window);
    return paddedCausalMask(n, this.#inner.offset, window, [this.#lp]);
  }

  /** Drop the written right padding, then all left padding: a compact row ready for decode or a checkpoint. */
  finalize(): void {
    if (this.#sealed) this.#inner.trim(this.#right);
    this.#sealed = false;
    this.#right = 0;
    this.removeLeftPadding(this.#lp);
  }

  /** Drop the first `count` padding tokens (copies the remaining tokens into a compact buffer). */
  removeLeftPadding(count: number = this.#lp): void {
    if (!Number.isInteger(count) || count < 0 || count > this.#lp) fail(`PrefillRow.removeLeftPadding: count must be in [0, ${this.#lp}], got ${count}`);
    if (count === 0) return;
    const phys = this.#inner.offset;
    if (phys === 0) {
      this.#lp -= count;
      return;
    }
    using st = this.#inner.state();
    const planes = st.tensors.map((p) => {
      using t = tokens(p, Math.min(count, phys), phys);
      return mx.contiguous(t);
    });
    const next = new KVCache(this.codec);
    try {
      next.restoreState(makeState(this.codec.name, planes, { offset: phys - Math.min(count, phys) }));
    } catch (e) {
      disposeAll(planes);
      throw e;
    }
    this.#inner.dispose();
    this.#inner = next;
    this.#lp -= count;
  }

  /** The valid tokens' planes (views or copies). */
  #valid(copy: boolean): MlxArray[] {
    const n = this.offset;
    if (!this.#inner.planes || n === 0) return [];
    using st = this.#inner.state();
    return st.tensors.map((p) => {
      const t = tokens(p, this.#lp, this.#lp + n);
      if (!copy) return t;
      using v = t;
      return mx.contiguous(v);
    });
  }

  /** A compact KVCache of the valid tokens (contiguous copies); the row is not changed. */
  extract(): KVCache {
    const out = new KVCache(this.codec);
    out.minimumReusableOffset = this.minimumReusableOffset;
    const planes = this.#valid(true);
    if (!planes.length) return out;
    try {
      out.restoreState(makeState(this.codec.name, planes, { offset: this.offset }));
    } catch (e) {
      disposeAll(planes);
      throw e;
    }
    return out;
  }

  /** A KVCache snapshot of the valid tokens only (padding never enters a snapshot). */
  state(): CacheState {
    return makeState(this.signature(), this.#valid(false), { offset: this.offset });
  }

  /** Adopt a KVCache snapshot: the row becomes compact (no padding). */
  restoreState(state: CacheState): void {
    this.#inner.restoreState(state);
    this.#lp = 0;
    this.#right = 0;
    this.#sealed = false;
  }

  isTrimmable(): boolean {
    return !this.#sealed;
  }

  /** Drop the last `n` valid tokens. */
  trim(n: number): number {
    if (this.#sealed) fail("PrefillRow.trim: a right-padded chunk is pending; call finalize() first");
    if (!Number.isInteger(n) || n < 0) fail(`PrefillRow.trim: n must be a non-negative integer, got ${n}`);
    if (n > this.offset) fail(`PrefillRow.trim: cannot trim ${n} tokens from a row holding ${this.offset}`);
    return this.#inner.trim(n);
  }

  /** The codec's signature: a prefill row's snapshot is a KVCache snapshot. */
  signature(): string {
    return this.codec.name;
  }

  bytesPerToken(): number {
    return this.#inner.bytesPerToken();
  }

  get nbytes(): number {
    return this.#inner.nbytes;
  }

  /** The stored (padded) planes, borrowed, for tests. */
  get planes(): readonly MlxArray[] | null {
    return this.#inner.planes;
  }

  dispose(): void {
    this.#inner.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
