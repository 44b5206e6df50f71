// Seeded test inputs for the quantized, fast, compile, kernel and TurboQuant suites: deterministic
// pseudo-random data made in JS (so the same bytes go to our ops and to the Python oracle) and
// small assertion helpers.
import { type Dtype, MlxArray, memory } from "@mlx-bun/mlx-ffi";
import { expect } from "vitest";
import { closeDiff, exactDiff } from "../../../tools/oracle/compare.ts";
import { quantize } from "../src/quantized.ts";

/** mulberry32: a small seeded PRNG, uniform in [0, 1). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Standard normal samples (Box-Muller). */
export function normals(n: number, seed: number, scale = 1): number[] {
  const u = rng(seed);
  const out: number[] = [];
  while (out.length < n) {
    const r = Math.sqrt(-2 * Math.log(1 - u()));
    const t = 2 * Math.PI * u();
    out.push(r * Math.cos(t) * scale, r * Math.sin(t) * scale);
  }
  return out.slice(0, n);
}

/** A normal(0, scale²) array of `shape` and `dtype`. */
export function randn(shape: readonly number[], seed: number, dtype: Dtype = "float32", scale = 1): MlxArray {
  const n = shape.reduce((a, b) => a * b, 1);
  return MlxArray.fromNumbers(normals(n, seed, scale), shape, dtype);
}

/** Integers uniform in [0, hi). */
/** [x [lead…, K], w, scales, biases]: x and a weight drawn from normal(0, 1/K) in `dtype`, the weight quantized (affine). */
export function quantizedInputs(lead: readonly number[], n: number, k: number, bits: number, gs: number, dtype: Dtype, seed: number): MlxArray[] {
  const x = randn([...lead, k], seed, dtype);
  using w = randn([n, k], seed + 1, dtype, 1 / Math.sqrt(k));
  return [x, ...(quantize(w, { group_size: gs, bits }) as MlxArray[])];
}

export function randint(shape: readonly number[], hi: number, seed: number, dtype: Dtype = "int32"): MlxArray {
  const u = rng(seed);
  const n = shape.reduce((a, b) => a * b, 1);
  return MlxArray.fromNumbers(
    Array.from({ length: n }, () => Math.floor(u() * hi)),
    shape,
    dtype,
  );
}

/** Bit-exact equality with a labelled failure message. */
export function expectExact(ours: MlxArray, ref: MlxArray, label: string): void {
  expect(exactDiff(ours, ref), label).toBeNull();
}

/** Within atol + rtol·|ref|, same dtype and shape. */
export function expectClose(ours: MlxArray, ref: MlxArray, tol: { atol: number; rtol: number }, label: string): void {
  expect(closeDiff(ours, ref, tol), label).toBeNull();
}

/** Run `fn` and check that it leaves no native handles behind. */
export function expectNoLeaks(fn: () => void): void {
  const before = memory.liveHandles();
  fn();
  expect(memory.liveHandles()).toBe(before);
}
