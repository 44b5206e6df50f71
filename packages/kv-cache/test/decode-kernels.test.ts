// Fused decode-attention kernels (affine and TurboQuant): the two-pass reference composition
// against today's unfused attention, the packing layout the sources decode, the launch plan,
// the source paths driven down to MLX, and — where a GPU backend is live — each source against
// its reference.
import { describe, expect, test } from "vitest";
import { type Dtype, memory, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { KVCache, affineCodec, quantizedAttention, quantizedKeyAttention, turboQuantCodec, type Mask } from "../src/index.ts";
import { affineDecodeAttention, affineDecodeKernel, affineDecodeKey } from "../src/kernels/affine-decode.ts";
import { decodeCombineKernel } from "../src/kernels/decode-combine.ts";
import { denseDecode, denseDecodeAttention, denseDecodeKernel, denseDecodeKey, setDenseDecode } from "../src/kernels/dense-decode.ts";
import { DECODE_WARPS, decodeMask, decodePlan, type DecodePlan, decodeRunLength, scaledQueries } from "../src/kernels/decode-plan.ts";
import { affineTokenRegs, TURBO_VALUE_TOKEN_REGS } from "../src/kernels/decode-source.ts";
import { turboDecodeKernel, turboDecodeKey } from "../src/kernels/turbo-decode.ts";
import { turboValues } from "../src/kernels/turbo-values.ts";
import { closeDiff, exactDiff, relativeError as relErr } from "../../../tools/oracle/compare.ts";

const { gpu_backend } = mx.kernels;

function rand(shape: number[], seed: number, dtype: Dtype): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal(shape, { key });
  return mx.astype(x, dtype);
}

interface Case {
  b: number;
  hq: number;
  hkv: number;
  d: number;
  t: number;
  mask: "none" | "bool" | "additive";
}

// Head dims 64-512, GQA 1-8, contexts that are and are not multiples of a threadgroup's
// tokens (1, 33, 70, 300, 1100 with 32 KV heads in all: 64 tokens per warp), masks of each kind.
const CASES: Case[] = [
  { b: 1, hq: 4, hkv: 4, d: 64, t: 1, mask: "none" },
  { b: 2, hq: 8, hkv: 2, d: 128, t: 33, mask: "bool" },
  { b: 1, hq: 8, hkv: 1, d: 256, t: 300, mask: "additive" },
  { b: 4, hq: 8, hkv: 8, d: 64, t: 1100, mask: "bool" },
  { b: 1, hq: 8, hkv: 1, d: 512, t: 70, mask: "none" },
];

/** A decode mask as the batched caches make it: [B, 1, 1, T], row i hides its first 3i tokens (left padding). */
function makeMask(c: Case, dtype: Dtype): Mask {
  if (c.mask === "none") return null;
  const vals: number[] = [];
  for (let i = 0; i < c.b; i++) for (let j = 0; j < c.t; j++) vals.push(j >= Math.min(3 * i, c.t - 1) ? 1 : 0);
  using vis = MlxArray.fromNumbers(vals, [c.b, 1, 1, c.t], "bool");
  if (c.mask === "bool") return vis.retain();
  using add = mx.where(vis, 0, -1e9);
  return mx.astype(add, dtype);
}

/**
 * Attention in float32 over the decoded planes (MLX's fused SDPA): what both the unfused path
 * and the kernels approximate; qs is already scaled.
 */
function truth(qs: MlxArray, keys: MlxArray, values: MlxArray, mask: Mask): MlxArray {
  using q32 = mx.astype(qs, "float32");
  using m = mask !== null && mask !== "causal" && mask.dtype !== "bool" ? mx.astype(mask, "float32") : null;
  return mx.fast.scaled_dot_product_attention(q32, keys, values, { scale: 1, mask: m ?? mask });
}

/** bfloat16: the kernels round once, so they sit within an ulp of the float32 truth and never further from it than the unfused path. */
function expectAccurate(ref: MlxArray, unfused: MlxArray, exact: MlxArray, label: string): void {
  using typed = mx.astype(exact, ref.dtype);
  expect(closeDiff(ref, typed, { atol: 1e-6, rtol: 2 ** -7 }), label).toBeNull();
  expect(relErr(ref, exact), label).toBeLessThanOrEqual(relErr(unfused, exact));
}

/** The view's attention on the unfused path, whatever the backend. */
function attendUnfused(view: { attend: (q: MlxArray, s: number, m: Mask) => MlxArray }, q: MlxArray, scale: number, mask: Mask): MlxArray {
  process.env.MLX_BUN_KERNELS = "reference";
  try {
    return view.attend(q, scale, mask);
  } finally {
    delete process.env.MLX_BUN_KERNELS;
  }
}

/** The kernels' reference composition end to end: pass 1 then pass 2, both on the reference path. */
function twoPassReference(kernel: typeof affineDecodeKernel, inputs: MlxArray[]): MlxArray {
  const parts = kernel.run(inputs, { path: "reference" });
  try {
    return decodeCombineKernel.run([parts[0]!, parts[1]!, parts[2]!, inputs[0]!], { path: "reference" })[0]!;
  } finally {
    for (const p of parts) p.dispose();
  }
}

function withMask<R>(c: Case, dtype: Dtype, fn: (mask: Mask, kmask: MlxArray) => R): R {
  const mask = makeMask(c, dtype);
  const kmask = decodeMask(mask, c.b, c.t)!;
  try {
    return fn(mask, kmask);
  } finally {
    kmask.dispose();
    if (mask !== null && mask !== "causal") mask.dispose();
  }
}

describe("fused decode attention: the two-pass reference against the unfused path", () => {
  const SCALE = 0.125;
  for (const dtype of ["float32", "bfloat16"] as const) {
    for (const c of CASES) {
      for (const [bits, group] of [
        [8, 64],
        [4, 32],
        [4, 128],
      ] as const) {
        if (c.d % group) continue;
        test(`affine ${bits}-bit g${group}, ${dtype}, B${c.b} Hq${c.hq}/Hkv${c.hkv} D${c.d} T${c.t}, mask ${c.mask}`, () => {
          using k = rand([c.b, c.hkv, c.t, c.d], 1, dtype);
          using v = rand([c.b, c.hkv, c.t, c.d], 2, dtype);
          using q = rand([c.b, c.hq, 1, c.d], 3, dtype);
          using cache = new KVCache(affineCodec(bits, group));
          using view = cache.updateAndFetch(k, v); // planes are slices of the cache's buffers
          const [kw, ks, kb, vw, vs, vb] = view.planes as MlxArray[];
          withMask(c, dtype, (mask, kmask) => {
            using unfused = quantizedAttention(q, { w: kw!, scales: ks!, biases: kb! }, { w: vw!, scales: vs!, biases: vb! }, SCALE, mask, group, bits);
            using viewOut = view.attend(q, SCALE, mask);
            using qs = mx.multiply(q, SCALE);
            using ref = twoPassReference(affineDecodeKernel, [qs, kw!, ks!, kb!, vw!, vs!, vb!, kmask]);
            expect(ref.shape).toEqual(unfused.shape);
            expect(ref.dtype).toBe(dtype);
            // On this machine the view runs the unfused path: bit for bit what it always did.
            if (gpu_backend() === null) expect(closeDiff(viewOut, unfused, { atol: 0, rtol: 0 })).toBeNull();
            // On a GPU the view's decode step is the fused kernels: the reference's math, rounded once.
            else expect(closeDiff(viewOut, ref, dtype === "float32" ? { atol: 1e-5, rtol: 1e-4 } : { atol: 1e-5, rtol: 2 ** -7 })).toBeNull();
            // float32: the same math in another order. bfloat16: the unfused path rounds scores,
            // probabilities and output to bfloat16; the kernels round once.
            if (dtype === "float32") expect(closeDiff(ref, unfused, { atol: 2e-6, rtol: 1e-5 })).toBeNull();
            else {
              const deq = (w: MlxArray, sc: MlxArray, bi: MlxArray): MlxArray => {
                using s32 = mx.astype(sc, "float32");
                using b32 = mx.astype(bi, "float32");
                return mx.dequantize(w, s32, b32, { group_size: group, bits });
              };
              using k32 = deq(kw!, ks!, kb!);
              using v32 = deq(vw!, vs!, vb!);
              using exact = truth(qs, k32, v32, mask);
              expectAccurate(ref, unfused, exact, "affine");
            }
          });
        });
      }
    }
  }

  for (const dtype of ["float32", "bfloat16"] as const) {
    for (const [c, kBits, vBits] of [
      [CASES[0]!, 8, 4],
      [CASES[1]!, 4, 3],
      [CASES[2]!, 4, 2],
      [CASES[3]!, 8, 3],
      [CASES[4]!, 2, 4],
    ] as const) {
      test(`TurboQuant k${kBits}/v${vBits}, ${dtype}, B${c.b} Hq${c.hq}/Hkv${c.hkv} D${c.d} T${c.t}, mask ${c.mask}`, () => {
        using k = rand([c.b, c.hkv, c.t, c.d], 4, dtype);
        using v = rand([c.b, c.hkv, c.t, c.d], 5, dtype);
        using q = rand([c.b, c.hq, 1, c.d], 6, dtype);
        const codec = turboQuantCodec({ kBits, vBits, seed: 3 });
        try {
          using cache = new KVCache(codec);
          using view = cache.updateAndFetch(k, v);
          const [kw, ks, kb, vc, vs] = view.planes as MlxArray[];
          const book = mx.turboquant.lloyd_max_codebook(vBits);
          try {
            withMask(c, dtype, (mask, kmask) => {
              using viewOut = view.attend(q, SCALE, mask); // CPU: the unfused deferred-V path
              using qs = mx.multiply(q, SCALE);
              using rotated = twoPassReference(turboDecodeKernel, [qs, kw!, ks!, kb!, vc!, vs!, book.centroids, kmask]);
              using ref = codec.unrotate(rotated, c.d, dtype);
              // On a GPU the view is the fused kernels (the same un-rotation of nearly the same output).
              if (gpu_backend() !== null) expect(relErr(viewOut, ref)).toBeLessThan(2 ** -7);
              using unfused = gpu_backend() === null ? viewOut.retain() : attendUnfused(view, q, SCALE, mask);
              expect(ref.shape).toEqual(unfused.shape);
              if (dtype === "float32") expect(closeDiff(ref, unfused, { atol: 2e-6, rtol: 1e-5 })).toBeNull();
              else {
                // In the rotated space (the un-rotation rounds to bfloat16 on both paths alike).
                using s32 = mx.astype(ks!, "float32");
                using b32 = mx.astype(kb!, "float32");
                using k32 = mx.dequantize(kw!, s32, b32, { group_size: 32, bits: kBits });
                using vr = turboValues(vc!, vs!, book.centroids);
                using v32 = mx.astype(vr, "float32");
                using exact = truth(qs, k32, v32, mask);
                // The unfused path before its un-rotation (turboquant.ts, deferred V).
                using unfusedRot = quantizedKeyAttention(q, { w: kw!, scales: ks!, biases: kb! }, SCALE, mask, 32, kBits, (probs, nRep) => {
                  using vv = nRep > 1 ? mx.expand_dims(vr, -3) : vr.retain();
                  using pv = mx.astype(probs, vv.dtype);
                  return mx.matmul(pv, vv);
                });
                expectAccurate(rotated, unfusedRot, exact, "turbo");
              }
            });
          } finally {
            book.centroids.dispose();
            book.boundaries.dispose();
          }
        } finally {
          codec.dispose();
        }
      });
    }
  }
});

describe("split-K decode attention over a plain cache (opt-in)", () => {
  const SCALE = 0.125;
  for (const dtype of ["float32", "bfloat16"] as const) {
    for (const c of CASES) {
      test(`${dtype}, B${c.b} Hq${c.hq}/Hkv${c.hkv} D${c.d} T${c.t}, mask ${c.mask}: the two-pass reference against fast SDPA`, () => {
        using k = rand([c.b, c.hkv, c.t, c.d], 11, dtype);
        using v = rand([c.b, c.hkv, c.t, c.d], 12, dtype);
        using q = rand([c.b, c.hq, 1, c.d], 13, dtype);
        using cache = new KVCache();
        using view = cache.updateAndFetch(k, v); // slices of the cache's buffers
        const [kp, vp] = view.planes as MlxArray[];
        withMask(c, dtype, (mask, kmask) => {
          using sdpa = mx.fast.scaled_dot_product_attention(q, kp!, vp!, { scale: SCALE, mask });
          setDenseDecode("kernel");
          try {
            using viewOut = view.attend(q, SCALE, mask);
            using qs = mx.multiply(q, SCALE);
            using ref = twoPassReference(denseDecodeKernel, [qs, kp!, vp!, kmask]);
            expect(ref.shape).toEqual(sdpa.shape);
            expect(ref.dtype).toBe(dtype);
            // On a CPU the kernel declines and the view is fast SDPA, bit for bit.
            if (gpu_backend() === null) expect(closeDiff(viewOut, sdpa, { atol: 0, rtol: 0 })).toBeNull();
            else expect(closeDiff(viewOut, ref, dtype === "float32" ? { atol: 1e-5, rtol: 1e-4 } : { atol: 1e-5, rtol: 2 ** -7 })).toBeNull();
            using k32 = mx.astype(kp!, "float32");
            using v32 = mx.astype(vp!, "float32");
            using exact = truth(qs, k32, v32, mask);
            if (dtype === "float32") expect(closeDiff(ref, sdpa, { atol: 2e-6, rtol: 1e-5 })).toBeNull();
            else {
              using typed = mx.astype(exact, dtype);
              expect(closeDiff(ref, typed, { atol: 1e-6, rtol: 2 ** -7 })).toBeNull();
            }
          } finally {
            setDenseDecode(undefined);
          }
        });
      });
    }
  }

  test("the setting: sdpa by default, MLX_BUN_DENSE_DECODE and setDenseDecode choose, bad values named", () => {
    expect(denseDecode()).toBe("sdpa");
    process.env.MLX_BUN_DENSE_DECODE = "kernel";
    try {
      expect(denseDecode()).toBe("kernel");
      setDenseDecode("sdpa");
      expect(denseDecode()).toBe("sdpa");
      setDenseDecode(undefined);
      process.env.MLX_BUN_DENSE_DECODE = "fast";
      expect(() => denseDecode()).toThrow(/MLX_BUN_DENSE_DECODE=fast: expected sdpa or kernel/);
    } finally {
      delete process.env.MLX_BUN_DENSE_DECODE;
      setDenseDecode(undefined);
    }
    expect(() => setDenseDecode("fast" as "sdpa")).toThrow(/setDenseDecode: expected "sdpa" or "kernel"/);
  });

  test("declines where it does not apply: the setting off, a CPU, several query tokens", () => {
    using k = rand([1, 2, 40, 64], 1, "bfloat16");
    using q = rand([1, 4, 1, 64], 2, "bfloat16");
    expect(denseDecodeAttention(q, k, k, 0.125, null)).toBeNull();
    setDenseDecode("kernel");
    try {
      using q2 = rand([1, 4, 2, 64], 3, "bfloat16");
      expect(denseDecodeAttention(q2, k, k, 0.125, "causal")).toBeNull();
      if (gpu_backend() === null) expect(denseDecodeAttention(q, k, k, 0.125, null)).toBeNull();
    } finally {
      setDenseDecode(undefined);
    }
    using m = decodeMask(null, 1, 40)!;
    using kf = mx.astype(k, "float32");
    expect(() => denseDecodeKernel.run([q, kf, k, m], { path: "reference" })).toThrow(/mlxb_dense_decode_partials.*keys float32 \/ values bfloat16 differ/);
  });
});

describe("what the sources assume", () => {
  test("affine packing: element e is bits (e·b mod 32) of word e·b/32, code·scale + bias of group e/g (2/4/8 bits)", () => {
    for (const [bits, group] of [
      [2, 32],
      [4, 64],
      [8, 128],
      [4, 32],
    ] as const) {
      const d = 128;
      using x = rand([3, d], bits * 7 + group, "float32");
      const [w, s, b] = mx.quantize(x, { group_size: group, bits });
      try {
        using deq = mx.dequantize(w!, s!, b!, { group_size: group, bits });
        const words = w!.toTypedArray() as Uint32Array;
        const sc = s!.toFloat64Array();
        const bi = b!.toFloat64Array();
        const want = deq.toFloat64Array();
        const wpr = (d * bits) / 32;
        for (let r = 0; r < 3; r++) {
          for (let e = 0; e < d; e++) {
            const word = words[r * wpr + ((e * bits) >>> 5)]!;
            const code = (word >>> ((e * bits) & 31)) & ((1 << bits) - 1);
            const g = r * (d / group) + Math.floor(e / group);
            const got = Math.fround(Math.fround(code * sc[g]!) + bi[g]!);
            expect(Math.abs(got - want[r * d + e]!), `${bits}-bit g${group} row ${r} elem ${e}`).toBeLessThanOrEqual(1e-6 * Math.abs(want[r * d + e]!) + 1e-7);
          }
        }
      } finally {
        for (const a of [w, s, b]) a?.dispose();
      }
    }
  });

  test("the plan: runs of whole tiles covering every token, split as the kernels derive it from their grid", () => {
    for (const [b, hq, hkv, d, t] of [
      [1, 8, 2, 256, 1024],
      [1, 8, 2, 256, 32768],
      [1, 8, 2, 256, 131072],
      [1, 16, 8, 512, 131072],
      [8, 8, 1, 512, 8000],
      [1, 4, 4, 64, 1],
      [4, 8, 8, 64, 1100],
      [1, 16, 1, 64, 1000],
    ] as const) {
      using q = MlxArray.fromNumbers(new Array(b * hq * d).fill(0), [b, hq, 1, d], "bfloat16");
      // A tile's raw registers per token: TurboQuant k4/v3's, and a plain cache's.
      const regs = t % 2 === 0 ? affineTokenRegs(d, 4, 32) + TURBO_VALUE_TOKEN_REGS : (2 * d) / 32;
      const p = decodePlan(q, hkv, d, d, t, regs);
      if (typeof p === "string") throw new Error(p);
      expect(p.parts * p.tpw * DECODE_WARPS).toBeGreaterThanOrEqual(t);
      expect((p.parts - 1) * p.tpw * DECODE_WARPS).toBeLessThan(t);
      expect(p.tpw % p.nt).toBe(0);
      expect(p.tpw).toBe(decodeRunLength(t, p.parts, p.nt));
      expect(p.nRep % p.reps).toBe(0);
      expect((p.reps * d) / 32).toBeLessThanOrEqual(32);
      expect(p.nt * (regs + 1) <= 34 || p.nt === 1).toBe(true);
      expect(p.nt).toBeLessThanOrEqual(8);
      // The tile's NT × REPS scores, each padded to a power of two, fit the warp's lanes (the reduce-scatter).
      expect(2 ** Math.ceil(Math.log2(p.nt)) * 2 ** Math.ceil(Math.log2(p.reps))).toBeLessThanOrEqual(32);
      // Several waves of threadgroups on a large GPU: about 8192 warps, at most one threadgroup a
      // row more (runs of at least 32 tokens, whole tiles, where fewer warps are plenty).
      const warps = b * hkv * (p.nRep / p.reps) * p.parts * DECODE_WARPS;
      expect(warps <= 8192 + b * hkv * (p.nRep / p.reps) * DECODE_WARPS).toBe(true);
      expect(p.tpw <= 32 + p.nt || warps * 2 > 8192).toBe(true);
    }
    using q2 = MlxArray.fromNumbers(new Array(4 * 96).fill(0), [1, 2, 2, 96], "float32");
    expect(decodePlan(q2, 1, 96, 96, 10, 8)).toMatch(/one query token/);
    using q3 = MlxArray.fromNumbers(new Array(4 * 96).fill(0), [1, 2, 1, 96 * 2], "float32");
    expect(decodePlan(q3, 1, 192, 200, 10, 8)).toMatch(/value head dim 200 must be a multiple of 32/);
  });

  // The measurement knobs of the plan: each setting's effect on the plan for 8 query heads over 2
  // KV heads of 256, and bad values refused by the variable's name.
  const knobs: {
    env: string;
    what: string;
    tokens: number;
    read: (p: DecodePlan) => unknown;
    cases: [string | undefined, unknown][];
    bad: string[];
    choices: string;
  }[] = [
    {
      env: "MLX_BUN_DECODE_TILE",
      what: "caps the tokens per tile",
      tokens: 4096,
      read: (p) => p.nt,
      // 34 registers / (3 + the mask's 1), at most 8.
      cases: [
        [undefined, 8],
        ["2", 2],
      ],
      bad: ["0", "9", "2.5", "x"],
      choices: "1 or 2 or 3 or 4 or 5 or 6 or 7 or 8",
    },
    {
      env: "MLX_BUN_DECODE_WARPS",
      what: "sets the warps the tokens are split over",
      tokens: 131072,
      read: (p) => [p.tpw, p.parts],
      // 8192 warps over 2 KV heads (all 4 query heads in one warp): runs of 32 tokens, 1024 partials.
      cases: [
        [undefined, [32, 1024]],
        ["2048", [128, 256]],
      ],
      bad: ["3000", "0", "x"],
      choices: "1024 or 2048 or 4096 or 8192 or 16384 or 32768",
    },
    {
      env: "MLX_BUN_DECODE_LANE_FLOATS",
      what: "lowers the query heads a warp carries",
      tokens: 4096,
      read: (p) => p.reps,
      // 4 heads × 8 floats of a 256-dim head per lane, then 2, then 1.
      cases: [
        [undefined, 4],
        ["16", 2],
        ["8", 1],
      ],
      bad: ["4", "x"],
      choices: "8 or 16 or 32",
    },
  ];
  for (const k of knobs) {
    test(`${k.env} ${k.what}; a bad value is refused by name`, () => {
      using q = MlxArray.fromNumbers(new Array(8 * 256).fill(0), [1, 8, 1, 256], "bfloat16");
      const plan = () => k.read(decodePlan(q, 2, 256, 256, k.tokens, 3) as DecodePlan);
      const before = process.env[k.env];
      try {
        for (const [value, want] of k.cases) {
          if (value === undefined) delete process.env[k.env];
          else process.env[k.env] = value;
          expect(plan(), `${k.env}=${value}`).toEqual(want);
        }
        for (const bad of k.bad) {
          process.env[k.env] = bad;
          expect(plan).toThrow(new RegExp(`^${k.env}=${bad.replace(".", "\\.")}: expected ${k.choices}$`));
        }
      } finally {
        if (before === undefined) delete process.env[k.env];
        else process.env[k.env] = before;
      }
    });
  }

  test("masks the kernels read: none/causal → one true; [B,1,1,T] kept; per-head masks go to the unfused path", () => {
    using none = decodeMask(null, 2, 5)!;
    expect(none.shape).toEqual([1, 1, 1, 1]);
    using causal = decodeMask("causal", 2, 5)!;
    expect(causal.dtype).toBe("bool");
    using row = MlxArray.fromNumbers([1, 1, 0, 1, 1], [1, 5], "bool");
    using r4 = decodeMask(row, 2, 5)!;
    expect(r4.shape).toEqual([1, 1, 1, 5]);
    using perHead = MlxArray.fromNumbers(new Array(10).fill(1), [1, 2, 1, 5], "bool");
    expect(decodeMask(perHead, 1, 5)).toBeNull();
    using wrongT = MlxArray.fromNumbers(new Array(4).fill(1), [1, 4], "bool");
    expect(decodeMask(wrongT, 1, 5)).toBeNull();
  });
});

describe("paths", () => {
  function affineInputs(): { inputs: MlxArray[]; dispose(): void } {
    using k = rand([1, 2, 40, 64], 1, "bfloat16");
    using q = rand([1, 4, 1, 64], 2, "bfloat16");
    const [kw, ks, kb] = mx.quantize(k, { group_size: 64, bits: 4 });
    const m = decodeMask(null, 1, 40)!;
    const inputs = [q.retain(), kw!, ks!, kb!, kw!.retain(), ks!.retain(), kb!.retain(), m];
    for (const a of inputs) a.eval();
    return { inputs, dispose: () => inputs.forEach((a) => a.dispose()) };
  }

  test("on a CPU the decode entry point declines (the view then runs the unfused path)", () => {
    if (gpu_backend() !== null) return;
    const { inputs, dispose } = affineInputs();
    try {
      const [q, kw, ks, kb] = inputs;
      const k = { w: kw!, scales: ks!, biases: kb! };
      expect(affineDecodeAttention(q!, k, k, 0.125, null, 4)).toBeNull();
    } finally {
      dispose();
    }
  });

  test("the Metal and CUDA sources are driven down to MLX (which refuses them on a CPU-only build)", () => {
    if (gpu_backend() !== null) return;
    const { inputs, dispose } = affineInputs();
    try {
      for (const kernel of [affineDecodeKernel, decodeCombineKernel]) {
        const args =
          kernel === affineDecodeKernel
            ? inputs
            : (() => {
                const parts = affineDecodeKernel.run(inputs, { path: "reference" });
                return [...parts, inputs[0]!.retain()];
              })();
        try {
          expect(() => kernel.run(args, { environment: { gpu_backend: "metal", device: "gpu" } })).toThrow(/No Metal back-end/);
          expect(() => kernel.run(args, { environment: { gpu_backend: "cuda", device: "gpu" } })).toThrow(/No CUDA back-end/);
        } finally {
          if (args !== inputs) args.forEach((a) => a.dispose());
        }
      }
    } finally {
      dispose();
    }
  });

  // runKeyed reuses a key's first launch for later inputs: a key that left out something the
  // launch reads would run a wrong grid or template. Every shape class here (lazy zeros: nothing
  // is allocated) is grouped by key; inside a group the launches of both passes must agree.
  test("launch keys: inputs under one key launch alike (pass 1 and pass 2), across kernels, dtypes, heads, dims, lengths, masks, bits", () => {
    const z = (shape: number[], dtype: Dtype): MlxArray => mx.zeros(shape, dtype);
    const seen = new Map<string, string>();
    let launches = 0;
    const check = (kernel: typeof affineDecodeKernel, key: string | null, inputs: MlxArray[], label: string): void => {
      try {
        expect(key, label).not.toBeNull();
        const l1 = kernel.spec.launch(inputs);
        using po = z(l1.output_shapes[0] as number[], "float32");
        using pm = z(l1.output_shapes[1] as number[], "float32");
        using pl = z(l1.output_shapes[2] as number[], "float32");
        const l2 = decodeCombineKernel.spec.launch([po, pm, pl, inputs[0]!]);
        const both = JSON.stringify([kernel.name, l1, l2]);
        const k = `${kernel.name}|${key}`;
        const before = seen.get(k);
        if (before === undefined) seen.set(k, both);
        else expect(both, `${label}: key ${key}`).toBe(before);
        launches++;
      } finally {
        for (const a of inputs) a.dispose();
      }
    };
    for (const dtype of ["bfloat16", "float16", "float32"] as const) {
      for (const [b, hq, hkv] of [
        [1, 8, 2],
        [1, 16, 8],
        [2, 4, 4],
        [3, 8, 1],
      ] as const) {
        for (const d of [64, 256, 512]) {
          for (const t of [1, 33, 1000, 1001, 5000, 40000, 131072, 131073]) {
            for (const mask of ["none", "bool", "additive"] as const) {
              const mk = (): MlxArray => (mask === "none" ? decodeMask(null, b, t)! : z([b, 1, 1, t], mask === "bool" ? "bool" : dtype));
              const q = (): MlxArray => z([b, hq, 1, d], dtype);
              const label = `${dtype} B${b} ${hq}/${hkv} D${d} T${t} ${mask}`;
              const dense = [q(), z([b, hkv, t, d], dtype), z([b, hkv, t, d], dtype), mk()];
              check(denseDecodeKernel, denseDecodeKey(dense), dense, `dense ${label}`);
              for (const [bits, group] of [
                [4, 32],
                [4, 64],
                [8, 64],
                [2, 32],
              ] as const) {
                const plane = (): MlxArray[] => [z([b, hkv, t, (d * bits) / 32], "uint32"), z([b, hkv, t, d / group], dtype), z([b, hkv, t, d / group], dtype)];
                const affine = [q(), ...plane(), ...plane(), mk()];
                check(affineDecodeKernel, affineDecodeKey(affine), affine, `affine ${bits}/${group} ${label}`);
              }
              for (const [kBits, vBits] of [
                [4, 3],
                [4, 2],
                [8, 4],
                [2, 3],
              ] as const) {
                const turbo = [
                  q(),
                  z([b, hkv, t, (d * kBits) / 32], "uint32"),
                  z([b, hkv, t, d / 32], dtype),
                  z([b, hkv, t, d / 32], dtype),
                  z([b, hkv, t, (d * vBits) / 8], "uint8"),
                  z([b, hkv, t, 1], dtype),
                  z([2 ** vBits], "float32"),
                  mk(),
                ];
                check(turboDecodeKernel, turboDecodeKey(turbo), turbo, `turbo ${kBits},${vBits} ${label}`);
              }
            }
          }
        }
      }
    }
    // Keys are shared (lengths within one split reuse a launch), yet not one per kernel.
    expect(seen.size).toBeLessThan(launches);
    expect(seen.size).toBeGreaterThan(100);
  });

  test("bad inputs are refused before any path runs", () => {
    const { inputs, dispose } = affineInputs();
    try {
      using badMask = MlxArray.fromNumbers(new Array(8).fill(1), [1, 2, 1, 4], "bool");
      const withBad = [...inputs.slice(0, 7), badMask];
      expect(() => affineDecodeKernel.run(withBad, { path: "reference" })).toThrow(/mlxb_affine_decode_partials.*mask .* must be \[1 or 1, 1, 1, 40\]/);
      using q2 = rand([1, 4, 2, 64], 9, "bfloat16");
      expect(() => affineDecodeKernel.run([q2, ...inputs.slice(1)], { path: "reference" })).toThrow(/one query token/);
      using f = mx.astype(inputs[1]!, "float32");
      expect(() => affineDecodeKernel.run([inputs[0]!, f, ...inputs.slice(2)], { path: "reference" })).toThrow(/packed planes must be uint32/);
    } finally {
      dispose();
    }
  });

  test("the reference paths return active memory and handles to baseline", () => {
    const { inputs, dispose } = affineInputs();
    try {
      twoPassReference(affineDecodeKernel, inputs).dispose();
      memory.clearCache();
      const base = memory.active();
      const handles = memory.liveHandles();
      for (let i = 0; i < 3; i++) {
        using o = twoPassReference(affineDecodeKernel, inputs);
        o.eval();
      }
      memory.clearCache();
      expect(memory.liveHandles()).toBe(handles);
      expect(memory.active()).toBe(base);
    } finally {
      dispose();
    }
  });
});

// Sources vs references. Pass 1: the same float32 math in another summation order (scores to
// ~1e-6 relative; exp amplifies by |s|). Pass 2 and end to end: the source rounds once to T as
// the float32 reference does, so at most one ulp apart (bfloat16 2^-7, float16 2^-10).
describe.skipIf(gpu_backend() === null)("GPU sources against their references", () => {
  const TOL: Record<string, { atol: number; rtol: number }> = {
    float32: { atol: 1e-5, rtol: 1e-4 },
    bfloat16: { atol: 1e-5, rtol: 2 ** -7 },
    float16: { atol: 1e-5, rtol: 2 ** -10 },
  };
  for (const c of CASES) {
    for (const dtype of ["bfloat16", "float16", "float32"] as const) {
      test(`affine 4-bit g64 and TurboQuant k8/v3, ${dtype}, B${c.b} Hq${c.hq}/Hkv${c.hkv} D${c.d} T${c.t}, mask ${c.mask}`, () => {
        using k = rand([c.b, c.hkv, c.t, c.d], 11, dtype);
        using v = rand([c.b, c.hkv, c.t, c.d], 12, dtype);
        using q = rand([c.b, c.hq, 1, c.d], 13, dtype);
        using qs = mx.multiply(q, 0.125);
        withMask(c, dtype, (_mask, kmask) => {
          using ac = new KVCache(affineCodec(4, 64));
          using av = ac.updateAndFetch(k, v);
          const tcodec = turboQuantCodec({ kBits: 8, vBits: 3 });
          using tc = new KVCache(tcodec);
          using tv = tc.updateAndFetch(k, v);
          const book = mx.turboquant.lloyd_max_codebook(3);
          try {
            for (const [kernel, inputs] of [
              [affineDecodeKernel, [qs, ...av.planes, kmask]],
              [turboDecodeKernel, [qs, ...tv.planes, book.centroids, kmask]],
            ] as const) {
              const ref = kernel.run(inputs, { path: "reference" });
              const gpu = kernel.run(inputs, { path: gpu_backend()! });
              try {
                for (let i = 0; i < 3; i++) {
                  const scale = Math.max(1, ...ref[i]!.toFloat64Array().map(Math.abs));
                  expect(closeDiff(gpu[i]!, ref[i]!, { atol: 1e-4 * scale, rtol: 1e-4 }), `${kernel.name} output ${i}`).toBeNull();
                }
                using outRef = decodeCombineKernel.run([ref[0]!, ref[1]!, ref[2]!, qs], { path: "reference" })[0]!;
                using outGpu = decodeCombineKernel.run([ref[0]!, ref[1]!, ref[2]!, qs], { path: gpu_backend()! })[0]!;
                expect(closeDiff(outGpu, outRef, TOL[dtype]!), `${kernel.name} combine`).toBeNull();
              } finally {
                for (const a of [...ref, ...gpu]) a.dispose();
              }
            }
          } finally {
            book.centroids.dispose();
            book.boundaries.dispose();
            tcodec.dispose();
          }
        });
      });
    }
  }
});

describe("the queries the kernels take", () => {
  test("at scale 1 the queries are q itself, equal to q · 1 bit for bit (±0, subnormals, ±inf, NaN); other scales multiply", () => {
    for (const dtype of ["bfloat16", "float16", "float32"] as const) {
      using special = MlxArray.fromNumbers([0, -0, 1e-40, -3e-8, 65504, Infinity, -Infinity, Number.NaN], [1, 1, 1, 8], "float32");
      using noise = rand([1, 1, 1, 56], 9, "float32");
      using joined = mx.concatenate([special, noise], -1);
      using q = mx.astype(joined, dtype);
      using one = scaledQueries(q, 1);
      using times1 = mx.multiply(q, 1);
      expect(exactDiff(one, times1), dtype).toBeNull();
      using scaled = scaledQueries(q, 0.0625);
      using times = mx.multiply(q, 0.0625);
      expect(exactDiff(scaled, times), dtype).toBeNull();
    }
  });
});
