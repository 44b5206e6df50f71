// Quantized ops vs Python MLX on the same inputs: bit-exact (same MLX build, same CPU kernels).
import { describe, expect, test } from "vitest";
import { MlxArray, memory } from "@mlx-bun/mlx-ffi";
import { astype } from "../src/elementwise.ts";
import { swapaxes } from "../src/shape.ts";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { QuantizedTensor, dequantize, gather_mm, gather_qmm, quantize, quantized_matmul, type QuantMode } from "../src/quantized.ts";
import { expectExact, expectNoLeaks, randint, randn } from "./seeded-inputs.ts";

const py = (b: boolean): string => (b ? "True" : "False");

describe("quantize / dequantize vs Python MLX (bit-exact)", () => {
  test("affine: group sizes 32/64/128 × bits 1-6, 8 × float32/bfloat16/float16", () => {
    using w32 = randn([8, 256], 1);
    using wbf = randn([8, 256], 2, "bfloat16");
    using wf16 = randn([8, 256], 3, "float16", 0.1);
    const inputs = { w32, wbf, wf16 };
    const cases: Record<string, string> = {};
    const ours: [string, () => MlxArray[]][] = [];
    for (const [name, w] of Object.entries(inputs)) {
      for (const gs of [32, 64, 128]) {
        for (const bits of [1, 2, 3, 4, 5, 6, 8]) {
          const id = `${name}_${gs}_${bits}`;
          cases[`q_${id}`] = `mx.quantize(${name}, ${gs}, ${bits})`;
          cases[`dq_${id}`] = `(lambda q: mx.dequantize(q[0], q[1], q[2], ${gs}, ${bits}))(mx.quantize(${name}, ${gs}, ${bits}))`;
          ours.push([
            id,
            () => {
              const [wq, scales, biases] = quantize(w, { group_size: gs, bits });
              const dq = dequantize(wq, scales, biases, { group_size: gs, bits });
              return [wq, scales, biases!, dq];
            },
          ]);
        }
      }
    }
    using ref = oracle(inputs, cases);
    for (const [id, run] of ours) {
      const [wq, scales, biases, dq] = run();
      try {
        expectExact(wq!, ref.get(`q_${id}.0`), `wq ${id}`);
        expectExact(scales!, ref.get(`q_${id}.1`), `scales ${id}`);
        expectExact(biases!, ref.get(`q_${id}.2`), `biases ${id}`);
        expectExact(dq!, ref.get(`dq_${id}`), `dequantize ${id}`);
      } finally {
        for (const a of [wq, scales, biases, dq]) a!.dispose();
      }
    }
  });

  test("microscaling modes mxfp4 / mxfp8 / nvfp4, and dequantize dtype", () => {
    using w = randn([4, 128], 4);
    const modes: QuantMode[] = ["mxfp4", "mxfp8", "nvfp4"];
    const cases: Record<string, string> = {};
    for (const m of modes) {
      cases[`q_${m}`] = `mx.quantize(w, mode="${m}")`;
      cases[`dq_${m}`] = `(lambda q: mx.dequantize(q[0], q[1], mode="${m}"))(mx.quantize(w, mode="${m}"))`;
      cases[`dq32_${m}`] = `(lambda q: mx.dequantize(q[0], q[1], mode="${m}", dtype=mx.float32))(mx.quantize(w, mode="${m}"))`;
    }
    using ref = oracle({ w }, cases);
    for (const m of modes) {
      const parts = quantize(w, { mode: m });
      expect(parts.length, m).toBe(2);
      const [wq, scales] = parts;
      using _wq = wq;
      using _s = scales;
      expectExact(wq, ref.get(`q_${m}.0`), `wq ${m}`);
      expectExact(scales, ref.get(`q_${m}.1`), `scales ${m}`);
      using dq = dequantize(wq, scales, undefined, { mode: m });
      expectExact(dq, ref.get(`dq_${m}`), `dequantize ${m}`);
      using dq32 = dequantize(wq, scales, undefined, { mode: m, dtype: "float32" });
      expectExact(dq32, ref.get(`dq32_${m}`), `dequantize float32 ${m}`);
    }
  });

  test("QuantizedTensor holds the parts with their settings and disposes them", () => {
    using w = randn([32, 128], 5, "bfloat16");
    using x = randn([3, 128], 6, "bfloat16");
    using ref = oracle(
      { w, x },
      {
        dq: "(lambda q: mx.dequantize(*q, 32, 3))(mx.quantize(w, 32, 3))",
        mm: "(lambda q: mx.quantized_matmul(x, *q, True, 32, 3))(mx.quantize(w, 32, 3))",
      },
    );
    expectNoLeaks(() => {
      using q = QuantizedTensor.quantize(w, { group_size: 32, bits: 3 });
      expect(q.shape).toEqual([32, 128]);
      expect([q.groupSize, q.bits, q.mode]).toEqual([32, 3, "affine"]);
      expect(q.biases).toBeDefined();
      expect(q.nbytes).toBe(q.weight.nbytes + q.scales.nbytes + q.biases!.nbytes);
      using dq = q.dequantize();
      expectExact(dq, ref.get("dq"), "QuantizedTensor.dequantize");
      using mm = q.matmul(x);
      expectExact(mm, ref.get("mm"), "QuantizedTensor.matmul");
    });
    using fp = QuantizedTensor.quantize(w, { mode: "mxfp8" });
    expect([fp.groupSize, fp.bits, fp.biases]).toEqual([32, 8, undefined]);
    const parts = [fp.weight, fp.scales];
    fp.dispose();
    expect(parts.every((p) => p.disposed)).toBe(true);
  });
});

describe("quantized_matmul / gather_qmm / gather_mm vs Python MLX (bit-exact)", () => {
  test("quantized_matmul: transpose true/false, bits 2/4/8, group sizes 32/64/128, float32/bfloat16", () => {
    using xf = randn([5, 256], 7);
    using xb = randn([5, 256], 8, "bfloat16");
    using wt = randn([64, 256], 9, "float32", 0.05); // x @ w.T: w is [N, K]
    using wn = randn([256, 128], 10, "float32", 0.05); // x @ w: w is [K, N]
    const inputs = { xf, xb, wt, wn };
    const cases: Record<string, string> = {};
    const runs: [string, () => MlxArray][] = [];
    for (const [xn, x] of [
      ["xf", xf],
      ["xb", xb],
    ] as const) {
      for (const transpose of [true, false]) {
        const wn_ = transpose ? "wt" : "wn";
        const wsrc = transpose ? wt : wn;
        for (const gs of [32, 64, 128]) {
          for (const bits of [2, 4, 8]) {
            const id = `${xn}_${transpose}_${gs}_${bits}`;
            // Quantize the weight in x's dtype, as a model's checkpoint would hold it.
            cases[id] = `(lambda q: mx.quantized_matmul(${xn}, *q, ${py(transpose)}, ${gs}, ${bits}))(mx.quantize(${wn_}.astype(${xn}.dtype), ${gs}, ${bits}))`;
            runs.push([
              id,
              () => {
                using wc = astype(wsrc, x.dtype);
                using q = QuantizedTensor.quantize(wc, { group_size: gs, bits });
                return quantized_matmul(x, q.weight, q.scales, q.biases, { transpose, group_size: gs, bits });
              },
            ]);
          }
        }
      }
    }
    using ref = oracle(inputs, cases);
    for (const [id, run] of runs) {
      using out = run();
      expectExact(out, ref.get(id), `quantized_matmul ${id}`);
    }
  });

  test("gather_qmm and gather_mm for MoE: rhs/lhs indices, sorted indices, transpose", () => {
    using x = randn([6, 1, 128], 11); // 6 tokens
    using w = randn([4, 32, 128], 12, "float32", 0.05); // 4 experts of [32, 128]
    using wn = randn([4, 128, 32], 13, "float32", 0.05); // the same, [K, N] layout
    using rhs = randint([6], 4, 14, "uint32");
    using rhsSorted = MlxArray.fromNumbers([0, 0, 1, 2, 3, 3], [6], "uint32");
    using lhs = MlxArray.fromNumbers([5, 4, 3, 2, 1, 0], [6], "uint32");
    const inputs = { x, w, wn, rhs, rhsSorted, lhs };
    using ref = oracle(inputs, {
      g_t: "(lambda q: mx.gather_qmm(x, *q, rhs_indices=rhs, transpose=True, group_size=64, bits=4))(mx.quantize(w, 64, 4))",
      g_n: "(lambda q: mx.gather_qmm(x, *q, rhs_indices=rhs, transpose=False, group_size=32, bits=8))(mx.quantize(wn, 32, 8))",
      g_s: "(lambda q: mx.gather_qmm(x, *q, rhs_indices=rhsSorted, transpose=True, group_size=64, bits=4, sorted_indices=True))(mx.quantize(w, 64, 4))",
      g_l: "(lambda q: mx.gather_qmm(x, *q, lhs_indices=lhs, rhs_indices=rhs, transpose=True, group_size=64, bits=4))(mx.quantize(w, 64, 4))",
      mm: "mx.gather_mm(x, mx.swapaxes(w, -1, -2), rhs_indices=rhs)",
      mm_s: "mx.gather_mm(x, wn, rhs_indices=rhsSorted, sorted_indices=True)",
      mm_l: "mx.gather_mm(x, wn, lhs_indices=lhs, rhs_indices=rhs)",
    });
    expectNoLeaks(() => {
      using q4 = QuantizedTensor.quantize(w, { group_size: 64, bits: 4 });
      using q8 = QuantizedTensor.quantize(wn, { group_size: 32, bits: 8 });
      const qa = (q: QuantizedTensor) => [q.weight, q.scales, q.biases] as const;
      using gt = gather_qmm(x, ...qa(q4), { rhs_indices: rhs, transpose: true, group_size: 64, bits: 4 });
      expect(gt.shape).toEqual([6, 1, 32]);
      expectExact(gt, ref.get("g_t"), "gather_qmm transpose");
      using gn = gather_qmm(x, ...qa(q8), { rhs_indices: rhs, transpose: false, group_size: 32, bits: 8 });
      expectExact(gn, ref.get("g_n"), "gather_qmm no transpose");
      using gs = gather_qmm(x, ...qa(q4), { rhs_indices: rhsSorted, group_size: 64, bits: 4, sorted_indices: true });
      expectExact(gs, ref.get("g_s"), "gather_qmm sorted");
      using gl = gather_qmm(x, ...qa(q4), { lhs_indices: lhs, rhs_indices: rhs, group_size: 64, bits: 4 });
      expectExact(gl, ref.get("g_l"), "gather_qmm lhs+rhs");
      using wT = swapaxes(w, -1, -2);
      using mm = gather_mm(x, wT, { rhs_indices: rhs });
      expectExact(mm, ref.get("mm"), "gather_mm");
      using mms = gather_mm(x, wn, { rhs_indices: rhsSorted, sorted_indices: true });
      expectExact(mms, ref.get("mm_s"), "gather_mm sorted");
      using mml = gather_mm(x, wn, { lhs_indices: lhs, rhs_indices: rhs });
      expectExact(mml, ref.get("mm_l"), "gather_mm lhs+rhs");
    });
  });
});

describe("quantized op errors name the op, shapes and dtypes", () => {
  test("group size not dividing the last dim, unsupported bits, unknown mode, shape mismatch", () => {
    using w = randn([4, 48], 20);
    expect(() => quantize(w, { group_size: 32, bits: 4 })).toThrow(
      /^quantize\(array\(shape=\[4, 48\], dtype=float32\), group_size=32, bits=4, mode=affine\): .*divisible by the quantization group size 32/,
    );
    using w64 = randn([8, 64], 21);
    expect(() => quantize(w64, { bits: 7 })).toThrow(/quantize\(array\(shape=\[8, 64\], dtype=float32\).*bits 7 is not supported/);
    expect(() => quantize(w64, { mode: "int4" as QuantMode })).toThrow(/quantize: unknown quantization mode 'int4'/);
    expect(() => quantize(w64, { group_size: -3 })).toThrow(/group_size must be a non-negative integer/);
    using x = randn([2, 48], 22);
    using q = QuantizedTensor.quantize(w64, { group_size: 64, bits: 4 });
    expect(() => q.matmul(x)).toThrow(
      /^quantized_matmul\(array\(shape=\[2, 48\], dtype=float32\), array\(shape=\[8, 8\], dtype=uint32\), array\(shape=\[8, 1\], dtype=float32\), array\(shape=\[8, 1\], dtype=float32\), transpose=true.*does not match/,
    );
    const before = memory.liveHandles();
    expect(() => quantize(w, { group_size: 32 })).toThrow();
    expect(memory.liveHandles()).toBe(before);
  });
});
