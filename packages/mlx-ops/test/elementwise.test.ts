import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

describe("elementwise vs Python MLX", () => {
  test("weakly typed scalars keep the array dtype (bit-exact)", () => {
    using a = MlxArray.fromNumbers([1.5, -2.25, 3.125, 100], [2, 2], "bfloat16");
    using ref = oracle({ a }, { mul: "a * 0.3", add: "a + 1", div: "a / 3" });
    using mul = mx.multiply(a, 0.3);
    using add = mx.add(a, 1);
    using div = mx.divide(a, 3);
    expect(exactDiff(mul, ref.get("mul"))).toBeNull();
    expect(exactDiff(add, ref.get("add"))).toBeNull();
    expect(exactDiff(div, ref.get("div"))).toBeNull();
  });

  test("broadcast failure names the op and the shapes", () => {
    using a = MlxArray.fromNumbers([1, 2, 3, 4], [2, 2]);
    using b = MlxArray.fromNumbers([1, 2, 3], [3]);
    expect(() => mx.add(a, b)).toThrow(/add\(array\(shape=\[2, 2\], dtype=float32\), array\(shape=\[3\], dtype=float32\)\).*broadcast/);
  });
});
