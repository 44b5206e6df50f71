// Array comparison for tests: exact (bit-for-bit) or within a stated tolerance.
import type { MlxArray } from "@mlx-bun/mlx-ffi";

/** Same shape, dtype and bytes. Returns a description of the first mismatch, or null. */
export function exactDiff(ours: MlxArray, ref: MlxArray): string | null {
  if (ours.dtype !== ref.dtype) return `dtype ${ours.dtype} vs ${ref.dtype}`;
  if (ours.shape.join() !== ref.shape.join()) return `shape [${ours.shape}] vs [${ref.shape}]`;
  const a = new Uint8Array(ours.toTypedArray().buffer);
  const b = new Uint8Array(ref.toTypedArray().buffer);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return `byte ${i} differs (${a[i]} vs ${b[i]})`;
  return null;
}

/** Max |ours - ref| over elements (NaN where one is NaN and the other not); shapes must match. */
export function maxAbsDiff(ours: MlxArray, ref: MlxArray): number {
  if (ours.shape.join() !== ref.shape.join()) throw new Error(`shape [${ours.shape}] vs [${ref.shape}]`);
  const a = ours.toFloat64Array();
  const b = ref.toFloat64Array();
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!;
    const y = b[i]!;
    if (Number.isNaN(x) || Number.isNaN(y)) {
      if (Number.isNaN(x) !== Number.isNaN(y)) return Number.NaN;
      continue;
    }
    if (x === y) continue; // also equal infinities
    m = Math.max(m, Math.abs(x - y));
  }
  return m;
}

/** Relative L2 error ‖ours − ref‖ / ‖ref‖, in float64 on the host. */
export function relativeError(ours: MlxArray, ref: MlxArray): number {
  if (ours.shape.join() !== ref.shape.join()) throw new Error(`shape [${ours.shape}] vs [${ref.shape}]`);
  const x = ours.toFloat64Array();
  const y = ref.toFloat64Array();
  let num = 0;
  let den = 0;
  for (let i = 0; i < x.length; i++) {
    num += (x[i]! - y[i]!) ** 2;
    den += y[i]! ** 2;
  }
  return Math.sqrt(num / den);
}

/** Within atol + rtol·|ref| elementwise, same dtype and shape; returns the first violation or null. */
export function closeDiff(ours: MlxArray, ref: MlxArray, tol: { atol: number; rtol: number }): string | null {
  if (ours.dtype !== ref.dtype) return `dtype ${ours.dtype} vs ${ref.dtype}`;
  if (ours.shape.join() !== ref.shape.join()) return `shape [${ours.shape}] vs [${ref.shape}]`;
  const a = ours.toFloat64Array();
  const b = ref.toFloat64Array();
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!;
    const y = b[i]!;
    if (Number.isNaN(x) && Number.isNaN(y)) continue;
    if (x === y) continue;
    if (!(Math.abs(x - y) <= tol.atol + tol.rtol * Math.abs(y))) return `element ${i}: ${x} vs ${y}`;
  }
  return null;
}
