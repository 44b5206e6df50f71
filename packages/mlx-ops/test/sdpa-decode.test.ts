// Decode attention at MLX's rounding points (sdpa_decode): its two CUDA bodies emulated on this CPU
// against MLX's composition summed in float32 and rounded at its points (tools/kernels/check_cuda_kernels.py:
// within one unit in the last place, at most 2% of values differing; all-float32 attention differs in ~45% of bf16 outputs), the
// reference path composing to MLX's attention bit for bit, and bad inputs refused with their shapes.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, test } from "vitest";
import { astype } from "../src/elementwise.ts";
import { fast } from "../src/fast.ts";
import { sdpa_decode, sdpa_decode_enabled, sdpa_decode_scores_kernel, sdpa_decode_values_kernel, set_sdpa_decode } from "../src/kernels/sdpa-decode.ts";
import { emulatedCheck, exportKernelSources } from "./emulated-check.ts";
import { expectExact, randn } from "./seeded-inputs.ts";

describe("sdpa_decode", () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-sdpa-decode-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  afterEach(() => set_sdpa_decode(undefined));

  test.runIf(process.platform === "linux")(
    "the CUDA bodies, emulated, keep MLX's rounding points (scores, probabilities, output) on the bench models' head layouts",
    () => {
      const { code, out, stderr } = emulatedCheck(exportKernelSources(dir), "mlxb_sdpa_decode_scores");
      expect({ code, stderr }).toEqual({ code: 0, stderr });
      expect(out).toMatch(/RESULT PASS \(12 comparisons\)/);
      // Sixteen query heads on one KV head of 512, and the key limit.
      expect(out).toMatch(/values B1 Hq16 Hkv1 D512 T100 bfloat16 \(MLX's softmax, p·v float32, rounded\): max \|diff\| 0/);
      expect(out).toMatch(/scores B1 Hq8 Hkv1 D256 T1024 bfloat16 \(q·kᵀ, float32, rounded\): \d+\.\d+% of values differ/);
    },
    300_000,
  );

  test("the reference path composes to MLX's attention bit for bit (GQA, a sliced cache, fp16)", () => {
    for (const [hq, hkv, d, t, dtype] of [
      [16, 8, 256, 77, "bfloat16"],
      [16, 1, 512, 100, "bfloat16"],
      [4, 2, 256, 33, "float16"],
    ] as const) {
      using q = astype(randn([1, hq, 1, d], 1), dtype);
      using kAll = astype(randn([1, hkv, t, d], 2), dtype);
      using v = astype(randn([1, hkv, t, d], 3), dtype);
      const [s] = sdpa_decode_scores_kernel.run([q, kAll]);
      using scores = s!;
      expect(scores.shape).toEqual([1, hq, 1024]);
      const [o] = sdpa_decode_values_kernel.run([scores, v]);
      using out = o!;
      using ref = fast.scaled_dot_product_attention(q, kAll, v, { scale: 1 });
      expectExact(out, ref, `Hq${hq} Hkv${hkv} D${d} T${t} ${dtype}`);
    }
  });

  test("off the CUDA path (here) it declines, and the caller composes", () => {
    using q = astype(randn([1, 4, 1, 256], 4), "bfloat16");
    using k = astype(randn([1, 2, 9, 256], 5), "bfloat16");
    set_sdpa_decode("on");
    expect(sdpa_decode_enabled()).toBe(false);
    expect(sdpa_decode(q, k, k, 1)).toBeNull();
  });

  test("bad inputs and settings are refused with what is wrong", () => {
    using q = astype(randn([1, 4, 1, 256], 6), "bfloat16");
    using k = astype(randn([1, 3, 9, 256], 7), "bfloat16");
    expect(() => sdpa_decode_scores_kernel.run([q, k])).toThrow(/query heads 4 are not a multiple of KV heads 3/);
    using long = astype(randn([1, 2, 1025, 256], 8), "bfloat16");
    expect(() => sdpa_decode_scores_kernel.run([q, long])).toThrow(/1025 keys \(the kernels take 1 to 1024\)/);
    using s = astype(randn([2, 4, 1024], 9), "bfloat16");
    using v = astype(randn([1, 2, 9, 256], 10), "bfloat16");
    expect(() => sdpa_decode_values_kernel.run([s, v])).toThrow(/scores \[B, Hq, ≥ T\] and values \[B, Hkv, T, D\] do not match/);
    expect(() => set_sdpa_decode("fast" as "on")).toThrow(/set_sdpa_decode: expected on, off, got fast/);
    const before = process.env.MLX_BUN_SDPA_DECODE;
    process.env.MLX_BUN_SDPA_DECODE = "yes";
    set_sdpa_decode(undefined);
    try {
      expect(() => sdpa_decode_enabled()).toThrow(/MLX_BUN_SDPA_DECODE=yes: expected on, off/);
    } finally {
      if (before === undefined) delete process.env.MLX_BUN_SDPA_DECODE;
      else process.env.MLX_BUN_SDPA_DECODE = before;
      set_sdpa_decode(undefined);
    }
  });
});
