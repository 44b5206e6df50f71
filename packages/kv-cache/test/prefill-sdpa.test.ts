// Prefill chunks over quantized caches: fast SDPA over the dequantized planes against the exact
// path (mlx-lm's quantized-matmul attention, tied to mlx-lm bit for bit by parity.test.ts) and
// against float32 attention over the same stored planes. docs/kv-prefill.md.
import { afterEach, describe, expect, test } from "vitest";
import { defaultDevice, type MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import {
  type Cache,
  KVCache,
  type KvCodec,
  type Mask,
  PREFILL_SDPA_MIN_QUERIES,
  RotatingKVCache,
  affineCodec,
  createCausalMask,
  kvPrefill,
  setKvPrefill,
  setPrefillScoreBudget,
  turboQuantCodec,
} from "../src/index.ts";
import { exactDiff, relativeError } from "../../../tools/oracle/compare.ts";

afterEach(() => {
  setKvPrefill(undefined);
  setPrefillScoreBudget(undefined);
});

function rand(shape: number[], seed: number, dtype: "bfloat16" | "float32"): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal(shape, { key });
  return mx.astype(x, dtype);
}

const HKV = 2;
const HQ = 8;

interface Case {
  name: string;
  codec: () => KvCodec;
  d: number;
}
const tq84 = turboQuantCodec({ kBits: 8, vBits: 4 });
const tq43 = turboQuantCodec({ kBits: 4, vBits: 3 });
const tq43eager = turboQuantCodec({ kBits: 4, vBits: 3, deferredV: false });
const cases: Case[] = [
  { name: "affine 8/64", codec: () => affineCodec(8, 64), d: 128 },
  { name: "affine 4/64", codec: () => affineCodec(4, 64), d: 256 },
  { name: "affine 4/32", codec: () => affineCodec(4, 32), d: 64 },
  { name: "turbo k8/v4", codec: () => tq84, d: 128 },
  { name: "turbo k4/v3", codec: () => tq43, d: 256 },
  { name: "turbo k4/v3, deferredV false", codec: () => tq43eager, d: 64 },
];

/**
 * Feeds a 40-token chunk, then attends a `L`-token chunk through the view with `mask`, once per
 * setting; returns the outputs (sdpa, exact) and the planes-as-stored float32 reference.
 */
function both(c: Case, dtype: "bfloat16" | "float32", L: number, maskFor: (cache: Cache, n: number) => Mask, rotating = false) {
  const run = (setting: "sdpa" | "exact"): MlxArray => {
    setKvPrefill(setting);
    using cache = rotating ? new RotatingKVCache(64, 0, c.codec()) : new KVCache(c.codec());
    using k0 = rand([1, HKV, 40, c.d], 1, dtype);
    using v0 = rand([1, HKV, 40, c.d], 2, dtype);
    cache.updateAndFetch(k0, v0).dispose();
    using k = rand([1, HKV, L, c.d], 3, dtype);
    using v = rand([1, HKV, L, c.d], 4, dtype);
    using q = rand([1, HQ, L, c.d], 5, dtype);
    const mask = maskFor(cache, L);
    try {
      using view = cache.updateAndFetch(k, v);
      return view.attend(q, 1 / Math.sqrt(c.d), mask).eval();
    } finally {
      if (mask !== null && mask !== "causal") mask.dispose();
    }
  };
  return { sdpa: run("sdpa"), exact: run("exact") };
}

const causal = (cache: Cache, n: number): Mask => cache.makeMask(n, null);
const windowed = (cache: Cache, n: number): Mask => cache.makeMask(n, 24);

describe("float32: the SDPA prefill path equals the exact path bit for bit on the CPU", () => {
  // MLX's CPU SDPA (its fallback: q·scale, matmul, where(mask, s, finfo.min), precise softmax,
  // matmul) is the exact path's arithmetic once the planes are dequantized; in float32 the two
  // agree to the bit. On a GPU (flash attention, other rounding) the bf16 test below applies.
  const onCpu = mx.kernels.gpu_backend() === null;
  for (const c of cases) {
    for (const [mname, maskFor] of [
      ["causal", causal],
      ["sliding window 24 (array mask)", windowed],
    ] as const) {
      test.runIf(onCpu)(`${c.name}, ${mname}`, () => {
        const { sdpa, exact } = both(c, "float32", 48, maskFor);
        using a = sdpa;
        using b = exact;
        expect(exactDiff(a, b)).toBeNull();
      });
    }
  }
  test.runIf(onCpu)("a rotating cache (the chunk longer than the window) and an additive mask", () => {
    const c = cases[0]!;
    {
      const { sdpa, exact } = both(c, "float32", 70, windowed, true);
      using a = sdpa;
      using b = exact;
      expect(exactDiff(a, b)).toBeNull();
    }
    const additive = (_: Cache, n: number): Mask => {
      using bm = createCausalMask(n, 40, 30);
      using z = mx.zeros([1], "float32");
      return mx.where(bm, z, -1e9);
    };
    const { sdpa, exact } = both(c, "float32", 40, additive);
    using a = sdpa;
    using b = exact;
    expect(exactDiff(a, b)).toBeNull();
  });
});

describe("chunks attended in blocks of query rows (the score budget)", () => {
  // Each row's softmax is its own, so blocks of rows give the rows of the whole chunk; a causal
  // block attends only the keys up to its last row (the rest are masked out, exp(-inf) = 0). On
  // the CPU in float32 the blocks reproduce the unblocked output bit for bit.
  const onCpu = mx.kernels.gpu_backend() === null;
  const additive = (_: Cache, n: number): Mask => {
    using bm = createCausalMask(n, 40, 30);
    using z = mx.zeros([1], "float32");
    return mx.where(bm, z, -1e9);
  };
  for (const c of [cases[0]!, cases[4]!]) {
    for (const [mname, maskFor, L, rotating] of [
      ["causal", causal, 48, false],
      ["sliding window 24 (array mask)", windowed, 48, false],
      ["additive mask", additive, 40, false],
      ["no mask", () => null, 48, false],
      ["rotating, chunk longer than the window", windowed, 70, true],
    ] as const) {
      test.runIf(onCpu)(`${c.name}, ${mname}`, () => {
        setPrefillScoreBudget(undefined);
        const whole = both(c, "float32", L, maskFor, rotating);
        // 7 rows a block: T = 40 + L keys (fewer when rotating), 8 heads, 4 bytes.
        setPrefillScoreBudget(7 * HQ * (40 + L) * 4);
        const blocked = both(c, "float32", L, maskFor, rotating);
        using a = whole.sdpa;
        using b = blocked.sdpa;
        whole.exact.dispose();
        blocked.exact.dispose();
        expect(exactDiff(b, a)).toBeNull();
      });
    }
  }
  test("the budget must be a positive integer of bytes", () => {
    expect(() => setPrefillScoreBudget(0)).toThrow(/positive integer of bytes, got 0/);
    expect(() => setPrefillScoreBudget(1.5)).toThrow(/got 1.5/);
  });
});

describe("bfloat16: no further from float32 attention over the stored planes than the exact path", () => {
  // Reference: float32 attention over the planes the view holds (scales, biases and σ widened to
  // float32). The exact path rounds the scores and the probabilities to bfloat16; SDPA does not,
  // so it is the closer of the two.
  for (const c of cases) {
    test(c.name, () => {
      const L = 64;
      const errs: Record<string, number> = {};
      for (const setting of ["sdpa", "exact"] as const) {
        setKvPrefill(setting);
        using cache = new KVCache(c.codec());
        using k0 = rand([1, HKV, 40, c.d], 1, "bfloat16");
        cache.updateAndFetch(k0, k0).dispose();
        using k = rand([1, HKV, L, c.d], 3, "bfloat16");
        using v = rand([1, HKV, L, c.d], 4, "bfloat16");
        using q = rand([1, HQ, L, c.d], 5, "bfloat16");
        using view = cache.updateAndFetch(k, v);
        using out = view.attend(q, 1 / Math.sqrt(c.d), "causal");
        // float32 reference over the same planes: the view of a float32 copy decodes to the
        // planes' values exactly (scales/biases/σ widened), attended on the float32 SDPA path.
        using ref = float32Reference(c, view.planes, q, "causal");
        using o32 = mx.astype(out, "float32");
        errs[setting] = relativeError(o32, ref);
      }
      console.log(
        `${c.name}: relative error vs float32 attention over the stored planes: sdpa ${errs.sdpa!.toExponential(2)}, exact ${errs.exact!.toExponential(2)}`,
      );
      expect(errs.sdpa!).toBeLessThan(0.01);
      // Measured on the CPU: 6.7e-3 to 7.8e-3 (SDPA) vs 1.4e-2 to 2.8e-2 (exact).
      expect(errs.sdpa!).toBeLessThanOrEqual(errs.exact!);
    });
  }
});

/** float32 attention over planes as stored: widen the float planes and attend with a float32 query. */
function float32Reference(c: Case, planes: readonly MlxArray[], q: MlxArray, mask: Mask): MlxArray {
  const codec = c.codec();
  const widened = planes.map((p) => (p.dtype === "bfloat16" ? mx.astype(p, "float32") : p.retain()));
  using view = codec.view(widened, planes[0]!.shape[2]!);
  using q32 = mx.astype(q, "float32");
  setKvPrefill("sdpa");
  return view.attend(q32, 1 / Math.sqrt(c.d), mask);
}

describe("which chunks take it", () => {
  test(`chunks shorter than ${PREFILL_SDPA_MIN_QUERIES} queries and decode steps keep the exact path`, () => {
    for (const L of [1, 2, PREFILL_SDPA_MIN_QUERIES - 1]) {
      for (const c of [cases[1]!, cases[4]!]) {
        const { sdpa, exact } = both(c, "bfloat16", L, causal);
        using a = sdpa;
        using b = exact;
        expect(exactDiff(a, b), `${c.name}, L ${L}`).toBeNull();
      }
    }
  });

  test(`bfloat16 chunks of ${PREFILL_SDPA_MIN_QUERIES} queries or more do take it (outputs differ in rounding)`, () => {
    const { sdpa, exact } = both(cases[0]!, "bfloat16", PREFILL_SDPA_MIN_QUERIES, causal);
    using a = sdpa;
    using b = exact;
    expect(exactDiff(a, b)).not.toBeNull();
    expect(relativeError(a, b)).toBeLessThan(0.05);
  });

  test("the setting: default sdpa on a GPU and exact on the CPU, MLX_BUN_KV_PREFILL, setKvPrefill; bad values are clear errors", () => {
    const prev = process.env.MLX_BUN_KV_PREFILL;
    try {
      delete process.env.MLX_BUN_KV_PREFILL;
      expect(kvPrefill()).toBe(defaultDevice() === "gpu" ? "sdpa" : "exact");
      process.env.MLX_BUN_KV_PREFILL = "sdpa";
      expect(kvPrefill()).toBe("sdpa");
      process.env.MLX_BUN_KV_PREFILL = "exact";
      expect(kvPrefill()).toBe("exact");
      setKvPrefill("sdpa");
      expect(kvPrefill()).toBe("sdpa");
      setKvPrefill(undefined);
      process.env.MLX_BUN_KV_PREFILL = "fast";
      expect(() => kvPrefill()).toThrow(/MLX_BUN_KV_PREFILL=fast: expected sdpa or exact/);
      expect(() => setKvPrefill("quantized" as never)).toThrow(/expected "sdpa" or "exact"/);
    } finally {
      if (prev === undefined) delete process.env.MLX_BUN_KV_PREFILL;
      else process.env.MLX_BUN_KV_PREFILL = prev;
    }
  });

  test("attention sinks stay refused by the quantized views", () => {
    for (const c of [cases[0]!, cases[3]!]) {
      using cache = new KVCache(c.codec());
      using k = rand([1, HKV, 40, c.d], 1, "bfloat16");
      using q = rand([1, HQ, 40, c.d], 2, "bfloat16");
      using sinks = mx.zeros([HQ], "bfloat16");
      using view = cache.updateAndFetch(k, k);
      expect(() => view.attend(q, 0.1, "causal", sinks)).toThrow(/does not support attention sinks/);
    }
  });
});

describe("memory", () => {
  test("prefill chunks on the SDPA path return active memory and handles to baseline", () => {
    const run = (): void => {
      for (const c of cases) {
        using cache = new KVCache(c.codec());
        for (const L of [40, 1, 33]) {
          using k = rand([1, HKV, L, c.d], L, "bfloat16");
          using q = rand([1, HQ, L, c.d], L + 1, "bfloat16");
          const m = cache.makeMask(L, 24);
          using view = cache.updateAndFetch(k, k);
          using o = view.attend(q, 0.1, m);
          o.eval();
          if (m !== null && m !== "causal") m.dispose();
        }
      }
    };
    run(); // warm the codecs' tables
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    run();
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });
});
