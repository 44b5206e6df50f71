// BatchKVCache: continuous-batching rows with left padding (mlx-lm's BatchKVCache), over any codec.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import { checkKv, type KvCodec, plainCodec } from "./codec.ts";
import { KVCache, makeState } from "./growable.ts";
import { PrefillRow } from "./prefill-row.ts";
import { appendGrowing, disposeAll, PlaneLayout, replaceAll, tokens } from "./planes.ts";
import { catRows, checkInts, compactRow, int32Vector, leftPaddedRow, paddedCausalMask, rollRows, rollRowsWithin, takeRows } from "./rows.ts";
import { type Cache, type CacheState, type KvView, type Mask, fail, checkTrim } from "./types.ts";
import {
  type BatchCache,
  checkExtend,
  checkFilterRows,
  checkPlanesMatch,
  checkRow,
  checkTrimRows,
  describeCache,
  justifyRows,
  type PrepareOptions,
  readRowSlot,
  sameCodec,
} from "./batch-cache.ts";

/**
 * Rows of one batch, left-padded so their last tokens align (mlx-lm's
 * BatchKVCache): one buffer [B, H, T, x] per codec plane, a shared write
 * index `idx` (the padded offset, `offset`), and per-row `leftPadding`;
 * row b's own offset is `idx - leftPadding[b]`. Buffers grow in steps of 256
 * as KVCache's do. Masks are always boolean arrays [B, 1, n, idx + n] that
 * hide each row's padding (they broadcast over heads and GQA groups).
 *
 * State slots: the codec's planes sliced to `idx` (none while empty), then
 * the row offsets and the left padding as int32 [B]; meta { idx }.
 */
export class BatchKVCache extends PlaneLayout implements BatchCache {
  static readonly step = 256;
  #lp: number[];
  #idx = 0;
  #right: number[] | null = null;
  #rowMin: number[];

  constructor(
    leftPadding: readonly number[],
    readonly codec: KvCodec = plainCodec,
  ) {
    super();
    checkInts("BatchKVCache: leftPadding", leftPadding, { min: 0 });
    if (leftPadding.length === 0) fail("BatchKVCache: a batch needs at least one row");
    this.#lp = [...leftPadding];
    this.#rowMin = leftPadding.map(() => 0);
  }

  /** The padded offset: tokens written to every row's buffer, padding included (mlx-lm's `_idx`). */
  get offset(): number {
    return this.#idx;
  }

  get batchSize(): number {
    return this.#lp.length;
  }

  /** Per-row offsets (valid tokens of each row; mlx-lm's `offset` array). May be negative after trimming a padded row. */
  get offsets(): number[] {
    return this.#lp.map((l) => this.#idx - l);
  }

  /** Cache contract: each row's RoPE position of its next token (= its offset). */
  positions(): readonly number[] {
    return this.offsets;
  }

  get leftPadding(): number[] {
    return [...this.#lp];
  }

  /** Pending right padding of the current prefill (null once finalized). */
  get rightPadding(): number[] | null {
    return this.#right ? [...this.#right] : null;
  }

  /** Physical token capacity of the buffers. */
  get capacity(): number {
    return this._planes ? this._planes[0]!.shape[2]! : 0;
  }

  /** Per-row minimum reusable offsets (row coordinates), carried through merge/filter/extend/extract. */
  get rowMinimumReusableOffsets(): number[] {
    return [...this.#rowMin];
  }

  /** In padded coordinates: the largest row value shifted by its padding. Setting it sets every row. */
  get minimumReusableOffset(): number {
    return Math.max(...this.#rowMin.map((m, b) => (m > 0 ? m + this.#lp[b]! : 0)));
  }

  set minimumReusableOffset(v: number) {
    this.#rowMin = this.#lp.map((l) => Math.max(0, v - l));
  }

  updateAndFetch(k: MlxArray, v: MlxArray): KvView {
    checkKv("BatchKVCache.updateAndFetch", k, v);
    this.codec.check(k, v);
    const B = this.#lp.length;
    if (k.shape[0] !== B) fail(`BatchKVCache.updateAndFetch: keys ${k.describe()} have ${k.shape[0]} rows, the batch has ${B}`);
    if (this._planes && this._planes[0]!.shape[1] !== k.shape[1]) {
      fail(`BatchKVCache.updateAndFetch: keys ${k.describe()} have ${k.shape[1]} heads, the cache ${this._planes[0]!.shape[1]}`);
    }
    const enc = this.codec.encode(k, v);
    try {
      const prev = this.#idx;
      const n = k.shape[2]!;
      this._planes = appendGrowing(this._planes, enc, prev, BatchKVCache.step);
      this.#idx += n;
    } finally {
      disposeAll(enc);
    }
    return this.codec.view(this.#fetch(), this.#idx);
  }

  #fetch(): MlxArray[] {
    return this._planes!.map((p) => (this.#idx < p.shape[2]! ? tokens(p, 0, this.#idx) : p.retain()));
  }

  /** mlx-lm's make_mask: create_causal_mask(n, offset=idx, window, left_padding), always an array [B, 1, n, idx + n]. */
  makeMask(n: number, window: number | null): Mask {
    return paddedCausalMask(n, this.#idx, window, this.#lp);
  }

  /** Add left padding (empty cache only) and/or declare right padding of the next prefill chunk. */
  prepare(opts: PrepareOptions): void {
    const B = this.#lp.length;
    if (opts.leftPadding) {
      if (this._planes) fail("BatchKVCache.prepare: left padding can only be added to an empty BatchKVCache");
      checkInts("BatchKVCache.prepare: leftPadding", opts.leftPadding, { length: B, min: 0 });
      this.#lp = this.#lp.map((l, b) => l + opts.leftPadding![b]!);
    }
    if (opts.rightPadding) {
      checkInts("BatchKVCache.prepare: rightPadding", opts.rightPadding, { length: B, min: 0 });
      if (Math.max(...opts.rightPadding) > 0) this.#right = [...opts.rightPadding];
    }
  }

  /** After a right-padded prefill: roll each row right by its padding, so the padding becomes left padding (mlx-lm's finalize). */
  finalize(): void {
    const r = this.#right;
    if (!r) return;
    if (this._planes) replaceAll(this._planes, (p) => rollRows(p, r));
    this.#lp = this.#lp.map((l, b) => l + r[b]!);
    this.#right = null;
  }

  #requireFinalized(op: string): void {
    if (this.#right) fail(`BatchKVCache.${op}: a right-padded prefill is pending; call finalize() first`);
  }

  state(): CacheState {
    this.#requireFinalized("state");
    const tensors: MlxArray[] = this._planes ? this.#fetch() : [];
    tensors.push(int32Vector(this.offsets), int32Vector(this.#lp));
    return makeState(this.signature(), tensors, { idx: this.#idx });
  }

  restoreState(state: CacheState): void {
    const op = "BatchKVCache.restoreState";
    if (state.signature !== this.signature()) fail(`${op}: state is ${state.signature}, this cache is ${this.signature()}`);
    const idx = state.meta.idx;
    if (idx === undefined || !Number.isInteger(idx) || idx < 0) fail(`${op}: meta.idx missing or invalid`);
    const want = this.codec.kPlanes + this.codec.vPlanes;
    const n = state.tensors.length;
    if (n !== want + 2 && !(n === 2 && idx === 0)) {
      fail(`${op}: ${this.signature()} needs ${want} plane slots + offsets + left padding (${want + 2} tensors), got ${n}`);
    }
    const planes = state.tensors.slice(0, n - 2);
    const offsets = readRowSlot(op, "offsets", state.tensors[n - 2]);
    const lp = readRowSlot(op, "left padding", state.tensors[n - 1], offsets.length);
    for (const t of planes) {
      if (t.ndim !== 4 || t.shape[0] !== offsets.length || t.shape[2] !== idx) {
        fail(`${op}: plane ${t.describe()} is not [${offsets.length}, H, ${idx}, x]`);
      }
    }
    lp.forEach((l, b) => {
      if (l < 0 || offsets[b] !== idx - l) fail(`${op}: row ${b} has offset ${offsets[b]} and left padding ${l}, inconsistent with idx ${idx}`);
    });
    disposeAll(this._planes);
    for (const t of state.tensors.slice(n - 2)) t.dispose();
    this._planes = planes.length ? planes : null;
    this.#idx = idx;
    this.#lp = lp;
    this.#right = null;
    this.#rowMin = lp.map(() => 0);
  }

  isTrimmable(): boolean {
    return true;
  }

  /** Drop the last n tokens of every row. */
  trim(n: number): number {
    checkTrim("BatchKVCache.trim", n, this.#idx);
    this.#idx -= n;
    return n;
  }

  canTrimRows(counts: readonly number[]): boolean {
    return counts.length === this.#lp.length && counts.every((n, b) => Number.isInteger(n) && n >= 0 && n <= this.#idx - this.#lp[b]!);
  }

  /**
   * Drop the newest counts[b] tokens of row b: the tokens no row keeps are cut (as trim), then
   * each row is rolled right by what it drops beyond that, which becomes its left padding.
   */
  trimRows(counts: readonly number[]): void {
    const op = "BatchKVCache.trimRows";
    this.#requireFinalized("trimRows");
    checkTrimRows(op, counts, this.offsets);
    const common = Math.min(...counts);
    this.#idx -= common;
    const roll = counts.map((n) => n - common);
    if (Math.max(...roll) === 0) return;
    if (this._planes) replaceAll(this._planes, (p) => rollRowsWithin(p, roll, this.#idx));
    this.#lp = this.#lp.map((l, b) => l + roll[b]!);
  }

  /** Keep only `rows` (in that order), then drop the padding columns every row has (mlx-lm's filter). */
  filter(rows: readonly number[]): void {
    checkFilterRows("BatchKVCache.filter", rows, this.#lp.length);
    this.#requireFinalized("filter");
    if (this._planes) replaceAll(this._planes, (p) => takeRows(p, rows));
    this.#lp = rows.map((r) => this.#lp[r]!);
    this.#rowMin = rows.map((r) => this.#rowMin[r]!);
    const minLp = Math.min(...this.#lp);
    if (minLp > 0) {
      if (this._planes) replaceAll(this._planes, (p) => tokens(p, minLp, p.shape[2]!));
      this.#idx -= minLp;
      this.#lp = this.#lp.map((l) => l - minLp);
    }
  }

  /** Append the rows of `other` (mlx-lm's extend): both are right-justified at the larger idx. `other` is not changed. */
  extend(batch: BatchCache): void {
    const other = checkExtend("BatchKVCache.extend", this, batch, BatchKVCache);
    this.#requireFinalized("extend");
    other.#requireFinalized("extend");
    if (!this._planes && !other._planes) {
      this.#lp = [...this.#lp, ...other.#lp];
      this.#rowMin = [...this.#rowMin, ...other.#rowMin];
      return;
    }
    if (this._planes && other._planes) checkPlanesMatch("BatchKVCache.extend", this._planes, other._planes);
    const ref = (this._planes ?? other._planes)!;
    const maxIdx = Math.max(this.#idx, other.#idx);
    const maxSize = Math.max(this.capacity, other.capacity);
    const padded = (c: BatchKVCache): { planes: MlxArray[]; left: number } => {
      const left = maxIdx - c.#idx;
      return { planes: justifyRows(ref, c._planes, c.#lp.length, left, maxSize), left };
    };
    const a = padded(this);
    let b: { planes: MlxArray[]; left: number } | null = null;
    try {
      b = padded(other);
      const next = a.planes.map((p, i) => catRows([p, b!.planes[i]!]));
      disposeAll(this._planes);
      this._planes = next;
    } finally {
      disposeAll(a.planes);
      disposeAll(b?.planes);
    }
    this.#lp = [...this.#lp.map((l) => l + a.left), ...other.#lp.map((l) => l + b!.left)];
    this.#rowMin = [...this.#rowMin, ...other.#rowMin];
    this.#idx = maxIdx;
  }

  /** Row `row` as a compact single-row KVCache (padding removed, contiguous copies); the batch is not changed. */
  extract(row: number): KVCache {
    checkRow("BatchKVCache.extract", row, this.#lp.length);
    this.#requireFinalized("extract");
    const out = new KVCache(this.codec);
    out.minimumReusableOffset = this.#rowMin[row]!;
    const start = this.#lp[row]!;
    if (!this._planes || this.#idx <= start) return out;
    const planes = compactRow(this._planes, row, start, this.#idx);
    try {
      out.restoreState(makeState(this.codec.name, planes, { offset: this.#idx - start }));
    } catch (e) {
      disposeAll(planes);
      throw e;
    }
    return out;
  }

  /**
   * One batch from single-row KVCaches (or PrefillRows) of one codec,
   * left-padded to the longest (mlx-lm's merge). The rows are not changed.
   */
  static merge(caches: readonly Cache[]): BatchKVCache {
    if (caches.length === 0) fail("BatchKVCache.merge: no caches");
    caches.forEach((c, i) => {
      if (!(c instanceof KVCache || c instanceof PrefillRow)) fail(`BatchKVCache.merge: row ${i} is ${describeCache(c)}, expected a KVCache or PrefillRow`);
    });
    // A PrefillRow contributes its valid tokens only (its state never holds padding).
    const rows = caches as readonly (KVCache | PrefillRow)[];
    const codec = rows[0]!.codec;
    rows.forEach((c, i) => {
      if (c.signature() !== rows[0]!.signature() || !sameCodec(c.codec, codec)) {
        fail(`BatchKVCache.merge: row ${i} is ${c.signature()}, row 0 is ${rows[0]!.signature()}; one batch holds one codec`);
      }
      if (c.planes && c.planes[0]!.shape[0] !== 1) fail(`BatchKVCache.merge: row ${i} holds a batch of ${c.planes[0]!.shape[0]}, expected 1`);
    });
    const lengths = rows.map((c) => c.offset);
    const maxLen = Math.max(...lengths);
    const padding = lengths.map((l) => maxLen - l);
    const out = new BatchKVCache(maxLen === 0 ? lengths.map(() => 0) : padding, codec);
    out.#rowMin = rows.map((c) => c.minimumReusableOffset);
    if (maxLen === 0) return out;
    const states = rows.map((c) => c.state());
    try {
      const ref = states.find((s) => s.tensors.length > 0)!.tensors;
      states.forEach((s, i) => {
        if (s.tensors.length) checkPlanesMatch(`BatchKVCache.merge (row ${i})`, ref, s.tensors);
      });
      out._planes = ref.map((r, j) => {
        const parts = states.map((s, i) => leftPaddedRow(r, padding[i]!, s.tensors.length ? s.tensors[j]! : null));
        try {
          return catRows(parts);
        } finally {
          disposeAll(parts);
        }
      });
      out.#idx = maxLen;
    } finally {
      for (const s of states) s[Symbol.dispose]();
    }
    return out;
  }

  signature(): string {
    return `batch:${this.codec.name}`;
  }
}
