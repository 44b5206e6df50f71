// mx.fast ops vs Python MLX on the same inputs: bit-exact (same MLX build and kernels).
import { describe, expect, test } from "vitest";
import { type Dtype, MlxArray } from "@mlx-bun/mlx-ffi";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { fast } from "../src/fast.ts";
import { expectExact, expectNoLeaks, randn } from "./seeded-inputs.ts";

const DTYPES: Dtype[] = ["float32", "bfloat16", "float16"];

describe("fast.rms_norm / fast.layer_norm vs Python MLX (bit-exact)", () => {
  test("with and without weight / bias, three dtypes, two eps", () => {
    const inputs: Record<string, MlxArray> = {};
    DTYPES.forEach((dt, i) => {
      inputs[`x_${dt}`] = randn([2, 5, 64], 100 + i, dt);
      inputs[`w_${dt}`] = randn([64], 110 + i, dt);
      inputs[`b_${dt}`] = randn([64], 120 + i, dt);
    });
    const cases: Record<string, string> = {};
    for (const dt of DTYPES) {
      for (const eps of ["1e-06", "1e-05"]) {
        cases[`rms_w_${dt}_${eps}`] = `mx.fast.rms_norm(x_${dt}, w_${dt}, ${eps})`;
        cases[`rms_${dt}_${eps}`] = `mx.fast.rms_norm(x_${dt}, None, ${eps})`;
        cases[`ln_wb_${dt}_${eps}`] = `mx.fast.layer_norm(x_${dt}, w_${dt}, b_${dt}, ${eps})`;
        cases[`ln_w_${dt}_${eps}`] = `mx.fast.layer_norm(x_${dt}, w_${dt}, None, ${eps})`;
        cases[`ln_b_${dt}_${eps}`] = `mx.fast.layer_norm(x_${dt}, None, b_${dt}, ${eps})`;
        cases[`ln_${dt}_${eps}`] = `mx.fast.layer_norm(x_${dt}, None, None, ${eps})`;
      }
    }
    using ref = oracle(inputs, cases);
    try {
      expectNoLeaks(() => {
        for (const dt of DTYPES) {
          const x = inputs[`x_${dt}`]!;
          const w = inputs[`w_${dt}`]!;
          const b = inputs[`b_${dt}`]!;
          for (const eps of ["1e-06", "1e-05"]) {
            const e = Number(eps);
            const check = (id: string, out: MlxArray): void => {
              using o = out;
              expectExact(o, ref.get(id), id);
            };
            check(`rms_w_${dt}_${eps}`, fast.rms_norm(x, w, e));
            check(`rms_${dt}_${eps}`, fast.rms_norm(x, null, e));
            check(`ln_wb_${dt}_${eps}`, fast.layer_norm(x, w, b, e));
            check(`ln_w_${dt}_${eps}`, fast.layer_norm(x, w, null, e));
            check(`ln_b_${dt}_${eps}`, fast.layer_norm(x, undefined, b, e));
            check(`ln_${dt}_${eps}`, fast.layer_norm(x, null, null, e));
          }
        }
      });
    } finally {
      for (const a of Object.values(inputs)) a.dispose();
    }
  });
});

describe("fast.rope vs Python MLX (bit-exact)", () => {
  test("dims full/partial, traditional, base or custom freqs, scale, offset number or array", () => {
    using xf = randn([2, 4, 7, 64], 200);
    using xb = randn([2, 4, 7, 64], 201, "bfloat16");
    using freqs = MlxArray.fromNumbers(
      Array.from({ length: 16 }, (_, i) => 1 / 10000 ** (i / 16) / (i % 3 === 0 ? 8 : 1)),
      [16],
    );
    using off0 = MlxArray.fromNumbers([9], [], "int32");
    using offB = MlxArray.fromNumbers([3, 11], [2], "int32");
    const inputs = { xf, xb, freqs, off0, offB };
    type Case = { x: "xf" | "xb"; dims: number; trad: boolean; base?: number; useFreqs?: boolean; scale: number; offset: number | "off0" | "offB" };
    const cs: Case[] = [];
    for (const x of ["xf", "xb"] as const) {
      for (const trad of [false, true]) {
        cs.push({ x, dims: 64, trad, base: 10000, scale: 1, offset: 0 });
        cs.push({ x, dims: 32, trad, base: 1000000, scale: 1, offset: 5 });
        cs.push({ x, dims: 64, trad, base: 10000, scale: 0.25, offset: 3 });
        cs.push({ x, dims: 32, trad, useFreqs: true, scale: 1, offset: 2 });
        cs.push({ x, dims: 64, trad, base: 10000, scale: 1, offset: "off0" });
        cs.push({ x, dims: 64, trad, base: 10000, scale: 1, offset: "offB" });
        cs.push({ x, dims: 32, trad, useFreqs: true, scale: 1, offset: "offB" });
      }
    }
    const id = (c: Case, i: number): string => `r${i}`;
    const cases = Object.fromEntries(
      cs.map((c, i) => [
        id(c, i),
        `mx.fast.rope(${c.x}, ${c.dims}, traditional=${c.trad ? "True" : "False"}, base=${c.useFreqs ? "None" : c.base!.toFixed(1)}, scale=${c.scale}, offset=${c.offset}${c.useFreqs ? ", freqs=freqs" : ""})`,
      ]),
    );
    using ref = oracle(inputs, cases);
    expectNoLeaks(() => {
      cs.forEach((c, i) => {
        const offset = typeof c.offset === "number" ? c.offset : c.offset === "off0" ? off0 : offB;
        using out = fast.rope(c.x === "xf" ? xf : xb, c.dims, {
          traditional: c.trad,
          ...(c.useFreqs ? { freqs } : { base: c.base! }),
          scale: c.scale,
          offset,
        });
        expectExact(out, ref.get(id(c, i)), `rope case ${i}: ${JSON.stringify(c)}`);
      });
    });
  });
});

describe("fast.scaled_dot_product_attention vs Python MLX (bit-exact)", () => {
  test("no mask, causal, boolean and additive masks, sinks, GQA, decode (Tq = 1)", () => {
    const inputs: Record<string, MlxArray> = {};
    for (const dt of ["float32", "bfloat16"] as const) {
      inputs[`q_${dt}`] = randn([2, 8, 5, 64], 300, dt);
      inputs[`q1_${dt}`] = randn([2, 8, 1, 64], 301, dt);
      inputs[`k_${dt}`] = randn([2, 2, 9, 64], 302, dt);
      inputs[`v_${dt}`] = randn([2, 2, 9, 64], 303, dt);
      // additive mask in the promoted dtype: 0 where visible, a large negative elsewhere
      inputs[`add_${dt}`] = MlxArray.fromNumbers(
        Array.from({ length: 5 * 9 }, (_, i) => (i % 9 <= Math.floor(i / 9) + 4 ? 0 : -1e4)),
        [5, 9],
        dt,
      );
      inputs[`sinks_${dt}`] = randn([8], 304, dt);
    }
    // a sliding-window boolean mask, and one per batch and head broadcast over heads
    inputs.bmask = MlxArray.fromNumbers(
      Array.from({ length: 5 * 9 }, (_, i) => {
        const r = Math.floor(i / 9) + 4;
        const c = i % 9;
        return c <= r && c > r - 3;
      }),
      [5, 9],
      "bool",
    );
    inputs.bmask4 = MlxArray.fromNumbers(
      Array.from({ length: 2 * 5 * 9 }, (_, i) => (i * 7) % 3 !== 0),
      [2, 1, 5, 9],
      "bool",
    );
    const scale = 0.125;
    type Case = { q: "q" | "q1"; mask: string | null; sinks: boolean };
    const cs: Case[] = [
      { q: "q", mask: null, sinks: false },
      { q: "q", mask: "causal", sinks: false },
      { q: "q", mask: "bmask", sinks: false },
      { q: "q", mask: "bmask4", sinks: false },
      { q: "q", mask: "add", sinks: false },
      { q: "q", mask: "causal", sinks: true },
      { q: "q", mask: "bmask", sinks: true },
      { q: "q1", mask: null, sinks: false },
      { q: "q1", mask: "causal", sinks: false },
      { q: "q1", mask: null, sinks: true },
    ];
    const cases: Record<string, string> = {};
    for (const dt of ["float32", "bfloat16"]) {
      cs.forEach((c, i) => {
        const m = c.mask === null ? "None" : c.mask === "causal" ? '"causal"' : c.mask === "add" ? `add_${dt}` : c.mask;
        cases[`s${i}_${dt}`] =
          `mx.fast.scaled_dot_product_attention(${c.q}_${dt}, k_${dt}, v_${dt}, scale=${scale}, mask=${m}${c.sinks ? `, sinks=sinks_${dt}` : ""})`;
      });
    }
    using ref = oracle(inputs, cases);
    try {
      expectNoLeaks(() => {
        for (const dt of ["float32", "bfloat16"]) {
          cs.forEach((c, i) => {
            const mask = c.mask === null ? null : c.mask === "causal" ? "causal" : inputs[c.mask === "add" ? `add_${dt}` : c.mask]!;
            using out = fast.scaled_dot_product_attention(inputs[`${c.q}_${dt}`]!, inputs[`k_${dt}`]!, inputs[`v_${dt}`]!, {
              scale,
              mask,
              ...(c.sinks ? { sinks: inputs[`sinks_${dt}`]! } : {}),
            });
            expectExact(out, ref.get(`s${i}_${dt}`), `sdpa ${dt} ${JSON.stringify(c)}`);
          });
        }
      });
    } finally {
      for (const a of Object.values(inputs)) a.dispose();
    }
  });
});

describe("fast op errors name the op, shapes and dtypes", () => {
  test("rope dims > last dim, base and freqs, sdpa head dims, rms_norm weight size, bad mask", () => {
    using x = randn([1, 2, 3, 8], 400);
    expect(() => fast.rope(x, 16, { traditional: false, base: 10000 })).toThrow(
      /^fast\.rope\(array\(shape=\[1, 2, 3, 8\], dtype=float32\), dims=16, .*dims must not exceed the input's last dimension \(8\)/,
    );
    using f = randn([4], 401);
    expect(() => fast.rope(x, 8, { traditional: false, base: 10000, freqs: f })).toThrow(/exactly one of base and freqs/);
    expect(() => fast.rope(x, 8, { traditional: false })).toThrow(/exactly one of base and freqs/);
    expect(() => fast.rope(x, 8, { traditional: false, base: 10000, offset: 1.5 })).toThrow(/offset must be an integer/);
    using q = randn([1, 2, 3, 8], 402);
    using k = randn([1, 2, 4, 16], 403);
    expect(() => fast.scaled_dot_product_attention(q, k, k, { scale: 1 })).toThrow(
      /^fast\.scaled_dot_product_attention\(array\(shape=\[1, 2, 3, 8\], dtype=float32\), array\(shape=\[1, 2, 4, 16\], dtype=float32\), .*matching last dimension/,
    );
    expect(() => fast.scaled_dot_product_attention(q, q, q, { scale: 1, mask: "sliding" as "causal" })).toThrow(/mask must be "causal", an array or null/);
    using w = randn([4], 404);
    using x2 = randn([2, 8], 405);
    expect(() => fast.rms_norm(x2, w, 1e-5)).toThrow(
      /^fast\.rms_norm\(array\(shape=\[2, 8\], dtype=float32\), array\(shape=\[4\], dtype=float32\), eps=0\.00001\): .*same size as the last dimension/,
    );
  });
});
