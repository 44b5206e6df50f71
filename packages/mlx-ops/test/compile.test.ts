// compile(): MLX traces a TypeScript function through a native callback. Results must equal the
// uncompiled function bit for bit, and Python's mx.compile of the same function.
import { describe, expect, test } from "vitest";
import { type MlxArray, memory } from "@mlx-bun/mlx-ffi";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { add, exp, gelu_approx, multiply, negative, tanh } from "../src/elementwise.ts";
import { sum } from "../src/reduce.ts";
import { compile, set_compile_enabled } from "../src/compile.ts";
import { fast } from "../src/fast.ts";
import { expectExact, randn } from "./seeded-inputs.ts";

// f(x, y) = tanh(x * y) + exp(-x), written with `using` for the intermediates.
function f(x: MlxArray, y: MlxArray): MlxArray {
  using xy = multiply(x, y);
  using t = tanh(xy);
  using nx = negative(x);
  using e = exp(nx);
  return add(t, e);
}
const F_PY = "lambda x, y: mx.tanh(x * y) + mx.exp(-x)";

// Two outputs: gelu_approx(x) * y and the row sums of x * 0.5.
function g(x: MlxArray, y: MlxArray): MlxArray[] {
  using gx = gelu_approx(x);
  using h = multiply(x, 0.5);
  return [multiply(gx, y), sum(h, -1)];
}
const G_PY = 'lambda x, y: (__import__("mlx.nn", fromlist=["nn"]).gelu_approx(x) * y, mx.sum(x * 0.5, -1))';

describe("compile vs uncompiled and vs Python mx.compile", () => {
  test("elementwise graph, float32 and bfloat16: bit-exact with both", () => {
    using x = randn([16, 64], 1);
    using y = randn([16, 64], 2);
    using xb = randn([16, 64], 3, "bfloat16");
    using yb = randn([16, 64], 4, "bfloat16");
    using ref = oracle({ x, y, xb, yb }, { f: `mx.compile(${F_PY})(x, y)`, fb: `mx.compile(${F_PY})(xb, yb)` });
    using cf = compile(f);
    using o1 = cf(x, y);
    using u1 = f(x, y);
    expectExact(o1, u1, "compiled vs uncompiled (float32)");
    expectExact(o1, ref.get("f"), "compiled vs Python mx.compile (float32)");
    using o2 = cf(xb, yb);
    using u2 = f(xb, yb);
    expectExact(o2, u2, "compiled vs uncompiled (bfloat16)");
    expectExact(o2, ref.get("fb"), "compiled vs Python mx.compile (bfloat16)");
    expect(cf.traces).toBe(2); // one per dtype
  });

  test("several outputs; the graph is reused for same shapes and retraced for new ones", () => {
    using x = randn([4, 32], 5);
    using y = randn([4, 32], 6);
    using x2 = randn([4, 32], 7);
    using x3 = randn([3, 32], 8);
    using y3 = randn([3, 32], 9);
    using ref = oracle({ x, y }, { g: `mx.compile(${G_PY})(x, y)` });
    using cg = compile(g);
    const [a, b] = cg(x, y);
    using _a = a!;
    using _b = b!;
    const [ua, ub] = g(x, y);
    using _ua = ua!;
    using _ub = ub!;
    expectExact(a!, ua!, "output 0 vs uncompiled");
    expectExact(b!, ub!, "output 1 vs uncompiled");
    expectExact(a!, ref.get("g.0"), "output 0 vs Python");
    expectExact(b!, ref.get("g.1"), "output 1 vs Python");
    const again = cg(x2, y);
    for (const o of again) o.dispose();
    expect(cg.traces).toBe(1);
    const other = cg(x3, y3);
    for (const o of other) o.dispose();
    expect(cg.traces).toBe(2);
  });

  test("shapeless: one trace serves every shape of the same rank and dtype", () => {
    using sf = compile(f, { shapeless: true });
    for (const rows of [1, 3, 8, 5]) {
      using x = randn([rows, 16], 10 + rows);
      using y = randn([rows, 16], 20 + rows);
      using o = sf(x, y);
      using u = f(x, y);
      expect(o.shape).toEqual([rows, 16]);
      expectExact(o, u, `shapeless rows=${rows}`);
    }
    expect(sf.traces).toBe(1);
  });

  test("fast ops, nested compiled functions and captured constants", () => {
    using w = randn([32], 30);
    using x = randn([2, 3, 32], 31);
    // Captured arrays are baked into the trace as constants.
    const norm = (a: MlxArray): MlxArray => fast.rms_norm(a, w, 1e-6);
    using cnorm = compile(norm);
    using outer = compile((a: MlxArray) => {
      using n = cnorm(a);
      return multiply(n, 2);
    });
    using ref = oracle({ w, x }, { o: "mx.compile(lambda a: mx.compile(lambda b: mx.fast.rms_norm(b, w, 1e-6))(a) * 2)(x)" });
    using o = outer(x);
    expectExact(o, ref.get("o"), "nested compile with rms_norm");
  });

  test("an exception inside the traced function surfaces as itself; the function stays usable", () => {
    let fail = true;
    class Boom extends Error {}
    using cf = compile((a: MlxArray) => {
      if (fail) throw new Boom("no graph today");
      return exp(a);
    });
    using x = randn([4], 40);
    expect(() => cf(x)).toThrow(Boom);
    expect(() => cf(x)).toThrow("no graph today");
    fail = false;
    using o = cf(x);
    using u = exp(x);
    expectExact(o, u, "after a failed trace");
    using bad = compile(() => 42 as unknown as MlxArray);
    expect(() => bad()).toThrow(/must return an MlxArray/);
    expect(() => cf(3 as unknown as MlxArray)).toThrow(/arguments must be MlxArrays/);
  });

  test("compilation disabled: the same results, traced per call", () => {
    using x = randn([8, 8], 50);
    using y = randn([8, 8], 51);
    using u = f(x, y);
    set_compile_enabled(false);
    try {
      using cf = compile(f);
      using o = cf(x, y);
      using o2 = cf(x, y);
      expectExact(o, u, "compile disabled");
      expect(cf.traces).toBe(2);
    } finally {
      set_compile_enabled(true);
    }
  });

  test("no handles or memory left behind after dispose", () => {
    using x = randn([64, 64], 60);
    using y = randn([64, 64], 61);
    const handles = memory.liveHandles();
    const active = memory.active();
    {
      using cf = compile(f);
      for (let i = 0; i < 3; i++) {
        using o = cf(x, y);
        o.eval();
      }
      using sg = compile(g, { shapeless: true });
      for (const o of sg(x, y)) o.eval().dispose();
    }
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(active);
    using cf = compile(f);
    cf.dispose();
    expect(() => cf(x, y)).toThrow(/used after dispose/);
  });
});
