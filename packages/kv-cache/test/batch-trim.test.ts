// BatchCache.trimRows: rows of one batch drop different numbers of their newest tokens
// (speculative verification keeps a different number of drafts per row). The reference is each
// row's own single-sequence cache (KVCache / RotatingKVCache, whose trims are checked against
// mlx-lm and rotating-trim.test.ts) fed the same tokens and trimmed by its own count: at every
// later step, the batch's attention output for row b equals that cache's, and so do the offsets.
import { describe, expect, test } from "vitest";
import { MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import {
  BatchKVCache,
  BatchRotatingKVCache,
  type BatchCache,
  type Cache,
  KVCache,
  type KvCodec,
  RotatingKVCache,
  affineCodec,
  plainCodec,
  turboQuantCodec,
} from "../src/index.ts";

const H = 2;
const HQ = 4;
const D = 64;
const SCALE = 1 / Math.sqrt(D);

let seed = 100;
function rand(shape: number[]): MlxArray {
  using key = mx.random.key(seed++);
  return mx.random.normal(shape, { key });
}

/** A deterministic pseudo-random sequence of small integers. */
function counts(round: number, B: number, max: number): number[] {
  return Array.from({ length: B }, (_, b) => (round * 7 + b * 5 + ((round * b) % 3)) % (max + 1));
}

function row(x: MlxArray, b: number): MlxArray {
  return mx.index(x, mx.sl(b, b + 1), "...");
}

/**
 * Feed `x` [B, *, L, D] to the batch and each row's slice to its single cache; compare the
 * attention outputs of every row (queries [B, HQ, L, D]) and return the largest difference.
 */
function step(batch: BatchCache, singles: Cache[], L: number, window: number | null): number {
  const B = singles.length;
  using k = rand([B, H, L, D]);
  using v = rand([B, H, L, D]);
  using q = rand([B, HQ, L, D]);
  const mask = batch.makeMask(L, window);
  let worst = 0;
  try {
    using view = batch.updateAndFetch(k, v);
    using out = view.attend(q, SCALE, mask);
    singles.forEach((c, b) => {
      using kb = row(k, b);
      using vb = row(v, b);
      using qb = row(q, b);
      const m = c.makeMask(L, window);
      try {
        using sv = c.updateAndFetch(kb, vb);
        using so = sv.attend(qb, SCALE, m);
        using ob = row(out, b);
        using d = mx.subtract(ob, so);
        using a = mx.abs(d);
        using mxd = mx.max(a);
        worst = Math.max(worst, mxd.item());
      } finally {
        if (m !== null && m !== "causal") m.dispose();
      }
    });
  } finally {
    if (mask !== null && mask !== "causal") mask.dispose();
  }
  return worst;
}

interface Layout {
  name: string;
  single: (codec: KvCodec) => Cache;
  merge: (rows: Cache[]) => BatchCache;
  window: number | null;
}

const layouts: Layout[] = [
  { name: "BatchKVCache", single: (c) => new KVCache(c), merge: (r) => BatchKVCache.merge(r), window: null },
  { name: "BatchRotatingKVCache (window 8)", single: (c) => new RotatingKVCache(8, 0, c), merge: (r) => BatchRotatingKVCache.merge(r), window: 8 },
];

const codecs: [string, KvCodec][] = [
  ["plain", plainCodec],
  ["q8", affineCodec(8, 64)],
  ["turboquant", turboQuantCodec({ kBits: 4, vBits: 3 })],
];

describe("BatchCache.trimRows equals trimming each row's own cache", () => {
  for (const lay of layouts) {
    for (const [cn, codec] of codecs) {
      test(`${lay.name} (${cn}): verify chunks of 4 tokens, per-row trims of 0..3, single steps between`, () => {
        {
          // The codec's own constants (TurboQuant's rotation and codebooks) are made on first use.
          using k = rand([1, H, 1, D]);
          const c = new KVCache(codec);
          c.updateAndFetch(k, k).dispose();
          c.dispose();
        }
        memory.clearCache();
        const base = memory.active();
        {
          // Rows of different lengths (3, 9, 14 tokens): padding, a short row and rows past the window.
          const lens = [3, 9, 14, 39];
          const singles = lens.map(() => lay.single(codec));
          const batchRows: Cache[] = [];
          lens.forEach((n, b) => {
            using k = rand([1, H, n, D]);
            using v = rand([1, H, n, D]);
            singles[b]!.updateAndFetch(k, v).dispose();
          });
          for (const c of singles) batchRows.push(c);
          const batch = lay.merge(batchRows);
          try {
            // The decode batch's first step is a single token (the scheduler's first pick).
            let worst = step(batch, singles, 1, lay.window);
            for (let round = 0; round < 12; round++) {
              // The verify pass: [y, 3 drafts] per row, then each row keeps its own number.
              worst = Math.max(worst, step(batch, singles, 4, lay.window));
              const cut = counts(round, lens.length, 3);
              expect(batch.canTrimRows(cut)).toBe(true);
              batch.trimRows(cut);
              singles.forEach((c, b) => c.trim(cut[b]!));
              expect(batch.offsets).toEqual(singles.map((c) => c.offset));
              // Now and then a plain single-token step (a round that drafted nothing decodes plainly).
              if (round % 4 === 3) worst = Math.max(worst, step(batch, singles, 1, lay.window));
            }
            // A row extracted after the trims continues like its own cache.
            for (let b = 0; b < lens.length; b++) {
              using ex = batch.extract(b) as Cache & Disposable;
              expect(ex.offset).toBe(singles[b]!.offset);
            }
            expect(worst).toBeLessThan(1e-5);
          } finally {
            batch.dispose();
            for (const c of singles) c.dispose();
          }
        }
        memory.clearCache();
        expect(memory.active()).toBe(base);
      });
    }
  }
});

describe("BatchRotatingKVCache: a chunk after in-place ring writes", () => {
  test("equals each row's own RotatingKVCache, padded rows included (mlx-lm 0.32's make_mask hides a real token there)", () => {
    // mlx-lm's BatchRotatingKVCache.make_mask reads the ring index as the buffer's end; after
    // in-place writes a chunk first re-orders the ring, so a padded row loses a visible token
    // (0.70 max attention difference against its own RotatingKVCache on this scenario in mlx-lm).
    const singles = [12, 3, 5].map(() => new RotatingKVCache(8, 0));
    [12, 3, 5].forEach((n, b) => {
      using k = rand([1, H, n, D]);
      singles[b]!.updateAndFetch(k, k).dispose();
    });
    const batch = BatchRotatingKVCache.merge(singles);
    try {
      let worst = 0;
      for (const L of [1, 1, 1, 2, 1, 2, 3]) worst = Math.max(worst, step(batch, singles, L, 8));
      expect(worst).toBeLessThan(1e-5);
    } finally {
      batch.dispose();
      for (const c of singles) c.dispose();
    }
  });
});

describe("trimRows refuses what it cannot do exactly", () => {
  test("a wrapped ring written in place, and trims larger than a row", () => {
    const singles = [new RotatingKVCache(8, 0), new RotatingKVCache(8, 0)];
    for (const c of singles) {
      using k = rand([1, H, 10, D]);
      c.updateAndFetch(k, k).dispose();
    }
    const batch = BatchRotatingKVCache.merge(singles);
    try {
      using k = rand([2, H, 1, D]);
      batch.updateAndFetch(k, k).dispose();
      batch.updateAndFetch(k, k).dispose();
      expect(batch.canTrimRows([0, 1])).toBe(false);
      expect(() => batch.trimRows([0, 1])).toThrow(/written in place/);
      batch.trimRows([0, 0]);
      using k4 = rand([2, H, 4, D]);
      batch.updateAndFetch(k4, k4).dispose();
      // A chunk of 4 leaves room to drop up to 3 per row and keep a full window, not 4.
      expect(batch.canTrimRows([3, 0])).toBe(true);
      expect(batch.canTrimRows([4, 0])).toBe(false);
      expect(() => batch.trimRows([4, 0])).toThrow(/full window/);
    } finally {
      batch.dispose();
      for (const c of singles) c.dispose();
    }
    const b2 = new BatchKVCache([0, 0]);
    try {
      using k = rand([2, H, 3, D]);
      b2.updateAndFetch(k, k).dispose();
      expect(() => b2.trimRows([4, 0])).toThrow(/cannot trim 4 tokens from row 0/);
      expect(() => b2.trimRows([1])).toThrow(/counts/);
    } finally {
      b2.dispose();
    }
  });
});
