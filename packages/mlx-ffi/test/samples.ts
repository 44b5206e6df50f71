import { type DTYPES, MlxArray } from "../src/index.ts";

// Deterministic bytes for every dtype (bool kept to 0/1, floats from integers so no NaN payload games).
export function sample(dt: (typeof DTYPES)[number], n: number): MlxArray {
  if (dt === "bool")
    return MlxArray.fromNumbers(
      Array.from({ length: n }, (_, i) => i % 3 === 0),
      [n],
      dt,
    );
  if (dt === "complex64")
    return MlxArray.fromNumbers(
      Array.from({ length: 2 * n }, (_, i) => i * 0.25 - 3),
      [n],
      dt,
    );
  if (dt === "int64" || dt === "uint64")
    return MlxArray.fromNumbers(
      Array.from({ length: n }, (_, i) => BigInt(i * 7919)),
      [n],
      dt,
    );
  const signed = dt.startsWith("int") || dt.startsWith("float") || dt === "bfloat16";
  return MlxArray.fromNumbers(
    Array.from({ length: n }, (_, i) => (signed ? i - 5 : i) * (dt.startsWith("float") || dt === "bfloat16" ? 0.375 : 1)),
    [n],
    dt,
  );
}
