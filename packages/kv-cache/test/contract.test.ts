import { describe, expect, onTestFinished, test } from "vitest";
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, KVCache, RotatingKVCache, affineCodec, makeState, plainCodec, setKvPrefill, toAffine, turboQuantCodec } from "../src/index.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

const D = 64;

function rand(shape: number[], seed: number): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal(shape, { key });
  return mx.astype(x, "bfloat16");
}

function feed(c: Cache, lens: number[], seed = 0): void {
  lens.forEach((n, i) => {
    using k = rand([1, 2, n, D], seed + i);
    using v = rand([1, 2, n, D], seed + 50 + i);
    c.updateAndFetch(k, v).dispose();
  });
}

const tq = turboQuantCodec({ kBits: 4, vBits: 2 });
const kinds: [string, () => Cache][] = [
  ["plain", () => new KVCache()],
  ["affine 8/64", () => new KVCache(affineCodec(8, 64))],
  ["affine 4/32", () => new KVCache(affineCodec(4, 32))],
  ["turboquant 4/2", () => new KVCache(tq)],
  ["rotating plain", () => new RotatingKVCache(16, 0)],
  ["rotating affine", () => new RotatingKVCache(16, 2, affineCodec(4, 64))],
  ["rotating turboquant", () => new RotatingKVCache(16, 0, tq)],
];

describe("state()/restoreState() round-trips bit-exactly for every kind", () => {
  for (const [name, make] of kinds) {
    test(name, () => {
      using a = make();
      feed(a, [5, 1, 1, 20, 1]);
      using b = make();
      const snap = a.state();
      // restore takes ownership of the tensors: hand it copies so `snap` stays comparable
      b.restoreState(
        makeState(
          snap.signature,
          snap.tensors.map((t) => t.retain()),
          { ...snap.meta },
        ),
      );
      expect(b.offset).toBe(a.offset);
      using q = rand([1, 4, 1, D], 9);
      using k = rand([1, 2, 1, D], 10);
      const ma = a.makeMask(1, null);
      const mb = b.makeMask(1, null);
      using va = a.updateAndFetch(k, k);
      using vb = b.updateAndFetch(k, k);
      va.planes.forEach((p, i) => expect(exactDiff(vb.planes[i]!, p), `plane ${i}`).toBeNull());
      using oa = va.attend(q, 0.125, ma);
      using ob = vb.attend(q, 0.125, mb);
      expect(exactDiff(ob, oa)).toBeNull();
      snap[Symbol.dispose]();
    });
  }
});

describe("contract details", () => {
  test("signatures and bytes per token per mode", () => {
    const sig = (c: Cache): string => {
      feed(c, [1]);
      const s = `${c.signature()} ${c.bytesPerToken()}`;
      c.dispose();
      return s;
    };
    // 2 heads × 64 dims × (K + V): bf16 = 2·64·2·2 = 512 bytes
    expect(sig(new KVCache())).toBe("kv:plain 512");
    // 8-bit: per head per tensor 64 bytes + 2 scales/biases × (64/64) × 2 bytes = 68 → ×2×2 = 272
    expect(sig(new KVCache(affineCodec(8, 64)))).toBe("kv:quant:8:64 272");
    expect(sig(new KVCache(affineCodec(4, 64)))).toBe("kv:quant:4:64 144");
    expect(sig(new RotatingKVCache(512, 0))).toBe("rotating:512:0:kv:plain 512");
    // TurboQuant 4/2: K 32 + 2·2·2 = 40, V 16 + 2 = 18 → ×2 heads = 116
    expect(sig(new KVCache(tq))).toBe("kv:turboquant:4:2 116");
    expect(plainCodec.bytesPerToken({ batch: 1, kvHeads: 2, kHeadDim: 64, vHeadDim: 64, dtype: "bfloat16" })).toBe(512);
    expect(affineCodec(8, 64).bytesPerToken({ batch: 1, kvHeads: 2, kHeadDim: 64, vHeadDim: 64, dtype: "bfloat16" })).toBe(272);
    expect(tq.bytesPerToken({ batch: 1, kvHeads: 2, kHeadDim: 64, vHeadDim: 64, dtype: "bfloat16" })).toBe(116);
  });

  test("masks: 'causal' for windowless chunks at any offset, arrays only for windowed continuations", () => {
    using c = new KVCache();
    expect(c.makeMask(5, null)).toBe("causal");
    feed(c, [300]);
    expect(c.makeMask(5, null)).toBe("causal");
    expect(c.makeMask(1, null)).toBeNull();
    using m = c.makeMask(5, 64) as MlxArray;
    expect(m.shape).toEqual([5, 305]);
    using r = new RotatingKVCache(8);
    expect(r.makeMask(4, 8)).toBe("causal");
    feed(r, [6]);
    using rm = r.makeMask(4, 8) as MlxArray;
    expect(rm.shape).toEqual([4, 10]);
  });

  test("bf16 → affine conversion keeps offset and contents (equals quantizing as we go)", () => {
    const src = new KVCache();
    feed(src, [7, 1]);
    using q = toAffine(src, 8, 64);
    expect(q.offset).toBe(8);
    expect(q.minimumReusableOffset).toBe(8);
    expect(src.planes).toBeNull();
    using direct = new KVCache(affineCodec(8, 64));
    feed(direct, [7, 1]);
    using a = q.state();
    using b = direct.state();
    a.tensors.forEach((t, i) => expect(exactDiff(t, b.tensors[i]!), `slot ${i}`).toBeNull());
  });

  test("the tiled prefill path equals the untiled one", () => {
    setKvPrefill("exact"); // tiling is the exact path's (SDPA over the dequantized planes needs none)
    onTestFinished(() => setKvPrefill(undefined));
    for (const codec of [() => affineCodec(8, 64), () => turboQuantCodec({ kBits: 8, vBits: 4 })]) {
      const whole = codec();
      using a = new KVCache(whole);
      using b = new KVCache(whole.name.startsWith("kv:quant") ? affineCodec(8, 64, 16) : turboQuantCodec({ kBits: 8, vBits: 4, queryTile: 16 }));
      using k = rand([1, 2, 70, D], 11);
      using q = rand([1, 4, 70, D], 12);
      using va = a.updateAndFetch(k, k);
      using vb = b.updateAndFetch(k, k);
      using oa = va.attend(q, 0.125, "causal");
      using ob = vb.attend(q, 0.125, "causal");
      expect(exactDiff(ob, oa), whole.name).toBeNull();
    }
  });

  test("bad input is a clear error", () => {
    using c = new KVCache();
    using k = rand([1, 2, 3, D], 1);
    using v2 = rand([1, 3, 3, D], 2);
    using k3 = rand([2, 3, D], 3);
    expect(() => c.updateAndFetch(k, v2)).toThrow(/keys array\(shape=\[1, 2, 3, 64\].*values array\(shape=\[1, 3, 3, 64\].*differ in B, H or L/);
    expect(() => c.updateAndFetch(k3, k3)).toThrow(/must be \[B, H, L, D\]/);
    c.updateAndFetch(k, k).dispose();
    expect(() => c.trim(4)).toThrow(/cannot trim 4 tokens from a cache holding 3/);
    using kb = rand([2, 2, 1, D], 4);
    expect(() => c.updateAndFetch(kb, kb)).toThrow(/batch 2 does not match the cache's 1/);
    using other = new KVCache();
    const snap = c.state();
    expect(() => other.restoreState(makeState(snap.signature, snap.tensors.slice(0, 1), snap.meta))).toThrow(/needs 2 tensors, got 1/);
    using q8 = new KVCache(affineCodec(8, 64));
    expect(() => q8.restoreState(snap)).toThrow(/state is kv:plain, this cache is kv:quant:8:64/);
    snap[Symbol.dispose]();
    using g = new KVCache(affineCodec(4, 64));
    using odd = rand([1, 1, 1, 48], 5);
    expect(() => g.updateAndFetch(odd, odd)).toThrow(/head dim 48 is not a multiple of the group size 64/);
    expect(() => affineCodec(7, 64)).toThrow(/bits must be one of/);
    using r = new RotatingKVCache(4);
    // A chunk keeps all its tokens in order (trimmable); a single-token step after the wrap overwrites.
    feed(r, [6, 1]);
    expect(r.isTrimmable()).toBe(false);
    expect(() => r.trim(1)).toThrow(/window has wrapped/);
  });
});
