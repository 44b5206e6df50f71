// Shared by the core op tests (creation, elementwise, reduce, shape, linalg, random): deterministic
// inputs and a batched comparison against Python MLX.
import { type Dtype, MlxArray } from "@mlx-bun/mlx-ffi";
import { closeDiff, exactDiff } from "../../../tools/oracle/compare.ts";
import { oracle } from "../../../tools/oracle/oracle.ts";

/** Deterministic pseudo-random numbers in [lo, hi) (an LCG, so tests need no MLX RNG). */
export function numbers(n: number, seed: number, lo = -3, hi = 3): number[] {
  let x = seed >>> 0 || 1;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out.push(lo + ((hi - lo) * x) / 2 ** 32);
  }
  return out;
}

/** A deterministic array of `shape` and `dtype` (integers for integer dtypes). */
export function input(shape: number[], dtype: Dtype, seed: number, lo = -3, hi = 3): MlxArray {
  const n = shape.reduce((a, b) => a * b, 1);
  let v = numbers(n, seed, lo, hi);
  if (dtype.includes("int")) v = v.map(Math.floor);
  if (dtype === "bool") v = v.map((x) => (x > 0 ? 1 : 0));
  return MlxArray.fromNumbers(v, shape, dtype);
}

export type Tolerance = { atol: number; rtol: number };
/** A case: the Python expression, our result, and a tolerance (omitted: bit-exact). */
export type Case = [expr: string, ours: () => MlxArray | MlxArray[], tol?: Tolerance];

/**
 * Run every case in one Python process and compare: exact (dtype, shape, bytes) unless a
 * tolerance is given. Tuple/list results compare element-wise against "<id>.<i>".
 * Returns the mismatches ("id: why"); empty when all agree. Disposes everything it made.
 */
export function compareAll(inputs: Record<string, MlxArray>, cases: Record<string, Case>): string[] {
  const exprs = Object.fromEntries(Object.entries(cases).map(([id, [e]]) => [id, e]));
  using ref = oracle(inputs, exprs);
  const bad: string[] = [];
  for (const [id, [, make, tol]] of Object.entries(cases)) {
    let ours: MlxArray[];
    try {
      const r = make();
      ours = Array.isArray(r) ? r : [r];
    } catch (e) {
      bad.push(`${id}: threw ${String(e)}`);
      continue;
    }
    try {
      const many = ours.length > 1 || !ref.has(id);
      for (let i = 0; i < ours.length; i++) {
        const rid = many ? `${id}.${i}` : id;
        if (!ref.has(rid)) {
          bad.push(`${id}: python gave no result${ref.error(id) ? ` (${ref.error(id)})` : ""}`);
          break;
        }
        const d = tol ? closeDiff(ours[i]!, ref.get(rid), tol) : exactDiff(ours[i]!, ref.get(rid));
        if (d) bad.push(`${rid}: ${d}`);
      }
    } finally {
      for (const o of ours) o.dispose();
    }
  }
  return bad;
}
