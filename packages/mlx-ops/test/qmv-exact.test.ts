// The exact-order matvec (mlxb_qmv_exact): its CUDA body emulated on this CPU against a model of
// MLX's CUDA qmv arithmetic written from MLX's SASS (tools/kernels/check_cuda_kernels.py, zero
// tolerance); bad inputs refused before any path; and, where CUDA is live, bit equality with
// MLX's own quantized_matmul (the test that decides whether anything may route calls to it).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { type MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { astype } from "../src/elementwise.ts";
import { gpu_backend } from "../src/kernels/kernel.ts";
import { qmv_exact_geglu, quantized_linear_geglu, set_qmv_exact_geglu } from "../src/kernels/qmv.ts";
import { qmv_exact, qmv_exact_geglu_kernel, qmv_exact_kernel, qmv_exact_stage, set_qmv_exact_staged } from "../src/kernels/qmv-exact.ts";
import { quantized_matmul } from "../src/quantized.ts";
import { emulatedCheck, exportKernelSources } from "./emulated-check.ts";
import { expectExact, quantizedInputs, randn } from "./seeded-inputs.ts";

const inputs = (lead: number[], n: number, k: number, gs: number, seed: number, bits = 4): MlxArray[] =>
  quantizedInputs(lead, n, k, bits, gs, "bfloat16", seed);
const dispose = (xs: MlxArray[]) => xs.forEach((a) => a.dispose());

describe("mlxb_qmv_exact", () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-qmv-exact-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test.runIf(process.platform === "linux")(
    "the CUDA body, emulated, equals the model of MLX's CUDA arithmetic bit for bit (4-bit and 8-bit, 1-8 chunks in flight, staged)",
    () => {
      const { code, out, stderr } = emulatedCheck(exportKernelSources(dir), "mlxb_qmv_exact");
      const bad = out.split("\n").filter((l) => l.length > 0 && !/outside tolerance 0$/.test(l) && !l.startsWith("RESULT PASS"));
      expect({ code, bad, stderr }).toEqual({ code: 0, bad: [], stderr });
      expect(out).toMatch(/MLX CUDA model\): max \|diff\| 0, outside tolerance 0/);
      expect(out).toMatch(/RESULT PASS \(54 comparisons\)/);
      // The chunks in flight (template CH) move loads only: those cases must be bit-equal too.
      expect(out).toMatch(/N41 K2336 8-bit g32 CH3 \(MLX CUDA model\): max \|diff\| 0, outside tolerance 0/);
      // So does the staged launch (x in shared memory, several rows of w a warp, loads across rows).
      expect(out).toMatch(/N41 K2304 4-bit g32 CH8 staged RPW8 \(MLX CUDA model\): max \|diff\| 0, outside tolerance 0/);
      expect(out).toMatch(/N12 K320 8-bit g64 CH4 staged RPW2 \(MLX CUDA model\): max \|diff\| 0, outside tolerance 0/);
    },
    300_000,
  );

  test.runIf(process.platform === "linux")(
    "the gate/up matvec with its GeGLU (mlxb_qmv_exact_geglu), emulated, equals the model op for op; a wrong pairing does not",
    () => {
      const sources = exportKernelSources(dir);
      const r = emulatedCheck(sources, "mlxb_qmv_exact_geglu");
      const bad = r.out.split("\n").filter((l) => l.length > 0 && !/outside tolerance 0$/.test(l) && !l.startsWith("RESULT PASS"));
      expect({ code: r.code, bad, stderr: r.stderr }).toEqual({ code: 0, bad: [], stderr: r.stderr });
      expect(r.out).toMatch(/RESULT PASS \(4 comparisons\)/);
      // The product of the gate's GeGLU with the gate instead of the up row must fail the model.
      const specs = JSON.parse(readFileSync(sources, "utf8")) as { name: string; cuda: { header: string } }[];
      const mutated = specs
        .filter((s) => s.name === "mlxb_qmv_exact_geglu")
        .map((s) => {
          const header = s.cuda.header.replace("return Multiply{}(gelu, up);", "return Multiply{}(gelu, x);");
          expect(header).not.toBe(s.cuda.header);
          return { ...s, cuda: { ...s.cuda, header } };
        });
      const mutatedPath = join(dir, "mutated-geglu.json");
      writeFileSync(mutatedPath, JSON.stringify(mutated));
      const m = emulatedCheck(mutatedPath, "mlxb_qmv_exact_geglu");
      expect(m.code).toBe(1);
      expect(m.out).toMatch(/RESULT FAIL/);
    },
    300_000,
  );

  test("the fused gate/up + GeGLU launch: off by default, its setting, and the stacks it refuses", () => {
    const saved = process.env.MLX_BUN_QMV_GEGLU;
    const xs = inputs([1], 16, 256, 64, 11);
    try {
      const [x, w, s, b] = xs;
      delete process.env.MLX_BUN_QMV_GEGLU;
      set_qmv_exact_geglu(undefined);
      expect(qmv_exact_geglu()).toBe(false);
      expect(quantized_linear_geglu(x!, w!, s!, b!, { group_size: 64, bits: 4 }, 8)).toBeNull();
      process.env.MLX_BUN_QMV_GEGLU = "maybe";
      set_qmv_exact_geglu(undefined);
      expect(() => qmv_exact_geglu()).toThrow("MLX_BUN_QMV_GEGLU=maybe: expected 0, 1, on or off");
      set_qmv_exact_geglu(true);
      // A part size that is not half the stack: refused (the caller runs the matvec and its GeGLU).
      expect(quantized_linear_geglu(x!, w!, s!, b!, { group_size: 64, bits: 4 }, 6)).toBeNull();
      const odd = inputs([1], 15, 256, 64, 12);
      try {
        expect(() => qmv_exact_geglu_kernel.run(odd)).toThrow(/w has 15 rows: a gate\/up stack needs as many up rows as gate rows/);
      } finally {
        dispose(odd);
      }
    } finally {
      if (saved === undefined) delete process.env.MLX_BUN_QMV_GEGLU;
      else process.env.MLX_BUN_QMV_GEGLU = saved;
      set_qmv_exact_geglu(undefined);
      dispose(xs);
    }
  });

  test("the staged launch's plan: one row of x that fits shared memory, rows a warp toward one wave of blocks", () => {
    expect(qmv_exact_stage(1, 15360, 3840, true)).toEqual({ xs: 1, rpw: 4 }); // 1,920 blocks of 8 rows → 480
    expect(qmv_exact_stage(1, 30720, 3840, true)).toEqual({ xs: 1, rpw: 8 });
    expect(qmv_exact_stage(1, 262144, 3840, true)).toEqual({ xs: 1, rpw: 8 }); // at most 8 rows a warp
    expect(qmv_exact_stage(1, 4096, 3840, true)).toEqual({ xs: 1, rpw: 1 }); // 512 blocks already
    expect(qmv_exact_stage(1, 3840, 15360, true)).toEqual({ xs: 1, rpw: 1 }); // x: 30 KB
    expect(qmv_exact_stage(1, 3840, 21504, true)).toEqual({ xs: 0, rpw: 1 }); // x: 42 KB, past 40 KB
    expect(qmv_exact_stage(3, 15360, 3840, true)).toEqual({ xs: 0, rpw: 1 }); // several rows of x a block
    expect(qmv_exact_stage(1, 15360, 3840, false)).toEqual({ xs: 0, rpw: 1 });
    const saved = process.env.MLX_BUN_QMV_STAGED;
    try {
      set_qmv_exact_staged(undefined);
      process.env.MLX_BUN_QMV_STAGED = "sometimes";
      expect(() => qmv_exact_stage(1, 15360, 3840)).toThrow("MLX_BUN_QMV_STAGED=sometimes: expected 0, 1, on or off");
      set_qmv_exact_staged(undefined);
      process.env.MLX_BUN_QMV_STAGED = "1";
      expect(qmv_exact_stage(1, 15360, 3840)).toEqual({ xs: 1, rpw: 4 });
      set_qmv_exact_staged(false);
      expect(qmv_exact_stage(1, 15360, 3840)).toEqual({ xs: 0, rpw: 1 });
    } finally {
      if (saved === undefined) delete process.env.MLX_BUN_QMV_STAGED;
      else process.env.MLX_BUN_QMV_STAGED = saved;
      set_qmv_exact_staged(undefined);
    }
  });

  test("bad inputs are refused before any path runs, naming the kernel and what is wrong", () => {
    const xs = inputs([1], 16, 256, 64, 3);
    try {
      const [x, w, s, b] = xs;
      using xf = astype(x!, "float16");
      expect(() => qmv_exact(xf, w!, s!, b!)).toThrow(/^kernel mlxb_qmv_exact\(.*\): x must be bfloat16, got float16$/);
      using x2 = randn([1, 512], 4, "bfloat16");
      expect(() => qmv_exact(x2, w!, s!, b!)).toThrow(/does not hold 512 4-bit or 8-bit values a row/);
      using sf = astype(s!, "float32");
      expect(() => qmv_exact(x!, w!, sf, b!)).toThrow(/scales and biases must be \[16, groups\] bfloat16/);
      expect(() => qmv_exact_kernel.run([x!, w!, s!])).toThrow(/expected 4 inputs/);
    } finally {
      dispose(xs);
    }
    const g16 = inputs([1], 8, 256, 32, 5);
    try {
      const [x, w] = g16;
      // Group 16 would be 16 scales per row of 256: not a group MLX's qmv instantiates.
      using s16 = randn([8, 16], 6, "bfloat16");
      using b16 = randn([8, 16], 7, "bfloat16");
      expect(() => qmv_exact(x!, w!, s16, b16)).toThrow(/group size 16 not one of 32, 64, 128/);
    } finally {
      dispose(g16);
    }
  });

  test.skipIf(gpu_backend() !== "cuda")(
    "on CUDA: equal to MLX's quantized_matmul bit for bit (1-7 rows, N past 16384, groups 32/64/128, residues of K, 4 and 8 bits)",
    () => {
      using gpu = Stream.default("gpu");
      for (const [rows, n, k, gs, bits] of [
        [1, 4096, 3840, 64, 4],
        [1, 2048, 3840, 64, 4],
        [1, 3840, 15360, 64, 4],
        [1, 1536, 6144, 32, 4],
        [1, 300, 1024, 128, 4],
        [1, 129, 640, 64, 4],
        [1, 262144, 1536, 64, 4],
        [3, 4096, 3840, 64, 4],
        [7, 2048, 1536, 64, 4],
        [1, 4096, 3840, 64, 8],
        [1, 1536, 6144, 32, 8],
        [1, 129, 640, 128, 8],
        [4, 2048, 1536, 64, 8],
      ] as const) {
        const xs = inputs([rows, 1], n, k, gs, n + k + rows, bits);
        try {
          const [x, w, s, b] = xs;
          using ref = quantized_matmul(x!, w!, s!, b!, { group_size: gs, bits, transpose: true, stream: gpu });
          // Both launches (the staged one takes one row of x); run, not runKeyed: each call launches afresh.
          for (const staged of [false, true]) {
            set_qmv_exact_staged(staged);
            const [o] = qmv_exact_kernel.run(xs, { stream: gpu, path: "cuda" });
            using out = o!;
            expectExact(out, ref, `mlxb_qmv_exact ${rows} rows N${n} K${k} ${bits}-bit g${gs}${staged ? " staged" : ""}`);
          }
        } finally {
          set_qmv_exact_staged(undefined);
          dispose(xs);
        }
      }
    },
  );
});
