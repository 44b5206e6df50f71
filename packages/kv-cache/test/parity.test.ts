import { describe, expect, test } from "vitest";
import { MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, KVCache, type Mask, RotatingKVCache, affineCodec } from "../src/index.ts";
import { type CacheStep, cacheOracle } from "../../../tools/oracle/oracle.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

// Parity is with mlx-lm's unfused algorithm; where a GPU backend is live, decode steps would
// take the fused kernels instead (tested against it in decode-kernels.test.ts).
process.env.MLX_BUN_KERNELS = "reference";
// Prefill chunks too run on the exact path (mlx-lm's quantized-matmul attention), not on SDPA over
// the dequantized planes (prefill-sdpa.test.ts ties that one to this path).
process.env.MLX_BUN_KV_PREFILL = "exact";

const B = 1;
const H = 2;
const HQ = 4;
const D = 64;

function rand(shape: number[], seed: number, dtype: "bfloat16" | "float32" = "bfloat16"): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal(shape, { key });
  return mx.astype(x, dtype);
}

/** Build the inputs of a script: one k/v/q triple per update with the given chunk length. */
function script(chunks: (number | { trim: number })[], window?: number): { inputs: Record<string, MlxArray>; steps: CacheStep[] } {
  const inputs: Record<string, MlxArray> = {};
  const steps: CacheStep[] = [];
  chunks.forEach((c, i) => {
    if (typeof c !== "number") {
      steps.push(c);
      return;
    }
    inputs[`k${i}`] = rand([B, H, c, D], 100 + i);
    inputs[`v${i}`] = rand([B, H, c, D], 200 + i);
    inputs[`q${i}`] = rand([B, HQ, c, D], 300 + i);
    steps.push({ k: `k${i}`, v: `v${i}`, q: `q${i}`, ...(window !== undefined ? { window } : {}) });
  });
  return { inputs, steps };
}

function maskKind(m: Mask): string {
  return m === null ? "none" : m === "causal" ? "causal" : "array";
}

/** Replay the steps on ours and compare every step with mlx-lm's record. */
function replay(
  cache: Cache,
  inputs: Record<string, MlxArray>,
  steps: CacheStep[],
  ref: ReturnType<typeof cacheOracle>,
  scale: number,
  planeNames: string[],
): void {
  steps.forEach((step, i) => {
    if ("trim" in step) {
      expect(cache.trim(Math.min(step.trim, cache.offset)), `step ${i} trimmed`).toBe(Number(ref.meta(`${i}.trimmed`)));
      expect(cache.offset).toBe(Number(ref.meta(`${i}.offset`)));
      return;
    }
    const k = inputs[step.k]!;
    const mask = cache.makeMask(k.shape[2]!, step.window ?? null);
    using view = cache.updateAndFetch(k, inputs[step.v]!);
    expect(cache.offset, `step ${i} offset`).toBe(Number(ref.meta(`${i}.offset`)));
    const refMask = ref.meta(`${i}.mask`)!;
    // mlx-lm materializes some masks that are exactly "causal"; compare values when kinds differ.
    if (maskKind(mask) === "array" || refMask === "array") {
      const ours = mask === "causal" ? null : (mask as MlxArray | null);
      if (ours && refMask === "array") expect(exactDiff(ours, ref.get(`${i}.mask`)!), `step ${i} mask`).toBeNull();
      else expect(`${maskKind(mask)}/${refMask}`, `step ${i} mask kind`).toBe("same");
    } else expect(maskKind(mask), `step ${i} mask`).toBe(refMask);
    view.planes.forEach((p, j) => {
      expect(exactDiff(p, ref.get(`${i}.${planeNames[j]}`)!), `step ${i} plane ${planeNames[j]}`).toBeNull();
    });
    using out = view.attend(inputs[step.q!]!, scale, mask);
    expect(exactDiff(out, ref.get(`${i}.attn`)!), `step ${i} attention`).toBeNull();
    if (mask !== null && mask !== "causal") mask.dispose();
  });
}

const SCALE = 1 / Math.sqrt(D);

describe("fetched K/V, offsets, masks and attention equal mlx-lm's exactly", () => {
  test("KVCache: prefill chunks of several sizes, decode steps, trims, regrowth past 256", () => {
    const { inputs, steps } = script([7, 1, 1, 250, 1, { trim: 5 }, 3, 1, 300, 1]);
    using ref = cacheOracle("KVCache", {}, inputs, steps, SCALE);
    using cache = new KVCache();
    replay(cache, inputs, steps, ref, SCALE, ["k", "v"]);
    for (const a of Object.values(inputs)) a.dispose();
  });

  test("RotatingKVCache: window wrap-around by single tokens and by multi-token chunks, keep tokens", () => {
    const { inputs, steps } = script([5, 1, 1, 1, 1, 1, 1, 20, 1, 1, 9, 1, { trim: 0 }, 1], 8);
    using ref = cacheOracle("RotatingKVCache", { max_size: 8, keep: 2 }, inputs, steps, SCALE);
    using cache = new RotatingKVCache(8, 2);
    replay(cache, inputs, steps, ref, SCALE, ["k", "v"]);
    for (const a of Object.values(inputs)) a.dispose();
  });

  test("RotatingKVCache with a window smaller than max size (decode masks roll)", () => {
    const { inputs, steps } = script([3, 1, 1, 1, 1, 1, 1, 1, 1], 4);
    using ref = cacheOracle("RotatingKVCache", { max_size: 6 }, inputs, steps, SCALE);
    using cache = new RotatingKVCache(6);
    replay(cache, inputs, steps, ref, SCALE, ["k", "v"]);
    for (const a of Object.values(inputs)) a.dispose();
  });

  for (const [bits, group] of [
    [8, 64],
    [4, 64],
    [4, 32],
  ] as const) {
    test(`QuantizedKVCache ${bits}-bit, group ${group}: planes and quantized attention`, () => {
      const { inputs, steps } = script([6, 1, 1, 260, { trim: 4 }, 2, 1]);
      using ref = cacheOracle("QuantizedKVCache", { bits, group_size: group }, inputs, steps, SCALE);
      using cache = new KVCache(affineCodec(bits, group));
      replay(cache, inputs, steps, ref, SCALE, ["k.0", "k.1", "k.2", "v.0", "v.1", "v.2"]);
      for (const a of Object.values(inputs)) a.dispose();
    });
  }
});

describe("memory", () => {
  test("a cache workload returns active memory and handles to baseline", () => {
    using warm = new KVCache();
    const k0 = rand([B, H, 3, D], 1);
    warm.updateAndFetch(k0, k0).dispose();
    k0.dispose();
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    {
      using c = new KVCache(affineCodec(4, 64));
      using r = new RotatingKVCache(16);
      for (let i = 0; i < 40; i++) {
        using k = rand([B, H, i % 5 === 0 ? 7 : 1, D], i);
        using q = rand([B, HQ, k.shape[2]!, D], i + 1);
        for (const cache of [c, r] as Cache[]) {
          const m = cache.makeMask(k.shape[2]!, null);
          using v = cache.updateAndFetch(k, k);
          using o = v.attend(q, SCALE, m);
          o.eval();
          if (m !== null && m !== "causal") m.dispose();
        }
      }
    }
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });
});
