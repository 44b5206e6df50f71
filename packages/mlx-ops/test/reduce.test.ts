import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Case, compareAll, input } from "./helpers.ts";

// Tolerance: none. Reductions, scans and sorts run the same MLX CPU kernels as Python MLX, in the
// same order, so float results are compared byte for byte; indices and shapes are exact anyway.

describe("reductions vs Python MLX", () => {
  test("sum/mean/max/min/prod/all/any/logsumexp/var/std over axes with keepdims, bit-exact", () => {
    using x = input([3, 4, 5], "float32", 1);
    using xb = input([3, 4, 5], "bfloat16", 2);
    using xi = input([3, 4, 5], "int32", 3, -5, 6);
    using m = input([3, 4, 5], "bool", 4);
    const inputs = { x, xb, xi, m };
    const cases: Record<string, Case> = {};
    const axesList: [string, number | number[] | undefined][] = [
      ["None", undefined],
      ["0", 0],
      ["-1", -1],
      ["(0, 2)", [0, 2]],
      ["()", []],
    ];
    for (const op of ["sum", "mean", "max", "min", "prod", "logsumexp"] as const) {
      for (const [pyAx, ax] of axesList) {
        for (const kd of [false, true]) {
          const k = `${op}_${pyAx}_${kd}`;
          cases[`${k}_f`] = [`mx.${op}(x, axis=${pyAx}, keepdims=${kd ? "True" : "False"})`, () => mx[op](x, ax, { keepdims: kd })];
          cases[`${k}_b`] = [`mx.${op}(xb, axis=${pyAx}, keepdims=${kd ? "True" : "False"})`, () => mx[op](xb, ax, { keepdims: kd })];
        }
      }
    }
    for (const op of ["sum", "max", "min", "prod", "mean"] as const) cases[`${op}_i`] = [`mx.${op}(xi, axis=1)`, () => mx[op](xi, 1)];
    for (const op of ["all", "any"] as const) {
      cases[`${op}`] = [`mx.${op}(m)`, () => mx[op](m)];
      cases[`${op}_ax`] = [`mx.${op}(m, axis=1, keepdims=True)`, () => mx[op](m, 1, { keepdims: true })];
      cases[`${op}_f`] = [`mx.${op}(x, axis=-1)`, () => mx[op](x, -1)];
    }
    for (const ddof of [0, 1]) {
      cases[`var_${ddof}`] = [`mx.var(x, axis=1, ddof=${ddof})`, () => mx.var(x, 1, { ddof })];
      cases[`varb_${ddof}`] = [`mx.var(xb, ddof=${ddof})`, () => mx.variance(xb, undefined, { ddof })];
      cases[`std_${ddof}`] = [`mx.std(x, axis=(0, 1), keepdims=True, ddof=${ddof})`, () => mx.std(x, [0, 1], { keepdims: true, ddof })];
    }
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("argmax/argmin, softmax, scans, sort/argsort/partition/topk, bit-exact", () => {
    using x = input([4, 6], "float32", 11);
    using xb = input([4, 6], "bfloat16", 12);
    using xh = input([4, 6], "float16", 12);
    using xi = input([4, 6], "int32", 13, -4, 4); // ties: stable sort order matters
    using big = input([2, 3, 50], "float32", 14, -20, 20);
    using bigb = input([2, 3, 50], "bfloat16", 14, -20, 20);
    const inputs = { x, xb, xh, xi, big, bigb };
    const cases: Record<string, Case> = {};
    for (const op of ["argmax", "argmin"] as const) {
      cases[`${op}`] = [`mx.${op}(x)`, () => mx[op](x)];
      cases[`${op}_0`] = [`mx.${op}(x, axis=0)`, () => mx[op](x, 0)];
      cases[`${op}_kd`] = [`mx.${op}(xb, axis=-1, keepdims=True)`, () => mx[op](xb, -1, { keepdims: true })];
      cases[`${op}_i`] = [`mx.${op}(xi, axis=1)`, () => mx[op](xi, 1)];
    }
    for (const [v, name] of [
      [big, "big"],
      [bigb, "bigb"],
      [xh, "xh"],
    ] as const) {
      cases[`softmax_${name}`] = [`mx.softmax(${name}, axis=-1)`, () => mx.softmax(v, -1)];
      cases[`softmax_p_${name}`] = [`mx.softmax(${name}, axis=-1, precise=True)`, () => mx.softmax(v, -1, { precise: true })];
      cases[`softmax_all_${name}`] = [`mx.softmax(${name})`, () => mx.softmax(v)];
      cases[`softmax_01_${name}`] = [`mx.softmax(${name}, axis=(0, 1))`, () => mx.softmax(v, [0, 1])];
    }
    for (const op of ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"] as const) {
      cases[`${op}`] = [`mx.${op}(x)`, () => mx[op](x)];
      cases[`${op}_1`] = [`mx.${op}(x, axis=1)`, () => mx[op](x, 1)];
      cases[`${op}_rev`] = [`mx.${op}(xb, axis=0, reverse=True)`, () => mx[op](xb, 0, { reverse: true })];
      cases[`${op}_excl`] = [`mx.${op}(x, axis=-1, inclusive=False)`, () => mx[op](x, -1, { inclusive: false })];
      cases[`${op}_rev_excl`] = [`mx.${op}(x, axis=1, reverse=True, inclusive=False)`, () => mx[op](x, 1, { reverse: true, inclusive: false })];
    }
    cases.cumsum_i = ["mx.cumsum(xi, axis=1)", () => mx.cumsum(xi, 1)];
    for (const op of ["sort", "argsort"] as const) {
      cases[`${op}`] = [`mx.${op}(x)`, () => mx[op](x)];
      cases[`${op}_0`] = [`mx.${op}(xb, axis=0)`, () => mx[op](xb, 0)];
      cases[`${op}_none`] = [`mx.${op}(x, axis=None)`, () => mx[op](x, null)];
      cases[`${op}_i`] = [`mx.${op}(xi, axis=-1)`, () => mx[op](xi, -1)];
    }
    cases.partition = ["mx.partition(big, 7)", () => mx.partition(big, 7)];
    cases.argpartition = ["mx.argpartition(big, 7, axis=-1)", () => mx.argpartition(big, 7, -1)];
    cases.argpartition_neg = [
      "mx.argpartition(-bigb, kth=3)",
      () => {
        using n = mx.negative(bigb);
        return mx.argpartition(n, 3);
      },
    ];
    cases.argpartition_none = ["mx.argpartition(x, 5, axis=None)", () => mx.argpartition(x, 5, null)];
    cases.topk = ["mx.topk(big, 5)", () => mx.topk(big, 5)];
    cases.topk_0 = ["mx.topk(x, 2, axis=0)", () => mx.topk(x, 2, 0)];
    cases.topk_none = ["mx.topk(xb, 3, axis=None)", () => mx.topk(xb, 3, null)];
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("errors name the op, the input and the axis; JS-side checks", () => {
    using a = MlxArray.fromNumbers([1, 2, 3, 4, 5, 6], [2, 3]);
    expect(() => mx.sum(a, 2)).toThrow(/sum\(array\(shape=\[2, 3\], dtype=float32\), axis=2\)/);
    expect(() => mx.sum(a, 0.5)).toThrow(/sum: axis 0.5 is not an integer/);
    expect(() => mx.argmax(a, 1.5)).toThrow(/argmax: axis must be an integer/);
    expect(() => mx.topk(a, 4)).toThrow(/topk\(array\(shape=\[2, 3\], dtype=float32\), k=4, axis=-1\)/);
    expect(() => mx.topk(a, 1.5)).toThrow(/topk: k must be an integer/);
    expect(() => mx.var(a, 0, { ddof: 0.5 })).toThrow(/var: ddof must be an integer/);
    expect(() => mx.cumsum(a, 3)).toThrow(/cumsum\(array\(shape=\[2, 3\], dtype=float32\), axis=3\)/);
  });
});
