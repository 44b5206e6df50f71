import { describe, expect, test } from "vitest";
import * as mx from "@mlx-bun/mlx-ops";
import { type Case, compareAll, input } from "./helpers.ts";

// Tolerance: none (creation results are exact: same dtype, shape and bytes as Python MLX).

describe("creation vs Python MLX", () => {
  test("zeros/ones/full/arange/linspace/eye/identity/tri/tril/triu/*_like/array", () => {
    using x = input([3, 4], "bfloat16", 1);
    using sq = input([4, 4], "float32", 2);
    const inputs = { x, sq };
    const cases: Record<string, Case> = {
      zeros: ["mx.zeros((2, 3))", () => mx.zeros([2, 3])],
      zeros_b: ["mx.zeros(4, dtype=mx.bfloat16)", () => mx.zeros(4, "bfloat16")],
      zeros_0d: ["mx.zeros(())", () => mx.zeros([])],
      ones: ["mx.ones((2, 2), mx.int32)", () => mx.ones([2, 2], "int32")],
      full_f: ["mx.full((2, 3), 1.5)", () => mx.full([2, 3], 1.5)],
      full_i: ["mx.full((2,), 7)", () => mx.full([2], 7)],
      full_b: ["mx.full((3,), True)", () => mx.full([3], true)],
      full_bf: ["mx.full((2, 2), 0.1, mx.bfloat16)", () => mx.full([2, 2], 0.1, "bfloat16")],
      full_h: ["mx.full((2, 2), 1/3, mx.float16)", () => mx.full([2, 2], 1 / 3, "float16")],
      full_inf: ["mx.full((2,), -float('inf'), mx.bfloat16)", () => mx.full([2], Number.NEGATIVE_INFINITY, "bfloat16")],
      full_arr: [
        "mx.full((3, 4), x[0])",
        () => {
          using row = mx.index(x, 0);
          return mx.full([3, 4], row);
        },
      ],
      zeros_like: ["mx.zeros_like(x)", () => mx.zeros_like(x)],
      ones_like: ["mx.ones_like(x)", () => mx.ones_like(x)],
      full_like: ["mx.full(x.shape, 2.5, x.dtype)", () => mx.full_like(x, 2.5)],
      arange: ["mx.arange(5)", () => mx.arange(5)],
      arange2: ["mx.arange(2, 9)", () => mx.arange(2, 9)],
      arange3: ["mx.arange(10, 0, -3)", () => mx.arange(10, 0, -3)],
      arange_f: ["mx.arange(0, 2, 0.25)", () => mx.arange(0, 2, 0.25)],
      arange_fs: ["mx.arange(0.5, 4)", () => mx.arange(0.5, 4)],
      arange_dt: ["mx.arange(6, dtype=mx.bfloat16)", () => mx.arange(6, { dtype: "bfloat16" })],
      arange_dt3: ["mx.arange(0, 1, 0.1, dtype=mx.float16)", () => mx.arange(0, 1, 0.1, { dtype: "float16" })],
      linspace: ["mx.linspace(0, 1, 7)", () => mx.linspace(0, 1, 7)],
      linspace_b: ["mx.linspace(-3, 5, 11, dtype=mx.bfloat16)", () => mx.linspace(-3, 5, 11, { dtype: "bfloat16" })],
      linspace_d: ["mx.linspace(0, 1)", () => mx.linspace(0, 1)],
      eye: ["mx.eye(3)", () => mx.eye(3)],
      eye_mk: ["mx.eye(3, 5, k=1, dtype=mx.int32)", () => mx.eye(3, { m: 5, k: 1, dtype: "int32" })],
      identity: ["mx.identity(4, mx.bfloat16)", () => mx.identity(4, "bfloat16")],
      tri: ["mx.tri(4)", () => mx.tri(4)],
      tri_mk: ["mx.tri(3, 5, k=-1, dtype=mx.bool_)", () => mx.tri(3, { m: 5, k: -1, dtype: "bool" })],
      tril: ["mx.tril(sq)", () => mx.tril(sq)],
      tril_k: ["mx.tril(sq, 1)", () => mx.tril(sq, 1)],
      triu: ["mx.triu(sq, -1)", () => mx.triu(sq, -1)],
      triu_b: ["mx.triu(x)", () => mx.triu(x)],
      copy: ["mx.array(x)", () => mx.copy(x)],
      array_i: [
        "mx.array([[1, 2, 3], [4, 5, 6]])",
        () =>
          mx.array([
            [1, 2, 3],
            [4, 5, 6],
          ]),
      ],
      array_f: ["mx.array([1.5, -2, 3])", () => mx.array([1.5, -2, 3])],
      array_b: ["mx.array([True, False])", () => mx.array([true, false])],
      array_mixed: ["mx.array([True, 2])", () => mx.array([true, 2])],
      array_scalar: ["mx.array(3.25)", () => mx.array(3.25)],
      array_dt: ["mx.array([[0.1, 0.2]], dtype=mx.bfloat16)", () => mx.array([[0.1, 0.2]], "bfloat16")],
      array_empty: ["mx.array([])", () => mx.array([])],
    };
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("errors and JS-side checks", () => {
    expect(() => mx.zeros([2, -1])).toThrow(/zeros: invalid shape \[2, -1\]/);
    expect(() => mx.ones([1.5])).toThrow(/ones: invalid shape/);
    expect(() => mx.eye(2.5)).toThrow(/eye: n must be an integer/);
    expect(() => mx.linspace(0, 1, -1)).toThrow(/linspace\(0, 1, -1, float32\)/);
    expect(() => mx.arange(0, Number.POSITIVE_INFINITY)).toThrow(/arange: Infinity is not a finite number/);
    expect(() => mx.array([[1, 2], [3]])).toThrow(/ragged/);
    expect(() => mx.zeros([2], "float8" as never)).toThrow(/unsupported dtype/);
  });
});
