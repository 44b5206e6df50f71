// The exact-order matvec (mlxb_qmv_exact): its CUDA body emulated on this CPU against a model of
// MLX's CUDA qmv arithmetic written from MLX's SASS (tools/kernels/check_cuda_kernels.py, zero
// tolerance); bad inputs refused before any path; and, where CUDA is live, bit equality with
// MLX's own quantized_matmul (the test that decides whether anything may route calls to it).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, test } from "vitest";
import { type MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { oraclePython } from "../../../tools/oracle/oracle.ts";
import { astype } from "../src/elementwise.ts";
import { gpu_backend } from "../src/kernels/kernel.ts";
import { qmv_exact, qmv_exact_kernel } from "../src/kernels/qmv-exact.ts";
import { quantized_matmul } from "../src/quantized.ts";
import { expectExact, quantizedInputs, randn } from "./seeded-inputs.ts";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));

const inputs = (lead: number[], n: number, k: number, gs: number, seed: number, bits = 4): MlxArray[] =>
  quantizedInputs(lead, n, k, bits, gs, "bfloat16", seed);
const dispose = (xs: MlxArray[]) => xs.forEach((a) => a.dispose());

describe("mlxb_qmv_exact", () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-qmv-exact-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test.runIf(process.platform === "linux")(
    "the CUDA body, emulated, equals the model of MLX's CUDA arithmetic bit for bit (4-bit and 8-bit, 1-8 chunks in flight)",
    () => {
      const sources = join(dir, "kernel-sources.json");
      const exp = Bun.spawnSync([process.execPath, join(ROOT, "tools/kernels/export-sources.ts"), sources], { cwd: ROOT, stderr: "pipe" });
      expect(exp.exitCode, exp.stderr.toString()).toBe(0);
      const r = Bun.spawnSync([oraclePython(), join(ROOT, "tools/kernels/check_cuda_kernels.py"), sources, "--emulate", "--only", "mlxb_qmv_exact"], {
        cwd: ROOT,
        stdout: "pipe",
        stderr: "pipe",
      });
      const out = r.stdout.toString();
      const bad = out.split("\n").filter((l) => l.length > 0 && !/outside tolerance 0$/.test(l) && !l.startsWith("RESULT PASS"));
      const stderr = r.stderr.toString().slice(-2000);
      expect({ code: r.exitCode, bad, stderr }).toEqual({ code: 0, bad: [], stderr });
      expect(out).toMatch(/MLX CUDA model\): max \|diff\| 0, outside tolerance 0/);
      expect(out).toMatch(/RESULT PASS \(38 comparisons\)/);
      // The chunks in flight (template CH) move loads only: those cases must be bit-equal too.
      expect(out).toMatch(/N41 K2336 8-bit g32 CH3 \(MLX CUDA model\): max \|diff\| 0, outside tolerance 0/);
    },
    300_000,
  );

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
          const [o] = qmv_exact_kernel.run(xs, { stream: gpu, path: "cuda" });
          using out = o!;
          using ref = quantized_matmul(x!, w!, s!, b!, { group_size: gs, bits, transpose: true, stream: gpu });
          expectExact(out, ref, `mlxb_qmv_exact ${rows} rows N${n} K${k} ${bits}-bit g${gs}`);
        } finally {
          dispose(xs);
        }
      }
    },
  );
});
