// The BatchCache contract both batched layouts implement (BatchKVCache, BatchRotatingKVCache),
// and the checks and plane helpers they share.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import type { KvCodec } from "./codec.ts";
import { checkInts, padTokens, zeroRows } from "./rows.ts";
import { disposeAll, tokens } from "./planes.ts";
import { type Cache, fail } from "./types.ts";

/** Padding of the next prefill (mlx-lm's `prepare(left_padding=, lengths=, right_padding=)`), one entry per row. */
export interface PrepareOptions {
  /** Extra left padding per row; only on an empty cache. */
  leftPadding?: readonly number[];
  /** Valid tokens per row in the next chunk(s) (BatchRotatingKVCache needs it with rightPadding). */
  lengths?: readonly number[];
  /** Trailing padding per row of the next chunk; finalize() moves it to the left. */
  rightPadding?: readonly number[];
}

/**
 * Rows of one continuous batch, left-padded so their last tokens align (docs/kv-cache-batched.md).
 * `offset` is the padded offset; each row's own position is in `offsets` / `positions()`.
 */
export interface BatchCache extends Cache {
  readonly batchSize: number;
  /** Valid tokens of each row (its next RoPE position). */
  readonly offsets: number[];
  /** Left padding of each row. */
  readonly leftPadding: number[];
  /** Each row's RoPE position of its next token. */
  positions(): readonly number[];
  /** Declare padding of the next prefill chunk (see PrepareOptions). */
  prepare(opts: PrepareOptions): void;
  /** After a right-padded prefill chunk: move each row's trailing padding to its left. */
  finalize(): void;
  /** Keep only `rows`, in that order (at least one). */
  filter(rows: readonly number[]): void;
  /** Append the rows of `other` (same layout, codec and window); `other` is not changed. */
  extend(other: BatchCache): void;
  /** Row `row` as a compact single-sequence cache; the batch is not changed. */
  extract(row: number): Cache;
  /**
   * Whether `trimRows(counts)` is exact: every row still holds what attention over its next
   * tokens needs (a sliding window: a full window, or every token the row had).
   */
  canTrimRows(counts: readonly number[]): boolean;
  /**
   * Drop the newest `counts[b]` tokens of row b (speculative verification: rows keep different
   * numbers of drafts). A row's dropped slots become left padding (the row is rolled right, as
   * finalize() does with right padding), so every row's newest token stays in the last column;
   * tokens no row keeps are cut off. Refused (KvCacheError) where canTrimRows is false.
   */
  trimRows(counts: readonly number[]): void;
}

/** The checks of `trimRows(counts)` on a batch of `batch` rows, each row holding `held[b]` tokens. */
export function checkTrimRows(op: string, counts: readonly number[], held: readonly number[]): void {
  checkInts(`${op}: counts`, counts, { length: held.length, min: 0 });
  counts.forEach((n, b) => {
    if (n > held[b]!) fail(`${op}: cannot trim ${n} tokens from row ${b}, which holds ${held[b]}`);
  });
}

/** Whether `c` is one of the batched layouts. */
export function isBatchCache(c: Cache): c is BatchCache {
  const b = c as Partial<BatchCache>;
  return typeof b.filter === "function" && typeof b.extend === "function" && typeof b.extract === "function" && typeof b.prepare === "function";
}

/** `c` as a BatchCache, or a clear error naming `op`. */
export function asBatchCache(op: string, c: Cache): BatchCache {
  if (!isBatchCache(c)) fail(`${op}: ${describeCache(c)} is not a batched cache`);
  return c;
}

/** Two codecs write interchangeable planes (same name; TurboQuant: same seed). */
export function sameCodec(a: KvCodec, b: KvCodec): boolean {
  if (a === b) return true;
  if (a.name !== b.name) return false;
  const sa = (a as { seed?: number }).seed;
  const sb = (b as { seed?: number }).seed;
  return sa === sb;
}

/** Check that `planes` (from another cache) can sit next to `ref` in one batch: heads, trailing dims, dtypes. */
export function checkPlanesMatch(op: string, ref: readonly MlxArray[], planes: readonly MlxArray[]): void {
  if (ref.length !== planes.length) fail(`${op}: ${planes.length} planes vs ${ref.length}`);
  ref.forEach((r, i) => {
    const p = planes[i]!;
    if (p.ndim !== 4 || p.shape[1] !== r.shape[1] || p.shape[3] !== r.shape[3] || p.dtype !== r.dtype) {
      fail(`${op}: plane ${i} ${p.describe()} does not match ${r.describe()} (heads, head dim and dtype must agree)`);
    }
  });
}

/** The checks of `filter(rows)` on a batch of `batch` rows. */
export function checkFilterRows(op: string, rows: readonly number[], batch: number): void {
  checkInts(`${op}: rows`, rows);
  if (rows.length === 0) fail(`${op}: keep at least one row (dispose the cache to drop them all)`);
  for (const r of rows) if (r < 0 || r >= batch) fail(`${op}: row ${r} is out of range for a batch of ${batch}`);
}

/** The check of `extract(row)` on a batch of `batch` rows. */
export function checkRow(op: string, row: number, batch: number): void {
  if (!Number.isInteger(row) || row < 0 || row >= batch) fail(`${op}: row ${row} is out of range for a batch of ${batch}`);
}

/** The checks of `extend(other)`: same class, signature and codec, not itself. */
export function checkExtend<T extends BatchCache & { readonly codec: KvCodec }>(
  op: string,
  self: T,
  other: BatchCache,
  cls: abstract new (...args: never[]) => T,
): T {
  if (!(other instanceof cls)) fail(`${op}: expected a ${cls.name}, got ${describeCache(other)}`);
  const o = other as T;
  if (o.signature() !== self.signature() || !sameCodec(self.codec, o.codec)) fail(`${op}: cannot mix ${o.signature()} rows into a ${self.signature()} batch`);
  if (o === self) fail(`${op}: cannot extend a batch with itself`);
  return o;
}

/** Read an int32 [B] slot of a batched state back to host numbers. */
export function readRowSlot(op: string, name: string, t: MlxArray | undefined, batch?: number): number[] {
  if (!t) fail(`${op}: the ${name} slot is missing`);
  if (t.dtype !== "int32" || t.ndim !== 1) fail(`${op}: the ${name} slot must be int32 [B], got ${t.describe()}`);
  if (batch !== undefined && t.shape[0] !== batch) fail(`${op}: the ${name} slot has ${t.shape[0]} rows, expected ${batch}`);
  if (t.shape[0] === 0) fail(`${op}: the ${name} slot is empty (a batch has at least one row)`);
  return Array.from(t.toTypedArray() as Int32Array);
}

export function describeCache(c: unknown): string {
  if (c && typeof c === "object" && "signature" in c && typeof (c as Cache).signature === "function") {
    return `${(c as object).constructor?.name ?? "a cache"} (${(c as Cache).signature()})`;
  }
  return String(c);
}

/**
 * The planes of one side of an extend (mlx-lm's `pad` in extend): `left`
 * zero tokens in front, cut or zero-padded on the right to `size` tokens;
 * an empty side becomes zeros shaped like `ref`.
 */
export function justifyRows(ref: readonly MlxArray[], planes: readonly MlxArray[] | null, rows: number, left: number, size: number): MlxArray[] {
  const out: MlxArray[] = [];
  try {
    ref.forEach((r, i) => {
      if (!planes) {
        out.push(zeroRows(r, rows, size));
        return;
      }
      const src = planes[i]!;
      const t = src.shape[2]!;
      let right = size - t - left;
      const keep = right < 0 ? Math.max(0, t + right) : t;
      if (right < 0) right = 0;
      using cut = keep < t ? tokens(src, 0, keep) : src.retain();
      out.push(left !== 0 || right !== 0 ? padTokens(cut, left, right) : cut.retain());
    });
    return out;
  } catch (e) {
    disposeAll(out);
    throw e;
  }
}
