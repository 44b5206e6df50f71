// The fused exact norms (mlxb_qkv_norm_exact, mlxb_q_norm_exact, mlxb_residual_norm_exact,
// mlxb_residual_exact): their CUDA bodies emulated
// on this CPU against a model of MLX's CUDA RMSNorm written from its SASS
// (tools/kernels/check_cuda_kernels.py, zero tolerance), a mutation the model must catch, MLX's
// partition of a row, bad inputs refused, and, where CUDA is live, bit equality with MLX's own ops.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { type MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { add, astype, multiply } from "../src/elementwise.ts";
import { fast } from "../src/fast.ts";
import { gpu_backend } from "../src/kernels/kernel.ts";
import { cuda_arch } from "../src/kernels/cuda-arch.ts";
import {
  exact_norms_enabled,
  norm_partition,
  norm_threads,
  q_norm_exact,
  q_norm_fits,
  qkv_norm_exact,
  residual_exact,
  residual_norm_exact,
  set_exact_norms,
} from "../src/kernels/norm-exact.ts";
import { reshape, slice } from "../src/shape.ts";
import { emulatedCheck, exportKernelSources } from "./emulated-check.ts";
import { expectExact, randn } from "./seeded-inputs.ts";

const NAMES = "mlxb_qkv_norm_exact,mlxb_q_norm_exact,mlxb_residual_norm_exact,mlxb_residual_exact";

describe("fused exact norms", () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-norm-exact-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test.runIf(process.platform === "linux")(
    "the CUDA bodies, emulated, equal the model of MLX's CUDA RMSNorm bit for bit; a fused output rounding does not",
    () => {
      const sources = exportKernelSources(dir);
      const r = emulatedCheck(sources, NAMES);
      const bad = r.out.split("\n").filter((l) => l.length > 0 && !/outside tolerance 0$/.test(l) && !l.startsWith("RESULT PASS"));
      expect({ code: r.code, bad, stderr: r.stderr }).toEqual({ code: 0, bad: [], stderr: r.stderr });
      expect(r.out).toMatch(/RESULT PASS \(54 comparisons\)/);
      // MLX rounds x·r to bf16 before the weight multiply; one rounding of x·r·w must fail the model.
      const specs = JSON.parse(readFileSync(sources, "utf8")) as { name: string; cuda: { header: string } }[];
      const mutated = specs
        .filter((s) => NAMES.split(",").includes(s.name))
        .map((s) => {
          const header = s.cuda.header.replace(
            "return weighted ? __hmul_rn(w, y) : y;",
            "return weighted ? __float2bfloat16_rn(__bfloat162float(x) * r * __bfloat162float(w)) : y;",
          );
          expect(header).not.toBe(s.cuda.header);
          return { ...s, cuda: { ...s.cuda, header } };
        });
      const mutatedPath = join(dir, "mutated.json");
      writeFileSync(mutatedPath, JSON.stringify(mutated));
      const m = emulatedCheck(mutatedPath, NAMES);
      expect(m.code).toBe(1);
      expect(m.out).toMatch(/RESULT FAIL/);
    },
    300_000,
  );

  test("MLX's partition of a row (rms_norm.cu dispatch_num_chunks, bf16)", () => {
    expect(norm_partition(256)).toEqual({ block: 64, chunks: 1 });
    expect(norm_partition(512)).toEqual({ block: 64, chunks: 1 });
    expect(norm_partition(3840)).toEqual({ block: 128, chunks: 4 });
    expect(norm_partition(1152)).toEqual({ block: 128, chunks: 2 });
    expect(norm_partition(1536)).toEqual({ block: 64, chunks: 3 });
    expect(norm_partition(4096)).toEqual({ block: 128, chunks: 4 });
    expect(norm_partition(8192)).toEqual({ block: 128, chunks: 8 });
  });

  test("a block's threads: one value each, a multiple of 32, at least MLX's BLOCK, at most 512", () => {
    expect([40, 256, 300, 512, 1152, 3840, 8192].map(norm_threads)).toEqual([64, 256, 320, 512, 512, 512, 512]);
  });

  test("bad inputs are refused before any path runs, naming the kernel and what is wrong", () => {
    using x = randn([1, 1, 4 * 64], 1, "bfloat16");
    using w = randn([64], 2, "bfloat16");
    using wf = astype(w, "float32");
    const heads = { hq: 2, hk: 1, hv: 1, dim: 64, eps: 1e-6 };
    expect(() => qkv_norm_exact(x, wf, w, heads)).toThrow(/^kernel mlxb_qkv_norm_exact\(.*\): q and k norm weights must be \[64\] bfloat16/);
    expect(() => qkv_norm_exact(x, w, w, { ...heads, hq: 3 })).toThrow(/x .* must end in 320 = \(3 \+ 1 \+ 1\) heads × 64/);
    expect(() => qkv_norm_exact(x, w, w, { ...heads, hv: 2 })).toThrow(/hv = 2 must be 0 \(v is k\) or hk = 1/);
    using h = randn([1, 64], 3, "bfloat16");
    using y = randn([1, 32], 4, "bfloat16");
    expect(() => residual_norm_exact(h, y, w, w, null, 1e-6)).toThrow(/^kernel mlxb_residual_norm_exact\(.*\): h .* and y .* must have one shape$/);
    using s2 = randn([2], 5, "bfloat16");
    expect(() => residual_norm_exact(h, h, w, w, s2, 1e-6)).toThrow(/scale must be one bfloat16 value/);
    expect(() => q_norm_exact(x, w, { hq: 3, dim: 64, eps: 1e-6 })).toThrow(/^kernel mlxb_q_norm_exact\(.*\): x .* must end in 192 = 3 heads × 64/);
    using off = randn([2], 6, "bfloat16");
    const rope = { dims: 64, base: 1e4, scale: 1 };
    expect(q_norm_fits(x, w, { hq: 4, dim: 64, eps: 1e-6, rope }, { offset: off })).toBe(false);
    expect(() => q_norm_exact(x, w, { hq: 4, dim: 64, eps: 1e-6, rope }, { offset: off })).toThrow(/offset must be one int32/);
    expect(() => residual_exact(h, y, w, null, 1e-6)).toThrow(/^kernel mlxb_residual_exact\(.*\): h .* and y .* must have one shape$/);
    expect(() => residual_exact(h, h, wf, null, 1e-6)).toThrow(
      /^kernel mlxb_residual_exact\(.*\): norm weights must be \[64\] bfloat16, got array\(shape=\[64\], dtype=float32\)$/,
    );
    expect(() => set_exact_norms("maybe" as "on")).toThrow(/expected "auto", "on", "off" or "always"/);
  });

  test("the setting: by default on CUDA sm90 only, on where CUDA runs, off, always everywhere", () => {
    const old = process.env.MLX_BUN_EXACT_NORMS;
    try {
      delete process.env.MLX_BUN_EXACT_NORMS;
      set_exact_norms(undefined);
      expect(exact_norms_enabled()).toBe(gpu_backend() === "cuda" && cuda_arch() === 900);
      set_exact_norms("off");
      expect(exact_norms_enabled()).toBe(false);
      set_exact_norms("on");
      expect(exact_norms_enabled()).toBe(gpu_backend() === "cuda");
      set_exact_norms("always");
      expect(exact_norms_enabled()).toBe(true);
      set_exact_norms(undefined);
      process.env.MLX_BUN_EXACT_NORMS = "sometimes";
      expect(() => exact_norms_enabled()).toThrow(/MLX_BUN_EXACT_NORMS=sometimes: expected auto, on, off or always/);
    } finally {
      if (old === undefined) delete process.env.MLX_BUN_EXACT_NORMS;
      else process.env.MLX_BUN_EXACT_NORMS = old;
      set_exact_norms(undefined);
    }
  });

  test.skipIf(gpu_backend() !== "cuda")("on CUDA: equal to MLX's rms_norm / add / multiply bit for bit", () => {
    using gpu = Stream.default("gpu");
    const eps = 1e-6;
    for (const [hq, hk, hv, dim] of [
      [16, 8, 8, 256],
      [32, 4, 0, 512],
    ] as const) {
      using x = randn([1, 1, (hq + hk + hv) * dim], hq + dim, "bfloat16");
      using qw = randn([dim], 7, "bfloat16");
      using kw = randn([dim], 8, "bfloat16");
      const outs = qkv_norm_exact(x, qw, kw, { hq, hk, hv, dim, eps }, null, gpu);
      const part = (start: number, n: number): MlxArray => {
        using v = slice(x, [0, 0, start * dim], [1, 1, (start + n) * dim]);
        return reshape(v, [1, 1, n, dim]);
      };
      using q0 = part(0, hq);
      using k0 = part(hq, hk);
      using v0 = part(hv ? hq + hk : hq, hk);
      const refs = [fast.rms_norm(q0, qw, eps, gpu), fast.rms_norm(k0, kw, eps, gpu), fast.rms_norm(v0, null, eps, gpu)];
      try {
        outs.forEach((o, i) => expectExact(o, refs[i]!, `qkv ${hq}/${hk}/${hv} × ${dim} output ${i}`));
      } finally {
        for (const a of [...outs, ...refs]) a.dispose();
      }
    }
    for (const a of [3840, 1152, 5376]) {
      using h = randn([1, 1, a], a, "bfloat16");
      using y = randn([1, 1, a], a + 1, "bfloat16");
      using pw = randn([a], a + 2, "bfloat16");
      using nw = randn([a], a + 3, "bfloat16");
      using sc = randn([1], a + 4, "bfloat16");
      const [hOut, n] = residual_norm_exact(h, y, pw, nw, sc, eps, gpu);
      using hO = hOut;
      using nO = n;
      using yn = fast.rms_norm(y, pw, eps, gpu);
      using sum = add(h, yn, gpu);
      using scaled = multiply(sum, sc, gpu);
      using ref = fast.rms_norm(scaled, nw, eps, gpu);
      expectExact(hO, scaled, `residual ${a} sum`);
      expectExact(nO, ref, `residual ${a} norm`);
      using alone = residual_exact(h, y, pw, null, eps, gpu);
      expectExact(alone, sum, `residual ${a} sum without scale or next norm`);
    }
    using x = randn([2, 1, 8 * 256], 11, "bfloat16");
    using qw = randn([256], 12, "bfloat16");
    using q = q_norm_exact(x, qw, { hq: 8, dim: 256, eps }, null, gpu);
    using x4 = reshape(x, [2, 1, 8, 256]);
    using qRef = fast.rms_norm(x4, qw, eps, gpu);
    expectExact(q, qRef, "q heads 8 × 256");
  });
});
