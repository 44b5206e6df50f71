// Row (batch-axis) helpers for the batched layouts: gathers, per-row rolls, zero rows, padded masks.
// Planes are [B, H, T, x] with rows on axis 0 and tokens on axis 2.
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { createCausalMask } from "./mask.ts";
import { disposeAll, tokens } from "./planes.ts";
import { fail } from "./types.ts";

/** int32 [n] from JS integers. */
export function int32Vector(values: readonly number[], shape: readonly number[] = [values.length]): MlxArray {
  return MlxArray.fromTypedArray(Int32Array.from(values), shape, "int32");
}

/** p[rows] (a gather along the batch axis, as `keys[batch_indices]` in mlx-lm). */
export function takeRows(p: MlxArray, rows: readonly number[]): MlxArray {
  using ids = int32Vector(rows);
  return mx.take(p, ids, 0);
}

/** p[row:row+1] */
export function rowOf(p: MlxArray, row: number): MlxArray {
  const [, h, t, x] = p.shape as [number, number, number, number];
  return mx.slice(p, [row, 0, 0, 0], [row + 1, h, t, x]);
}

/** zeros [b, H, t, x] in the dtype, heads and trailing dim of `like`. */
export function zeroRows(like: MlxArray, b: number, t: number): MlxArray {
  return mx.zeros([b, like.shape[1]!, t, like.shape[3]!], like.dtype);
}

/** mx.pad(p, [(0,0), (0,0), (left, right), (0,0)]) with zeros. */
export function padTokens(p: MlxArray, left: number, right: number): MlxArray {
  return mx.pad(p, [
    [0, 0],
    [0, 0],
    [left, right],
    [0, 0],
  ]);
}

/**
 * mlx-lm's dynamic_roll(x, shifts[:, None], axis=2): row b rolled right by
 * shifts[b] along the token axis (take_along_axis with (t - s) mod T).
 */
export function rollRows(p: MlxArray, shifts: readonly number[]): MlxArray {
  const b = shifts.length;
  const n = p.shape[2]!;
  if (p.shape[0] !== b) fail(`rollRows: ${b} shifts for ${p.describe()}`);
  if (n === 0) return p.retain();
  const idx = new Int32Array(b * n);
  for (let r = 0; r < b; r++) {
    for (let t = 0; t < n; t++) idx[r * n + t] = ((((t - shifts[r]!) % n) + n) % n) | 0;
  }
  using ids = MlxArray.fromTypedArray(idx, [b, 1, n, 1], "int32");
  return mx.take_along_axis(p, ids, 2);
}

/** Each row b of p [B, H, T, x] with its first `n` tokens rolled right by shifts[b] (the rest stay); a new array. */
export function rollRowsWithin(p: MlxArray, shifts: readonly number[], n: number): MlxArray {
  const b = shifts.length;
  const t = p.shape[2]!;
  if (p.shape[0] !== b) fail(`rollRowsWithin: ${b} shifts for ${p.describe()}`);
  if (n > t || n < 0) fail(`rollRowsWithin: ${n} tokens of ${p.describe()}`);
  if (n === 0) return p.retain();
  const idx = new Int32Array(b * t);
  for (let r = 0; r < b; r++) {
    for (let j = 0; j < t; j++) idx[r * t + j] = j < n ? ((((j - shifts[r]!) % n) + n) % n) | 0 : j;
  }
  using ids = MlxArray.fromTypedArray(idx, [b, 1, t, 1], "int32");
  return mx.take_along_axis(p, ids, 2);
}

/**
 * mlx-lm's create_causal_mask(n, offset, window_size, left_padding): boolean
 * [B, 1, n, offset + n]; row b's key j is visible when it is causal (and in
 * the window) and j >= leftPadding[b]. Broadcasts over heads and GQA groups.
 */
export function paddedCausalMask(n: number, offset: number, window: number | null, leftPadding: readonly number[]): MlxArray {
  using causal = createCausalMask(n, offset, window);
  using lp = int32Vector(leftPadding, [leftPadding.length, 1, 1, 1]);
  using r = mx.arange(offset + n);
  using rr = mx.expand_dims(r, 0);
  using keep = mx.less_equal(lp, rr);
  return mx.logical_and(causal, keep);
}

/** Concatenate along the batch axis. */
export function catRows(parts: readonly MlxArray[]): MlxArray {
  return mx.concatenate(parts, 0);
}

/** A [1, H, len, x] row: `left` zero tokens then `data` (or all zeros when data is null). */
export function leftPaddedRow(like: MlxArray, left: number, data: MlxArray | null): MlxArray {
  if (!data) return zeroRows(like, 1, left);
  if (left === 0) return data.retain();
  using z = zeroRows(like, 1, left);
  return mx.concatenate([z, data], 2);
}

/** Copies of row `row`, tokens [start, stop), as compact arrays (mlx-lm's mx.contiguous(keys[i:i+1, :, a:b])). */
export function compactRow(planes: readonly MlxArray[], row: number, start: number, stop: number): MlxArray[] {
  const out: MlxArray[] = [];
  try {
    for (const p of planes) {
      using r = rowOf(p, row);
      using t = tokens(r, start, stop);
      out.push(mx.contiguous(t));
    }
    return out;
  } catch (e) {
    disposeAll(out);
    throw e;
  }
}

/** Validate per-row integers. */
export function checkInts(what: string, values: readonly number[], opts: { length?: number; min?: number } = {}): void {
  if (!Array.isArray(values)) fail(`${what} must be an array of integers`);
  if (opts.length !== undefined && values.length !== opts.length) fail(`${what} has ${values.length} entries, the batch has ${opts.length} rows`);
  for (const v of values) {
    if (!Number.isInteger(v)) fail(`${what} must hold integers, got ${v}`);
    if (opts.min !== undefined && v < opts.min) fail(`${what} must be >= ${opts.min}, got ${v}`);
  }
}
