// BatchRotatingKVCache: batched sliding-window rings with left padding (mlx-lm's BatchRotatingKVCache), over any codec.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
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
import { checkKv, type KvCodec, plainCodec } from "./codec.ts";
import { makeState } from "./growable.ts";
import { createCausalMask } from "./mask.ts";
import { catTokens, disposeAll, PlaneLayout, replaceAll, tokens, writeTokens, growTokens } from "./planes.ts";
import { RotatingKVCache } from "./rotating.ts";
import { catRows, checkInts, compactRow, int32Vector, leftPaddedRow, rollRows, rowOf, takeRows } from "./rows.ts";
import { type Cache, type CacheState, type KvView, type Mask, fail, checkTrim } from "./types.ts";

/**
 * Rows of one batch in one ring of `maxSize` slots (mlx-lm's
 * BatchRotatingKVCache; no `keep` tokens). Single tokens are written in place
 * at the shared ring index; a multi-token chunk first puts the ring in
 * temporal order and trims it to `maxSize - 1` tokens. Per-row `leftPadding`
 * is decremented as tokens rotate out (it can go negative: then nothing of
 * the row is padding any more), per-row `offsets` count each row's tokens.
 * `offset` is the padded offset (mlx-lm's `_offset`). Masks are always
 * boolean arrays [B, 1, n, T].
 *
 * State slots: the codec's planes as stored (ring order; sliced to `offset`
 * while the buffer is larger), then the row offsets and the left padding as
 * int32 [B]; meta { offset, idx, rotated (0/1), maxSize }.
 */
export class BatchRotatingKVCache extends PlaneLayout implements BatchCache {
  static readonly step = 256;
  #lp: number[];
  #offs: number[];
  #idx = 0;
  #offset = 0;
  #rotated = false;
  #lengths: number[] | null = null;
  #rowMin: number[];

  constructor(
    readonly maxSize: number,
    leftPadding: readonly number[],
    readonly codec: KvCodec = plainCodec,
  ) {
    super();
    if (!Number.isInteger(maxSize) || maxSize <= 0) fail(`BatchRotatingKVCache: maxSize must be a positive integer, got ${maxSize}`);
    checkInts("BatchRotatingKVCache: leftPadding", leftPadding, { min: 0 });
    if (leftPadding.length === 0) fail("BatchRotatingKVCache: a batch needs at least one row");
    this.#lp = [...leftPadding];
    this.#offs = leftPadding.map((l) => -l);
    this.#rowMin = leftPadding.map(() => 0);
  }

  /** Tokens written to the batch, padding included (mlx-lm's `_offset`). */
  get offset(): number {
    return this.#offset;
  }

  get batchSize(): number {
    return this.#lp.length;
  }

  get offsets(): number[] {
    return [...this.#offs];
  }

  /** Cache contract: each row's RoPE position of its next token (= its offset). */
  positions(): readonly number[] {
    return this.offsets;
  }

  get leftPadding(): number[] {
    return [...this.#lp];
  }

  /** The ring index (mlx-lm's `_idx`) and whether the ring has wrapped (`rotated`). */
  get ringIndex(): number {
    return this.#idx;
  }

  get rotated(): boolean {
    return this.#rotated;
  }

  get capacity(): number {
    return this._planes ? this._planes[0]!.shape[2]! : 0;
  }

  get rowMinimumReusableOffsets(): number[] {
    return [...this.#rowMin];
  }

  get minimumReusableOffset(): number {
    return Math.max(...this.#rowMin.map((m, b) => (m > 0 ? m + this.#offset - this.#offs[b]! : 0)));
  }

  set minimumReusableOffset(v: number) {
    this.#rowMin = this.#offs.map((o) => Math.max(0, v - (this.#offset - o)));
  }

  #temporalOrder(): void {
    if (this.#rotated) {
      replaceAll(this._planes!, (p) => mx.roll(p, -this.#idx, 2));
      this.#idx = this.capacity;
      this.#rotated = false;
    }
  }

  #updateConcat(enc: MlxArray[], n: number): void {
    if (!this._planes) this._planes = enc.map((e) => e.retain());
    else {
      const planes = this._planes;
      this.#temporalOrder();
      if (this.capacity > this.#idx) replaceAll(planes, (p) => tokens(p, 0, this.#idx));
      if (this.#lengths) {
        const lengths = this.#lengths;
        const roll = this.#offs.map((o, b) => Math.max(0, o - lengths[b]!));
        replaceAll(planes, (p) => rollRows(p, roll));
        this.#lp = this.#lp.map((l, b) => l + roll[b]!);
        this.#offs = this.#offs.map((o, b) => o - roll[b]!);
      }
      const trim = this.#idx - this.maxSize + 1;
      if (trim > 0) this.#lp = this.#lp.map((l) => l - trim);
      replaceAll(planes, (p, i) => {
        using kept = trim > 0 ? tokens(p, trim, p.shape[2]!) : p.retain();
        return catTokens([kept, enc[i]!]);
      });
    }
    this.#offs = this.#offs.map((o) => o + n);
    this.#offset += n;
    this.#idx = this.capacity;
  }

  #updateInPlace(enc: MlxArray[], s: number): void {
    if (this.#lengths) fail("BatchRotatingKVCache: finalize() must be called before decoding a right-padded prefill");
    const prev = this.#offset;
    if (!this._planes || (prev >= this.capacity && this.capacity < this.maxSize)) {
      const size = Math.min(BatchRotatingKVCache.step, this.maxSize - prev);
      if (size <= 0) fail(`BatchRotatingKVCache: cannot grow the ring at offset ${prev} (maxSize ${this.maxSize})`);
      this._planes = growTokens(this._planes, enc, size);
      this.#idx = prev;
    }
    const planes = this._planes;
    const trim = this.capacity - this.maxSize;
    if (trim > 0) {
      replaceAll(planes, (p) => tokens(p, trim, p.shape[2]!));
      this.#idx = this.maxSize;
      this.#lp = this.#lp.map((l) => l - trim);
    }
    if (this.#idx === this.maxSize) {
      this.#rotated = true;
      this.#idx = 0;
    }
    if (this.#rotated) this.#lp = this.#lp.map((l) => l - s);
    replaceAll(planes, (p, i) => writeTokens(p, enc[i]!, this.#idx));
    this.#offset += s;
    this.#offs = this.#offs.map((o) => o + s);
    this.#idx += s;
  }

  updateAndFetch(k: MlxArray, v: MlxArray): KvView {
    checkKv("BatchRotatingKVCache.updateAndFetch", k, v);
    this.codec.check(k, v);
    const B = this.#lp.length;
    if (k.shape[0] !== B) fail(`BatchRotatingKVCache.updateAndFetch: keys ${k.describe()} have ${k.shape[0]} rows, the batch has ${B}`);
    if (this._planes && this._planes[0]!.shape[1] !== k.shape[1]) {
      fail(`BatchRotatingKVCache.updateAndFetch: keys ${k.describe()} have ${k.shape[1]} heads, the cache ${this._planes[0]!.shape[1]}`);
    }
    const enc = this.codec.encode(k, v);
    const n = k.shape[2]!;
    try {
      if (n === 1) this.#updateInPlace(enc, n);
      else this.#updateConcat(enc, n);
    } finally {
      disposeAll(enc);
    }
    const planes = this.#fetch();
    return this.codec.view(planes, planes[0]!.shape[2]!);
  }

  #fetch(): MlxArray[] {
    return this._planes!.map((p) => (this.#offset < p.shape[2]! ? tokens(p, 0, this.#offset) : p.retain()));
  }

  /** mlx-lm's make_mask: causal within the window (default maxSize), hiding each row's padding, rolled to the ring when wrapped. */
  makeMask(n: number, window: number | null): Mask {
    const w = window || this.maxSize;
    const offset = Math.min(this.maxSize - 1, this.#offset);
    using causal = createCausalMask(n, offset, w);
    let lp = this.#lp;
    // A chunk first puts a wrapped ring in temporal order (#updateConcat: idx = capacity). mlx-lm's
    // make_mask reads the ring index here, which hides real tokens of a padded row when a chunk
    // follows in-place writes (its batch generation never does that; batched speculation does).
    const ringEnd = n > 1 && this.#rotated ? this.capacity : this.#idx;
    const trim = ringEnd - this.maxSize + (n > 1 ? 1 : 0);
    if (trim > 0) lp = lp.map((l) => l - trim);
    const rotated = n === 1 && (this.#rotated || this.#idx >= this.maxSize);
    if (rotated) lp = lp.map((l) => l - 1);
    using lpa = int32Vector(lp, [lp.length, 1, 1, 1]);
    using r = mx.arange(offset + n);
    using rr = mx.expand_dims(r, 0);
    using keep = mx.greater_equal(rr, lpa);
    const mask = mx.logical_and(causal, keep);
    if (!rotated) return mask;
    using m = mask;
    const idx = this.#idx >= this.maxSize ? 0 : this.#idx;
    return mx.roll(m, idx + 1, -1);
  }

  prepare(opts: PrepareOptions): void {
    const B = this.#lp.length;
    if (opts.leftPadding) {
      if (this._planes) fail("BatchRotatingKVCache.prepare: left padding can only be added to an empty BatchRotatingKVCache");
      checkInts("BatchRotatingKVCache.prepare: leftPadding", opts.leftPadding, { length: B, min: 0 });
      this.#lp = this.#lp.map((l, b) => l + opts.leftPadding![b]!);
      this.#offs = this.#offs.map((o, b) => o - opts.leftPadding![b]!);
    }
    if (opts.rightPadding) {
      checkInts("BatchRotatingKVCache.prepare: rightPadding", opts.rightPadding, { length: B, min: 0 });
      if (Math.max(...opts.rightPadding) > 0) {
        if (!opts.lengths) fail("BatchRotatingKVCache.prepare: rightPadding needs lengths (valid tokens per row)");
        checkInts("BatchRotatingKVCache.prepare: lengths", opts.lengths, { length: B, min: 0 });
        this.#lengths = opts.lengths.map((l, b) => l + this.#offs[b]!);
      }
    }
  }

  /** After a right-padded prefill: roll each row so its trailing padding becomes left padding (mlx-lm's finalize). */
  finalize(): void {
    const lengths = this.#lengths;
    if (!lengths) return;
    const roll = this.#offs.map((o, b) => Math.max(0, o - lengths[b]!));
    if (this._planes) replaceAll(this._planes, (p) => rollRows(p, roll));
    this.#lp = this.#lp.map((l, b) => l + roll[b]!);
    this.#offs = this.#offs.map((o, b) => o - roll[b]!);
    this.#lengths = null;
  }

  #requireFinalized(op: string): void {
    if (this.#lengths) fail(`BatchRotatingKVCache.${op}: a right-padded prefill is pending; call finalize() first`);
  }

  state(): CacheState {
    this.#requireFinalized("state");
    const tensors: MlxArray[] = this._planes ? this.#fetch() : [];
    tensors.push(int32Vector(this.#offs), int32Vector(this.#lp));
    return makeState(this.signature(), tensors, {
      offset: this.#offset,
      idx: this.#idx,
      rotated: this.#rotated ? 1 : 0,
      maxSize: this.maxSize,
    });
  }

  restoreState(state: CacheState): void {
    const op = "BatchRotatingKVCache.restoreState";
    if (state.signature !== this.signature()) fail(`${op}: state is ${state.signature}, this cache is ${this.signature()}`);
    const { offset, idx, rotated, maxSize } = state.meta;
    for (const [name, x] of [
      ["offset", offset],
      ["idx", idx],
    ] as const) {
      if (x === undefined || !Number.isInteger(x) || x < 0) fail(`${op}: meta.${name} missing or invalid`);
    }
    if (rotated !== 0 && rotated !== 1) fail(`${op}: meta.rotated must be 0 or 1`);
    if (maxSize !== this.maxSize) fail(`${op}: meta.maxSize ${maxSize} does not match this cache's ${this.maxSize}`);
    const want = this.codec.kPlanes + this.codec.vPlanes;
    const n = state.tensors.length;
    if (n !== want + 2 && !(n === 2 && offset === 0)) {
      fail(`${op}: ${this.signature()} needs ${want} plane slots + offsets + left padding (${want + 2} tensors), got ${n}`);
    }
    const planes = state.tensors.slice(0, n - 2);
    const offs = readRowSlot(op, "offsets", state.tensors[n - 2]);
    const lp = readRowSlot(op, "left padding", state.tensors[n - 1], offs.length);
    const t = planes[0]?.shape[2] ?? 0;
    for (const p of planes) {
      if (p.ndim !== 4 || p.shape[0] !== offs.length || p.shape[2] !== t) fail(`${op}: plane ${p.describe()} is not [${offs.length}, H, ${t}, x]`);
    }
    if (idx! > Math.max(t, this.maxSize)) fail(`${op}: meta.idx ${idx} is past the ring (${t} slots)`);
    disposeAll(this._planes);
    for (const x of state.tensors.slice(n - 2)) x.dispose();
    this._planes = planes.length ? planes : null;
    this.#offset = offset!;
    this.#idx = idx!;
    this.#rotated = rotated === 1;
    this.#offs = offs;
    this.#lp = lp;
    this.#lengths = null;
    this.#rowMin = lp.map(() => 0);
  }

  isTrimmable(): boolean {
    return this.#offset < this.maxSize;
  }

  trim(n: number): number {
    checkTrim("BatchRotatingKVCache.trim", n, this.#offset, !this.isTrimmable());
    this.#offset -= n;
    this.#idx -= n;
    this.#offs = this.#offs.map((o) => o - n);
    return n;
  }

  /** Tokens of row b in the buffer (temporal order): the columns right of its padding. */
  #held(b: number): number {
    return Math.min(this.#offs[b]!, this.#idx - Math.max(0, this.#lp[b]!));
  }

  /**
   * Exact when the buffer is in temporal order (after a multi-token chunk; never after in-place
   * ring writes) and every trimmed row keeps a full window (maxSize tokens) or every token it had.
   */
  canTrimRows(counts: readonly number[]): boolean {
    if (counts.length !== this.#lp.length || !counts.every((n) => Number.isInteger(n) && n >= 0)) return false;
    if (counts.every((n) => n === 0)) return true;
    if (this.#rotated || this.#lengths || !this._planes || this.#idx !== this.capacity) return false;
    return counts.every((n, b) => {
      if (n === 0) return true;
      const held = this.#held(b);
      return n <= held && (held === this.#offs[b]! || held - n >= this.maxSize);
    });
  }

  /**
   * Drop the newest counts[b] tokens of row b: each row is rolled right by its count, so the
   * dropped slots become its left padding and its newest token stays in the last column (the
   * shared ring position does not move). See canTrimRows for when this is exact.
   */
  trimRows(counts: readonly number[]): void {
    const op = "BatchRotatingKVCache.trimRows";
    this.#requireFinalized("trimRows");
    checkTrimRows(op, counts, this.#offs);
    if (counts.every((n) => n === 0)) return;
    if (!this.canTrimRows(counts)) {
      fail(
        `${op}: cannot trim [${counts.join(", ")}] exactly: ${this.#rotated || this.#idx !== this.capacity ? "the ring was written in place (its older tokens are overwritten)" : "a row would keep less than a full window"}`,
      );
    }
    replaceAll(this._planes!, (p) => rollRows(p, counts));
    // Padding that rotated out (negative) no longer hides anything: the dropped slots are the row's padding now.
    this.#lp = this.#lp.map((l, b) => (counts[b]! > 0 ? Math.max(0, l) + counts[b]! : l));
    this.#offs = this.#offs.map((o, b) => o - counts[b]!);
  }

  /** Keep only `rows` (in that order); mlx-lm's filter (no padding shift for the ring). */
  filter(rows: readonly number[]): void {
    checkFilterRows("BatchRotatingKVCache.filter", rows, this.#lp.length);
    this.#requireFinalized("filter");
    if (this._planes) replaceAll(this._planes, (p) => takeRows(p, rows));
    this.#lp = rows.map((r) => this.#lp[r]!);
    this.#offs = rows.map((r) => this.#offs[r]!);
    this.#rowMin = rows.map((r) => this.#rowMin[r]!);
  }

  /**
   * Append the rows of `other` (mlx-lm's extend). When the rings are not
   * aligned both are first put in temporal order (`other` is re-laid-out
   * that way too; its content does not change).
   */
  extend(batch: BatchCache): void {
    const other = checkExtend("BatchRotatingKVCache.extend", this, batch, BatchRotatingKVCache);
    this.#requireFinalized("extend");
    other.#requireFinalized("extend");
    if (!this._planes && !other._planes) {
      this.#lp = [...this.#lp, ...other.#lp];
      this.#offs = [...this.#offs, ...other.#offs];
      this.#rowMin = [...this.#rowMin, ...other.#rowMin];
      return;
    }
    if (this._planes && other._planes) checkPlanesMatch("BatchRotatingKVCache.extend", this._planes, other._planes);
    if (this.#rotated !== other.#rotated || this.#idx !== other.#idx) {
      if (this._planes) this.#temporalOrder();
      if (other._planes) other.#temporalOrder();
    }
    const ref = (this._planes ?? other._planes)!;
    const maxIdx = Math.max(this.#idx, other.#idx);
    const maxSize = Math.max(this.capacity, other.capacity);
    const leftA = maxIdx - this.#idx;
    const leftB = maxIdx - other.#idx;
    const a = justifyRows(ref, this._planes, this.#lp.length, leftA, maxSize);
    let b: MlxArray[] | null = null;
    try {
      b = justifyRows(ref, other._planes, other.#lp.length, leftB, maxSize);
      const next = a.map((p, i) => catRows([p, b![i]!]));
      disposeAll(this._planes);
      this._planes = next;
    } finally {
      disposeAll(a);
      disposeAll(b);
    }
    this.#lp = [...this.#lp.map((l) => l + leftA), ...other.#lp.map((l) => l + leftB)];
    this.#offs = [...this.#offs, ...other.#offs];
    this.#rowMin = [...this.#rowMin, ...other.#rowMin];
    this.#idx = maxIdx;
    this.#offset = Math.max(this.#offset, other.#offset);
  }

  /** Row `row` as a compact RotatingKVCache(maxSize) in temporal order (mlx-lm's extract); the batch is not changed. */
  extract(row: number): RotatingKVCache {
    checkRow("BatchRotatingKVCache.extract", row, this.#lp.length);
    this.#requireFinalized("extract");
    const out = new RotatingKVCache(this.maxSize, 0, this.codec);
    out.minimumReusableOffset = this.#rowMin[row]!;
    if (!this._planes) return out;
    const padding = Math.max(0, this.#lp[row]!);
    const offset = this.#offs[row]!;
    let planes: MlxArray[];
    if (this.#rotated) {
      const rolled = this._planes.map((p) => {
        using r = rowOf(p, row);
        return mx.roll(r, -this.#idx, 2);
      });
      try {
        const stop = Math.min(this.maxSize, rolled[0]!.shape[2]!);
        planes = compactRow(rolled, 0, Math.min(padding, stop), stop);
      } finally {
        disposeAll(rolled);
      }
    } else {
      const stop = Math.min(this.#idx, this.capacity);
      planes = compactRow(this._planes, row, Math.min(padding, stop), stop);
    }
    const t = planes[0]!.shape[2]!;
    if (offset <= 0 && t === 0) {
      disposeAll(planes);
      return out;
    }
    try {
      out.restoreState(makeState(out.signature(), planes, { offset, idx: t, keep: 0, maxSize: this.maxSize }));
    } catch (e) {
      disposeAll(planes);
      throw e;
    }
    return out;
  }

  /**
   * One batch from single-row RotatingKVCaches of one codec and maxSize (no
   * keep tokens), each put in temporal order and left-padded to the longest
   * window (mlx-lm's merge). The rows are not changed.
   */
  static merge(caches: readonly Cache[]): BatchRotatingKVCache {
    if (caches.length === 0) fail("BatchRotatingKVCache.merge: no caches");
    caches.forEach((c, i) => {
      if (!(c instanceof RotatingKVCache)) fail(`BatchRotatingKVCache.merge: row ${i} is ${describeCache(c)}, expected a RotatingKVCache`);
    });
    const rows = caches as readonly RotatingKVCache[];
    const first = rows[0]!;
    rows.forEach((c, i) => {
      if (c.maxSize !== first.maxSize)
        fail(`BatchRotatingKVCache.merge: row ${i} has maxSize ${c.maxSize}, row 0 ${first.maxSize}; one batch holds one window`);
      if (c.keep !== 0) fail(`BatchRotatingKVCache.merge: row ${i} keeps ${c.keep} tokens; batched rings have no keep tokens`);
      if (c.signature() !== first.signature() || !sameCodec(c.codec, first.codec)) {
        fail(`BatchRotatingKVCache.merge: row ${i} is ${c.signature()}, row 0 is ${first.signature()}; one batch holds one codec`);
      }
      if (c.planes && c.planes[0]!.shape[0] !== 1) fail(`BatchRotatingKVCache.merge: row ${i} holds a batch of ${c.planes[0]!.shape[0]}, expected 1`);
    });
    const maxSize = first.maxSize;
    const lengths = rows.map((c) => (c.planes ? Math.min(c.offset, maxSize) : 0));
    const maxLen = Math.max(...lengths);
    const out = new BatchRotatingKVCache(maxSize, maxLen === 0 ? lengths.map(() => 0) : lengths.map((l) => maxLen - l), first.codec);
    out.#rowMin = rows.map((c) => c.minimumReusableOffset);
    if (maxLen === 0) return out;
    const windows = rows.map((c, i) => (lengths[i]! > 0 ? temporalWindow(c, lengths[i]!) : null));
    try {
      const ref = windows.find((w) => w !== null)!;
      windows.forEach((w, i) => {
        if (w) checkPlanesMatch(`BatchRotatingKVCache.merge (row ${i})`, ref, w);
      });
      out._planes = ref.map((r, j) => {
        const parts = windows.map((w, i) => leftPaddedRow(r, maxLen - lengths[i]!, w ? w[j]! : null));
        try {
          return catRows(parts);
        } finally {
          disposeAll(parts);
        }
      });
    } finally {
      for (const w of windows) disposeAll(w);
    }
    out.#offs = rows.map((c) => c.offset);
    out.#idx = maxLen;
    out.#offset = maxLen;
    return out;
  }

  signature(): string {
    return `batch:rotating:${this.maxSize}:0:${this.codec.name}`;
  }
}

/**
 * The last `len` tokens of a single RotatingKVCache in temporal order
 * (mlx-lm's `c._temporal_order(c.keys)[..., -len:, :]`), read through its state.
 */
function temporalWindow(c: RotatingKVCache, len: number): MlxArray[] {
  using st = c.state();
  const { idx, offset, keep } = st.meta as { idx: number; offset: number; keep: number };
  return st.tensors.map((p) => {
    const t = p.shape[2]!;
    let ordered: MlxArray;
    if (idx === t) ordered = p.retain();
    else if (idx < offset) {
      using a = tokens(p, 0, keep);
      using b = tokens(p, idx, t);
      using m = tokens(p, keep, idx);
      ordered = catTokens([a, b, m]);
    } else ordered = tokens(p, 0, idx);
    using o = ordered;
    const ot = o.shape[2]!;
    return tokens(o, ot - len, ot);
  });
}
