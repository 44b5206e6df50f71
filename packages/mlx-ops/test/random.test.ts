import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { exactDiff } from "../../../tools/oracle/compare.ts";
import { type Case, compareAll, input } from "./helpers.ts";

// Tolerance: none. The same key through the same mlx::core::random calls (argument types as
// MLX Python passes them) gives the same bits; every sample is compared byte for byte.

describe("random with explicit keys vs Python MLX", () => {
  test("key/split/uniform/normal/randint/bernoulli/categorical/gumbel/... are bit-identical", () => {
    using k = mx.random.key(42);
    using logits = input([3, 10], "float32", 1);
    using logitsb = input([3, 10], "bfloat16", 2);
    using p = input([4, 5], "float32", 3, 0, 1);
    using lo = input([5], "float32", 4, -2, 0);
    const inputs = { k, logits, logitsb, p, lo };
    const K = "mx.random.key(42)";
    const cases: Record<string, Case> = {
      key0: ["mx.random.key(0)", () => mx.random.key(0)],
      key_big: ["mx.random.key(2**40 + 12345)", () => mx.random.key(2 ** 40 + 12345)],
      key_bigint: ["mx.random.key(2**63 + 5)", () => mx.random.key(2n ** 63n + 5n)],
      split: [`mx.random.split(${K})`, () => mx.random.split(k)],
      split5: [`mx.random.split(${K}, 5)`, () => mx.random.split(k, 5)],
      uniform: [`mx.random.uniform(shape=(4, 5), key=${K})`, () => mx.random.uniform(0, 1, [4, 5], { key: k })],
      uniform_lh: [`mx.random.uniform(-2.5, 3, (100,), key=${K})`, () => mx.random.uniform(-2.5, 3, [100], { key: k })],
      uniform_b: [`mx.random.uniform(shape=(64,), dtype=mx.bfloat16, key=${K})`, () => mx.random.uniform(0, 1, [64], { dtype: "bfloat16", key: k })],
      uniform_arr: [`mx.random.uniform(lo, 1.0, (3, 5), key=${K})`, () => mx.random.uniform(lo, 1.0, [3, 5], { key: k })],
      normal: [`mx.random.normal((4, 5), key=${K})`, () => mx.random.normal([4, 5], { key: k })],
      normal_ls: [`mx.random.normal((50,), loc=1.5, scale=0.3, key=${K})`, () => mx.random.normal([50], { loc: 1.5, scale: 0.3, key: k })],
      normal_b: [`mx.random.normal((33,), dtype=mx.bfloat16, scale=0.02, key=${K})`, () => mx.random.normal([33], { dtype: "bfloat16", scale: 0.02, key: k })],
      normal_h: [`mx.random.normal((8, 8), dtype=mx.float16, key=${K})`, () => mx.random.normal([8, 8], { dtype: "float16", key: k })],
      normal_0d: [`mx.random.normal(key=${K})`, () => mx.random.normal([], { key: k })],
      randint: [`mx.random.randint(0, 10, (20,), key=${K})`, () => mx.random.randint(0, 10, [20], { key: k })],
      randint_neg: [`mx.random.randint(-5, 5, (4, 4), dtype=mx.int64, key=${K})`, () => mx.random.randint(-5, 5, [4, 4], { dtype: "int64", key: k })],
      bernoulli: [`mx.random.bernoulli(key=${K})`, () => mx.random.bernoulli(0.5, undefined, { key: k })],
      bernoulli_p: [`mx.random.bernoulli(0.3, (50,), key=${K})`, () => mx.random.bernoulli(0.3, [50], { key: k })],
      bernoulli_arr: [`mx.random.bernoulli(p, key=${K})`, () => mx.random.bernoulli(p, undefined, { key: k })],
      categorical: [`mx.random.categorical(logits, key=${K})`, () => mx.random.categorical(logits, { key: k })],
      categorical_b: [`mx.random.categorical(logitsb, key=${K})`, () => mx.random.categorical(logitsb, { key: k })],
      categorical_ax: [`mx.random.categorical(logits, axis=0, key=${K})`, () => mx.random.categorical(logits, { axis: 0, key: k })],
      categorical_n: [`mx.random.categorical(logits, num_samples=6, key=${K})`, () => mx.random.categorical(logits, { num_samples: 6, key: k })],
      categorical_s: [`mx.random.categorical(logits, shape=(2, 3), key=${K})`, () => mx.random.categorical(logits, { shape: [2, 3], key: k })],
      gumbel: [`mx.random.gumbel((6, 7), key=${K})`, () => mx.random.gumbel([6, 7], { key: k })],
      gumbel_b: [`mx.random.gumbel((16,), dtype=mx.bfloat16, key=${K})`, () => mx.random.gumbel([16], { dtype: "bfloat16", key: k })],
      truncated: [`mx.random.truncated_normal(-1, 2, (30,), key=${K})`, () => mx.random.truncated_normal(-1, 2, [30], { key: k })],
      laplace: [`mx.random.laplace((10,), loc=0.5, scale=2.0, key=${K})`, () => mx.random.laplace([10], { loc: 0.5, scale: 2, key: k })],
      perm_n: [`mx.random.permutation(10, key=${K})`, () => mx.random.permutation(10, 0, { key: k })],
      perm_x: [`mx.random.permutation(logits, axis=1, key=${K})`, () => mx.random.permutation(logits, 1, { key: k })],
      // A split key, as sampling code uses it.
      split_then_normal: [
        `mx.random.normal((5,), key=mx.random.split(${K})[1])`,
        () => {
          using ks = mx.random.split(k);
          using k1 = mx.take(ks, 1, 0);
          return mx.random.normal([5], { key: k1 });
        },
      ],
    };
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("reproducible: the same key twice gives the same bits; the global sequence follows seed()", () => {
    using k = mx.random.key(7);
    using a = mx.random.normal([100], { key: k });
    using b = mx.random.normal([100], { key: k });
    expect(exactDiff(a, b)).toBeNull();
    mx.random.seed(3);
    using c = mx.random.uniform(0, 1, [10]);
    mx.random.seed(3);
    using d = mx.random.uniform(0, 1, [10]);
    expect(exactDiff(c, d)).toBeNull();
  });

  test("errors and JS-side checks", () => {
    using k = mx.random.key(1);
    using bad = MlxArray.fromNumbers([1, 2, 3], [3], "uint32");
    expect(() => mx.random.key(-1)).toThrow(/seed must be a non-negative integer/);
    expect(() => mx.random.key(1.5)).toThrow(/seed must be a non-negative integer/);
    expect(() => mx.random.normal([2, -3], { key: k })).toThrow(/random.normal: invalid shape/);
    expect(() => mx.random.split(k, 2.5)).toThrow(/random.split: num must be an integer/);
    expect(() => mx.random.uniform(0, 1, [2], { key: bad })).toThrow(/random.uniform\(.*\): .*key/i);
    using l = input([2, 3], "float32", 1);
    expect(() => mx.random.categorical(l, { shape: [2], num_samples: 2 })).toThrow(/at most one of shape and num_samples/);
  });
});
