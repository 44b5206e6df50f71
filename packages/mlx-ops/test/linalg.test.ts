import { describe, expect, test } from "vitest";
import * as mx from "@mlx-bun/mlx-ops";
import { type Case, compareAll, input } from "./helpers.ts";

// Tolerance: none. matmul/addmm call the same CPU GEMM as Python MLX on the same inputs and
// shapes, so results are bit-exact; outer via broadcasting is a plain multiply, also exact.

describe("linear algebra vs Python MLX", () => {
  test("matmul (batched, broadcast, vector), addmm, outer, inner, tensordot, block_masked_mm", () => {
    using a = input([3, 4], "float32", 1);
    using b = input([4, 5], "float32", 2);
    using c = input([3, 5], "float32", 3);
    using ab = input([2, 3, 4], "bfloat16", 4);
    using bb = input([4, 6], "bfloat16", 5);
    using v = input([4], "float32", 6);
    using w = input([6], "float32", 7);
    using bat = input([2, 1, 3, 4], "float32", 8);
    using bat2 = input([5, 4, 2], "float32", 9);
    using big = input([64, 64], "float32", 10);
    using big2 = input([64, 64], "float32", 11);
    using mask = input([2, 2], "bool", 12);
    const inputs = { a, b, c, ab, bb, v, w, bat, bat2, big, big2, mask };
    const cases: Record<string, Case> = {
      matmul: ["a @ b", () => mx.matmul(a, b)],
      matmul_b: ["mx.matmul(ab, bb)", () => mx.matmul(ab, bb)],
      matmul_vec: ["mx.matmul(a, v)", () => mx.matmul(a, v)],
      matmul_vecl: ["mx.matmul(v, b)", () => mx.matmul(v, b)],
      matmul_bcast: ["mx.matmul(bat, bat2)", () => mx.matmul(bat, bat2)],
      addmm: ["mx.addmm(c, a, b)", () => mx.addmm(c, a, b)],
      addmm_ab: ["mx.addmm(c, a, b, alpha=0.5, beta=2.0)", () => mx.addmm(c, a, b, { alpha: 0.5, beta: 2 })],
      outer: ["mx.outer(v, w)", () => mx.outer(v, w)],
      // outer written with broadcasting, as model code does it
      outer_bcast: [
        "mx.outer(v, w)",
        () => {
          using vc = mx.index(v, ":", null);
          using wr = mx.index(w, null, ":");
          return mx.multiply(vc, wr);
        },
      ],
      inner: ["mx.inner(a, v)", () => mx.inner(a, v)],
      tensordot: ["mx.tensordot(ab, bb, axes=([2], [0]))", () => mx.tensordot(ab, bb, [[2], [0]])],
      bmm: ["mx.block_masked_mm(big, big2, 32, mask_out=mask)", () => mx.block_masked_mm(big, big2, 32, { mask_out: mask })],
    };
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("shape mismatch names the op and both shapes", () => {
    using a = input([3, 4], "float32", 1);
    using b = input([3, 4], "float32", 2);
    expect(() => mx.matmul(a, b)).toThrow(/matmul\(array\(shape=\[3, 4\], dtype=float32\), array\(shape=\[3, 4\], dtype=float32\)\)/);
  });
});
