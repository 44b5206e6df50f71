import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";
import { type Case, compareAll, input, numbers } from "./helpers.ts";

// Tolerance: none. Same MLX build and the same ops on the same CPU give the same bits, so every
// elementwise result (float32, bfloat16, float16, ints, bools) is compared byte for byte.

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

  test("every unary, binary, comparison and logical op, all dtypes, bit-exact", () => {
    const special = [0, -0, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 1e-30, -1e30, 0.5];
    const base = [...numbers(32, 7, -4, 4), ...special];
    using x = MlxArray.fromNumbers(base, [5, 8]);
    using xb = MlxArray.fromNumbers(base, [5, 8], "bfloat16");
    using xh = MlxArray.fromNumbers(base, [5, 8], "float16");
    using p = input([5, 8], "float32", 3, 0.01, 5);
    using pb = input([5, 8], "bfloat16", 3, 0.01, 5);
    using u = input([5, 8], "float32", 4, -0.99, 0.99);
    using y = input([8], "float32", 5);
    using yb = input([8], "bfloat16", 5);
    using xi = input([5, 8], "int32", 6, -20, 20);
    using yi = input([8], "int32", 8, 1, 7);
    using xu = input([5, 8], "uint32", 9, 0, 1000);
    using m = input([5, 8], "bool", 10);
    using n = input([8], "bool", 11);
    const inputs = { x, xb, xh, p, pb, u, y, yb, xi, yi, xu, m, n };
    const cases: Record<string, Case> = {};

    const unaryFloat = [
      "negative",
      "square",
      "abs",
      "sign",
      "exp",
      "expm1",
      "tanh",
      "sigmoid",
      "erf",
      "floor",
      "ceil",
      "sin",
      "cos",
      "isnan",
      "isinf",
      "isfinite",
      "stop_gradient",
    ] as const;
    const unaryPos = ["sqrt", "rsqrt", "log", "log2", "log10", "log1p", "reciprocal", "tan"] as const;
    for (const op of unaryFloat) {
      for (const v of ["x", "xb", "xh"] as const) cases[`${op}_${v}`] = [`mx.${op}(${v})`, () => mx[op](inputs[v])];
    }
    for (const op of unaryPos) {
      for (const v of ["p", "pb"] as const) cases[`${op}_${v}`] = [`mx.${op}(${v})`, () => mx[op](inputs[v])];
    }
    cases.erfinv = ["mx.erfinv(u)", () => mx.erfinv(u)];
    cases.negative_i = ["mx.negative(xi)", () => mx.negative(xi)];
    cases.abs_i = ["mx.abs(xi)", () => mx.abs(xi)];
    cases.square_i = ["mx.square(xi)", () => mx.square(xi)];
    cases.sign_i = ["mx.sign(xi)", () => mx.sign(xi)];
    cases.logical_not = ["mx.logical_not(m)", () => mx.logical_not(m)];
    cases.bitwise_invert = ["mx.bitwise_invert(xu)", () => mx.bitwise_invert(xu)];
    cases.round0 = ["mx.round(x)", () => mx.round(x)];
    cases.round2 = ["mx.round(xb, 2)", () => mx.round(xb, 2)];

    const binary = [
      "add",
      "subtract",
      "multiply",
      "divide",
      "power",
      "remainder",
      "floor_divide",
      "maximum",
      "minimum",
      "logaddexp",
      "arctan2",
      "equal",
      "not_equal",
      "less",
      "less_equal",
      "greater",
      "greater_equal",
    ] as const;
    for (const op of binary) {
      cases[`${op}_xy`] = [`mx.${op}(x, y)`, () => mx[op](x, y)];
      cases[`${op}_bb`] = [`mx.${op}(xb, yb)`, () => mx[op](xb, yb)];
      cases[`${op}_bf`] = [`mx.${op}(xb, y)`, () => mx[op](xb, y)]; // promotion bf16 x f32
      cases[`${op}_b_s`] = [`mx.${op}(xb, 1.7)`, () => mx[op](xb, 1.7)];
      cases[`${op}_s_b`] = [`mx.${op}(2, pb)`, () => mx[op](2, pb)];
    }
    for (const op of ["add", "subtract", "multiply", "floor_divide", "remainder", "maximum", "minimum", "equal", "less", "greater_equal"] as const) {
      cases[`${op}_ii`] = [`mx.${op}(xi, yi)`, () => mx[op](xi, yi)];
      cases[`${op}_i_s`] = [`mx.${op}(xi, 3)`, () => mx[op](xi, 3)];
      cases[`${op}_i_f`] = [`mx.${op}(xi, 2.5)`, () => mx[op](xi, 2.5)]; // float scalar + int array: float32
    }
    cases.divide_ii = ["mx.divide(xi, yi)", () => mx.divide(xi, yi)];
    cases.power_ii = ["mx.power(yi, 3)", () => mx.power(yi, 3)];
    for (const op of ["logical_and", "logical_or"] as const) {
      cases[op] = [`mx.${op}(m, n)`, () => mx[op](m, n)];
      cases[`${op}_s`] = [`mx.${op}(m, True)`, () => mx[op](m, true)];
    }
    for (const op of ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"] as const) {
      cases[op] = [`mx.${op}(xu, 3)`, () => mx[op](xu, 3)];
    }
    cases.bitwise_bool = ["mx.bitwise_and(m, n)", () => mx.bitwise_and(m, n)];
    // A double whose float32 rounding lands on a bfloat16 tie: weak scalars go through float32 as in Python.
    cases.double_round = ["xb * (1.00390625 + 2**-30)", () => mx.multiply(xb, 1.00390625 + 2 ** -30)];
    cases.bool_scalar = ["xb + True", () => mx.add(xb, true)];
    cases.both_scalars = ["mx.add(1, 2.5)", () => mx.add(1, 2.5)];
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("where, clip, astype and the mlx.nn activations, bit-exact", () => {
    const special = [0, -0, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 30, -30, 1e-4];
    const base = [...numbers(56, 21, -6, 6), ...special];
    using x = MlxArray.fromNumbers(base, [8, 8]);
    using xb = MlxArray.fromNumbers(base, [8, 8], "bfloat16");
    using xh = MlxArray.fromNumbers(base, [8, 8], "float16");
    using y = input([8], "float32", 22);
    using c = input([8, 8], "bool", 23);
    using xi = input([8, 8], "int32", 24, -50, 50);
    using lo = input([8], "float32", 25, -2, 0);
    const inputs = { x, xb, xh, y, c, xi, lo };
    const cases: Record<string, Case> = {
      where: ["mx.where(c, x, y)", () => mx.where(c, x, y)],
      where_s: ["mx.where(c, xb, 0.0)", () => mx.where(c, xb, 0.5 - 0.5)],
      where_ss: ["mx.where(c, 1, 2)", () => mx.where(c, 1, 2)],
      where_ninf: ["mx.where(c, xb, -float('inf'))", () => mx.where(c, xb, Number.NEGATIVE_INFINITY)],
      clip: ["mx.clip(x, -1.5, 2)", () => mx.clip(x, -1.5, 2)],
      clip_b: ["mx.clip(xb, -1.5, None)", () => mx.clip(xb, -1.5, null)],
      clip_hi: ["mx.clip(xh, None, 0.25)", () => mx.clip(xh, null, 0.25)],
      clip_arr: ["mx.clip(x, lo, 1)", () => mx.clip(x, lo, 1)],
      clip_i: ["mx.clip(xi, -10, 10)", () => mx.clip(xi, -10, 10)],
      astype_b: ["x.astype(mx.bfloat16)", () => mx.astype(x, "bfloat16")],
      astype_h: ["xb.astype(mx.float16)", () => mx.astype(xb, "float16")],
      astype_i: ["xi.astype(mx.float32)", () => mx.astype(xi, "float32")],
      astype_u8: ["xi.astype(mx.uint8)", () => mx.astype(xi, "uint8")],
      astype_bool: ["xi.astype(mx.bool_)", () => mx.astype(xi, "bool")],
    };
    for (const v of ["x", "xb", "xh"] as const) {
      for (const act of ["gelu", "gelu_approx", "gelu_fast_approx", "silu", "softplus", "relu"] as const) {
        cases[`${act}_${v}`] = [`__import__('mlx.nn', fromlist=['nn']).${act}(${v})`, () => mx[act](inputs[v])];
      }
      // The composition mlx.nn documents, issued op by op in Python.
      cases[`gelu_formula_${v}`] = [`${v} * (1 + mx.erf(${v} / __import__('math').sqrt(2))) / 2`, () => mx.gelu(inputs[v])];
    }
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("JS-side argument checks", () => {
    using a = MlxArray.fromNumbers([1, 2], [2]);
    expect(() => mx.round(a, 1.5)).toThrow(/round: decimals must be an integer/);
    expect(() => mx.clip(a, null, null)).toThrow(/clip: at least one/);
    expect(() => mx.astype(a, "float8" as never)).toThrow(/unsupported dtype/);
    using b = MlxArray.fromNumbers([1, 2, 3], [3], "int32");
    expect(() => mx.where(a, a, b)).toThrow(/where\(array\(shape=\[2\], dtype=float32\).*array\(shape=\[3\], dtype=int32\)\)/);
  });
});
