// The quantized matvec kernel (packages/mlx-ops/src/kernels/qmv.ts): its reference against
// Python's mx.quantized_matmul, input validation, the launch heuristic, the decode setting
// (quantized_linear), and — where a GPU backend is live — the source against the reference.
// tools/kernels/check_cuda_kernels.py --emulate runs the CUDA body on a CPU (cuda_emu.h).
import { afterEach, describe, expect, test } from "vitest";
import { type Dtype, MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { abs, astype } from "../src/elementwise.ts";
import { max } from "../src/reduce.ts";
import { concatenate, reshape, slice } from "../src/shape.ts";
import * as kernels from "../src/kernels/index.ts";
import { quantize, quantized_matmul } from "../src/quantized.ts";
import { expectClose, expectExact, expectNoLeaks, quantizedInputs, randn } from "./seeded-inputs.ts";

const {
  cuda_arch,
  gpu_backend,
  qmv,
  qmv_kernel,
  qmv_config,
  qmv_launch_of,
  qmv_shape,
  quantized_linear,
  quantized_linear_stacked,
  set_fast_qmv,
  fast_qmv_enabled,
} = kernels;

const inputs = quantizedInputs;
const dispose = (xs: MlxArray[]) => xs.forEach((a) => a.dispose());

describe("qmv kernel", () => {
  afterEach(() => set_fast_qmv(undefined));

  test("reference path equals Python's mx.quantized_matmul(transpose=True), bit-exact", () => {
    const cases: [number[], number, number, number, number, Dtype][] = [
      [[1], 48, 256, 4, 64, "bfloat16"],
      [[2, 3], 20, 128, 8, 32, "float16"],
      [[5], 33, 512, 4, 128, "float32"],
      [[1, 1], 16, 256, 8, 64, "bfloat16"],
    ];
    const named: Record<string, MlxArray> = {};
    const exprs: Record<string, string> = {};
    const sets = cases.map(([lead, n, k, bits, gs, dt], i) => {
      const xs = inputs(lead, n, k, bits, gs, dt, 10 * i);
      ["x", "w", "s", "b"].forEach((p, j) => (named[`${p}${i}`] = xs[j]!));
      exprs[`c${i}`] = `mx.quantized_matmul(x${i}, w${i}, s${i}, b${i}, transpose=True, group_size=${gs}, bits=${bits})`;
      return xs;
    });
    using ref = oracle(named, exprs);
    using cpu = Stream.default("cpu");
    try {
      expectNoLeaks(() => {
        sets.forEach((xs, i) => {
          const [o] = qmv_kernel.run(xs, { stream: cpu, path: "reference" });
          using out = o!;
          expect(out.shape).toEqual([...cases[i]![0], cases[i]![1]]);
          expectExact(out, ref.get(`c${i}`), `qmv reference case ${i}`);
        });
      });
    } finally {
      sets.forEach(dispose);
    }
  });

  test("shapes, bits and group size follow from the inputs; bad inputs are refused before any path", () => {
    const xs = inputs([3], 40, 256, 4, 64, "bfloat16", 1);
    const [x, w, s, b] = xs as [MlxArray, MlxArray, MlxArray, MlxArray];
    try {
      expect(qmv_shape(xs)).toEqual({ M: 3, N: 40, K: 256, bits: 4, group_size: 64 });
      using x2 = randn([3, 384], 2, "bfloat16");
      expect(() => qmv(x2, w, s, b)).toThrow(/^kernel mlxb_qmv\(.*\): w .* holds 2.67 bits per value for K = 384; the kernel reads 4, 8/);
      // Shapes that read as another bit width: refused when the caller says which it means.
      using x8 = randn([3, 128], 2, "bfloat16");
      expect(() => qmv(x8, w, s, b, { bits: 4 })).toThrow(/holds 8 bits per value, not 4/);
      expect(() => qmv(x, w, s, b, { bits: 4, group_size: 32 })).toThrow(/group size 64, not 32/);
      using xi = MlxArray.fromNumbers([1, 2], [2], "int32");
      expect(() => qmv(xi, w, s, b)).toThrow(/x must be floating point/);
      using x3 = randn([3, 512], 3, "bfloat16");
      using s3 = randn([40, 2], 4, "bfloat16");
      using w3 = MlxArray.fromNumbers(new Array(40 * 48).fill(0), [40, 48], "uint32");
      expect(() => qmv(x3, w3, s3, s3)).toThrow(/3 bits per value/);
      using sBad = randn([41, 4], 5, "bfloat16");
      expect(() => qmv(x, w, sBad, b)).toThrow(/do not match w/);
      const w2 = quantize(randn([8, 256], 6), { group_size: 32, bits: 2 }) as MlxArray[];
      try {
        expect(() => qmv(x, w2[0]!, w2[1]!, w2[2]!)).toThrow(/2 bits per value/);
      } finally {
        dispose(w2);
      }
      expect(() => qmv_kernel.run([x, w, s])).toThrow(/expected 4 inputs \(x, w, scales, biases\)/);
    } finally {
      dispose(xs);
    }
  });

  test("launch heuristic: fill the GPU, split K for small N, fewer rows per warp as M grows", () => {
    const c = (M: number, N: number, K: number, bits = 4) => qmv_config({ M, N, K, bits, group_size: 64 });
    expect(c(1, 15360, 3840)).toEqual({ MB: 1, RPW: 4, SPLIT: 4 }); // MLP gate/up: 120 chunks per row
    expect(c(1, 3840, 15360)).toEqual({ MB: 1, RPW: 4, SPLIT: 4 }); // MLP down: split K
    expect(c(1, 2048, 1536)).toEqual({ MB: 1, RPW: 4, SPLIT: 2 }); // 48 chunks
    expect(c(1, 262144, 3840)).toEqual({ MB: 1, RPW: 4, SPLIT: 4 }); // lm_head
    expect(c(1, 256, 256)).toEqual({ MB: 1, RPW: 4, SPLIT: 1 }); // 8 chunks
    expect(c(3, 100, 4096)).toEqual({ MB: 4, RPW: 4, SPLIT: 4 });
    expect(c(16, 100, 256, 8)).toEqual({ MB: 16, RPW: 2, SPLIT: 1 }); // 8-bit: 16 chunks
    expect(c(20, 100, 256).MB).toBe(16);
    const l = qmv_launch_of({ M: 20, N: 100, K: 256, bits: 4, group_size: 64 }, "bfloat16", { MB: 16, RPW: 2, SPLIT: 2 });
    expect(l.grid).toEqual([Math.ceil(100 / 4) * 128, 2, 1]);
    expect(l.threadgroup).toEqual([128, 1, 1]);
  });

  test("quantized_linear is mx.quantized_matmul wherever the kernel does not run (bit-exact), with any setting", () => {
    const xs = inputs([1, 1], 64, 256, 4, 64, "bfloat16", 7);
    const [x, w, s, b] = xs as [MlxArray, MlxArray, MlxArray, MlxArray];
    const old = process.env.MLX_BUN_FAST_QMV;
    delete process.env.MLX_BUN_FAST_QMV;
    try {
      using ref = quantized_matmul(x, w, s, b, { group_size: 64, bits: 4, transpose: true });
      for (const setting of ["auto", "on", "off", "exact", undefined] as const) {
        set_fast_qmv(setting);
        if (gpu_backend() === null) expect(fast_qmv_enabled()).toBe(false);
        if (setting === "off") expect(fast_qmv_enabled()).toBe(false);
        // The default takes the exact-order kernel on sm90 only, where it was checked bit for bit.
        if (setting === "auto" || setting === undefined) expect(fast_qmv_enabled()).toBe(gpu_backend() === "cuda" && cuda_arch() === 900);
        using cpu = Stream.default("cpu");
        using y = quantized_linear(x, w, s, b, { group_size: 64, bits: 4 }, cpu);
        expectExact(y, ref, `quantized_linear on a CPU stream, setting ${setting}`);
        if (gpu_backend() === null) {
          using y2 = quantized_linear(x, w, s, b, { group_size: 64, bits: 4 });
          expectExact(y2, ref, `quantized_linear, setting ${setting}`);
        }
      }
      process.env.MLX_BUN_FAST_QMV = "maybe";
      set_fast_qmv(undefined);
      expect(() => fast_qmv_enabled()).toThrow(/MLX_BUN_FAST_QMV=maybe/);
    } finally {
      if (old === undefined) delete process.env.MLX_BUN_FAST_QMV;
      else process.env.MLX_BUN_FAST_QMV = old;
      dispose(xs);
    }
  });

  test("the CUDA and Metal paths reach MLX through the native entry points (refused on a CPU-only build)", () => {
    if (gpu_backend() !== null) return;
    const xs = inputs([2], 16, 128, 8, 32, "float16", 8);
    try {
      expectNoLeaks(() => {
        expect(() => qmv_kernel.run(xs, { environment: { gpu_backend: "metal", device: "gpu" } })).toThrow(/No Metal back-end/);
        expect(() => qmv_kernel.run(xs, { environment: { gpu_backend: "cuda", device: "gpu" } })).toThrow(/No CUDA back-end/);
        // The prepared launch (quantized_linear's per-shape cache) marshals the same call.
        const p = qmv_kernel.prepare(qmv_kernel.spec.launch(xs));
        expect(p.n_tmpl).toBe(8);
        expect(Array.from(p.values!).slice(1)).toEqual([8, 32, 128, 16, 2, 4, 1]); // BITS GS K N MB RPW SPLIT
        expect(() => qmv_kernel.runPrepared("metal", xs, p)).toThrow(/^kernel mlxb_qmv \(metal\)\(.*\): .*No Metal back-end/);
      });
    } finally {
      dispose(xs);
    }
  });

  // The source accumulates in float32 and rounds once; compare with the reference evaluated on
  // float32 copies (x, scales, biases) and rounded to the dtype: one ulp of the dtype, plus an
  // absolute 1e-5 · max|ref| for outputs near zero (float32 sums in another order).
  const RTOL: Record<string, number> = { float32: 1e-5, bfloat16: 2 ** -7, float16: 2 ** -10 };
  test.skipIf(gpu_backend() === null)("on the GPU: the live backend's source equals the reference", () => {
    const backend = gpu_backend()!;
    using gpu = Stream.default("gpu");
    const shapes: [number[], number, number, number, number][] = [
      [[1], 300, 1024, 4, 64],
      [[1, 1], 129, 4096, 4, 32],
      [[3], 64, 2048, 8, 128],
      [[2, 4], 40, 512, 4, 128],
      [[16], 70, 1536, 8, 64],
      [[21], 33, 256, 4, 64],
    ];
    for (const dt of ["bfloat16", "float16", "float32"] as Dtype[]) {
      for (const [lead, n, k, bits, gs] of shapes) {
        const xs = inputs(lead, n, k, bits, gs, dt, n + k);
        try {
          const [o] = qmv_kernel.run(xs, { stream: gpu, path: backend });
          using out = o!;
          const f32 = [astype(xs[0]!, "float32"), xs[1]!.retain(), astype(xs[2]!, "float32"), astype(xs[3]!, "float32")];
          const [r] = qmv_kernel.run(f32, { stream: gpu, path: "reference" });
          dispose(f32);
          using r32 = r!;
          using rr = astype(r32, dt);
          using a = abs(r32);
          using mxa = max(a);
          const scale = Math.max(1, mxa.item());
          expectClose(out, rr, { atol: 1e-5 * scale, rtol: RTOL[dt]! }, `qmv ${backend} ${dt} x[${lead}] N${n} K${k} ${bits}-bit g${gs}`);
        } finally {
          dispose(xs);
        }
      }
    }
  });

  test.skipIf(gpu_backend() !== "cuda")("on CUDA, setting exact: quantized_linear equals MLX's op bit for bit where it takes the kernel, and elsewhere", () => {
    set_fast_qmv("exact");
    expect(fast_qmv_enabled()).toBe(true);
    // Fewer than 8 rows, N past 16384 included, 4 and 8 bits (the kernel: MLX's qmv), 8 rows (MLX's op).
    for (const [lead, n, k, bits] of [
      [[1, 1], 4096, 3840, 4],
      [[1], 2048, 1536, 4],
      [[2], 512, 1024, 4],
      [[7, 1], 1024, 1536, 4],
      [[8, 1], 1024, 1536, 4],
      [[1], 512, 1024, 8],
      [[3, 1], 2048, 1536, 8],
      [[8, 1], 1024, 1536, 8],
      [[1], 16512, 256, 4],
    ] as const) {
      const xs = inputs([...lead], n, k, bits, 64, "bfloat16", n + k);
      try {
        const [x, w, s, b] = xs;
        using y = quantized_linear(x!, w!, s!, b!, { group_size: 64, bits });
        using ref = quantized_matmul(x!, w!, s!, b!, { group_size: 64, bits, transpose: true });
        expectExact(y, ref, `quantized_linear exact x[${lead}] N${n} K${k} ${bits}-bit`);
      } finally {
        dispose(xs);
      }
    }
  });

  test("quantized_linear_stacked declines (null) wherever the exact-order kernel is not taken, with any setting", () => {
    // Two 8,200-row parts: a stack past MLX's qmv bound of 16384 rows, each part within it.
    const xs = inputs([1], 16400, 256, 4, 64, "bfloat16", 11);
    try {
      const [x, w, s, b] = xs;
      const q = { group_size: 64, bits: 4 };
      const exactHere = gpu_backend() === "cuda";
      for (const setting of ["off", "on", "exact"] as const) {
        set_fast_qmv(setting);
        using y = quantized_linear_stacked(x!, w!, s!, b!, q, 8200) ?? undefined;
        expect(y !== undefined, `setting ${setting}`).toBe(exactHere && setting === "exact");
      }
      set_fast_qmv("exact");
      // 8 rows or no biases: MLX's op would not run its qmv.
      expect(quantized_linear_stacked(x!, w!, s!, undefined, q, 8200)).toBeNull();
      using x8 = concatenate([x!, x!, x!, x!, x!, x!, x!, x!], 0);
      expect(quantized_linear_stacked(x8, w!, s!, b!, q, 8200)).toBeNull();
      // Parts past 16384 rows are MLX's qmv too while the group size is below K (sm90 runs its
      // qmm_sm90 only for group size ≥ K), not with one group a row.
      expect(quantized_linear_stacked(x!, w!, s!, b!, q, 16400) !== null).toBe(exactHere);
      const one = inputs([1], 16400, 64, 4, 64, "bfloat16", 12);
      try {
        expect(quantized_linear_stacked(one[0]!, one[1]!, one[2]!, one[3]!, q, 16400)).toBeNull();
      } finally {
        dispose(one);
      }
    } finally {
      dispose(xs);
    }
  });

  test.skipIf(gpu_backend() !== "cuda")("on CUDA, setting exact: quantized_linear_stacked equals MLX's op on each part, side by side, bit for bit", () => {
    set_fast_qmv("exact");
    const q = { group_size: 64, bits: 4 };
    for (const [parts, k] of [
      [[15360, 15360], 3840],
      [[12288, 12288], 1536],
    ] as const) {
      const n = parts[0] + parts[1];
      const xs = inputs([1, 1], n, k, 4, 64, "bfloat16", n + k);
      try {
        const [x, w, s, b] = xs;
        using y = quantized_linear_stacked(x!, w!, s!, b!, q, parts[0]);
        expect(y).not.toBeNull();
        const refs = [0, parts[0]].map((at, i) => {
          const rows = (a: MlxArray) => slice(a, [at, 0], [at + parts[i]!, a.shape[1]!]);
          using wi = rows(w!);
          using si = rows(s!);
          using bi = rows(b!);
          return quantized_matmul(x!, wi, si, bi, { ...q, transpose: true });
        });
        using ref = concatenate(refs, -1);
        dispose(refs);
        expectExact(y!, ref, `quantized_linear_stacked ${parts.join("+")} K${k}`);
      } finally {
        dispose(xs);
      }
    }
  });

  test.skipIf(gpu_backend() !== "cuda")("on CUDA: batched decode rows ([B, 1, K]) give MLX's op's bits under every setting that folds them", () => {
    for (const setting of ["auto", "exact", "off"] as const) {
      set_fast_qmv(setting);
      for (const [b, n, k, bits] of [
        [2, 4096, 3840, 4],
        [16, 15360, 3840, 4],
        [16, 3840, 15360, 4],
        [5, 2048, 1536, 8],
      ] as const) {
        const xs = inputs([b, 1], n, k, bits, 64, "bfloat16", b + n + k);
        try {
          const [x, w, s, bs] = xs;
          using y = quantized_linear(x!, w!, s!, bs!, { group_size: 64, bits });
          using ref = quantized_matmul(x!, w!, s!, bs!, { group_size: 64, bits, transpose: true });
          expect(y.shape).toEqual([b, 1, n]);
          expectExact(y, ref, `${setting}: quantized_linear x[${b}, 1, ${k}] N${n} ${bits}-bit`);
        } finally {
          dispose(xs);
        }
      }
    }
  });

  test.skipIf(gpu_backend() === null)("on the GPU: quantized_linear's keyed launches keep each call's shape (one row as [1, K] and [1, 1, K])", () => {
    set_fast_qmv("on");
    const xs = inputs([1, 1], 129, 512, 4, 64, "bfloat16", 7);
    try {
      const [x3, w, s, b] = xs;
      const q = { group_size: 64, bits: 4 };
      using ref = quantized_linear(x3!, w!, s!, b!, q);
      for (const shape of [
        [1, 512],
        [1, 1, 512],
        [1, 512],
      ]) {
        using x = reshape(x3!, shape);
        using y = quantized_linear(x, w!, s!, b!, q);
        expect(y.shape).toEqual([...shape.slice(0, -1), 129]);
        using flat = reshape(y, [129]);
        using want = reshape(ref, [129]);
        expectExact(flat, want, `quantized_linear x[${shape}]`);
      }
    } finally {
      dispose(xs);
    }
  });
});
