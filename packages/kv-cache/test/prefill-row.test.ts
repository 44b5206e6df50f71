import { describe, expect, test } from "vitest";
import { type MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { BatchKVCache, KVCache, type KvCodec, type Mask, PrefillRow, affineCodec, makeState, plainCodec, turboQuantCodec } from "../src/index.ts";
import { exactDiff, maxAbsDiff } from "../../../tools/oracle/compare.ts";

const H = 2;
const HQ = 4;
const D = 64;
const SCALE = 1 / Math.sqrt(D);
/**
 * Attention of a padded row vs the unpadded cache on the valid query rows: the
 * padding keys are masked out (probability exactly 0), so only the reduction
 * over a longer key axis can differ; bf16 outputs agree within this bound.
 */
const ATOL = 1e-2;

function rand(shape: number[], seed: number): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal(shape, { key });
  return mx.astype(x, "bfloat16");
}

/** t[..., start:stop, :] */
function rows(t: MlxArray, start: number, stop: number): MlxArray {
  return mx.slice(t, [0, 0, start, 0], [t.shape[0]!, t.shape[1]!, stop, t.shape[3]!]);
}

function disposeMask(m: Mask): void {
  if (m !== null && m !== "causal") m.dispose();
}

/** A chunk: `left` padding tokens, `n` valid tokens, `right` padding tokens (k, v, q), plus the valid parts alone. */
function chunk(n: number, seed: number, left = 0, right = 0) {
  const make = (heads: number, s: number) => {
    const full = rand([1, heads, left + n + right, D], s);
    return { full, valid: rows(full, left, left + n) };
  };
  const k = make(H, seed);
  const v = make(H, seed + 1);
  const q = make(HQ, seed + 2);
  return {
    k,
    v,
    q,
    [Symbol.dispose]() {
      for (const x of [k, v, q]) {
        x.full.dispose();
        x.valid.dispose();
      }
    },
  };
}

/** Feed the padded chunk to the row and the valid part to the reference; compare planes (exact) and attention (valid rows, tolerance). */
function step(row: PrefillRow, ref: KVCache, c: ReturnType<typeof chunk>, left: number, window: number | null, exactAttention: boolean): number {
  const n = c.k.valid.shape[2]!;
  const mask = row.makeMask(c.k.full.shape[2]!, window);
  const refMask = ref.makeMask(n, window);
  try {
    using view = row.updateAndFetch(c.k.full, c.v.full);
    using refView = ref.updateAndFetch(c.k.valid, c.v.valid);
    expect(view.length).toBe(row.offset);
    const lp = row.leftPadding;
    view.planes.forEach((p, j) => {
      using valid = rows(p, lp, lp + row.offset);
      expect(exactDiff(valid, refView.planes[j]!), `plane ${j}`).toBeNull();
    });
    using out = view.attend(c.q.full, SCALE, mask);
    using outValid = rows(out, left, left + n);
    using refOut = refView.attend(c.q.valid, SCALE, refMask);
    if (exactAttention) {
      expect(exactDiff(outValid, refOut)).toBeNull();
      return 0;
    }
    const d = maxAbsDiff(outValid, refOut);
    expect(d).toBeLessThanOrEqual(ATOL);
    return d;
  } finally {
    disposeMask(mask);
    disposeMask(refMask);
  }
}

function expectSameState(a: { state(): ReturnType<KVCache["state"]> }, b: KVCache): void {
  using sa = a.state();
  using sb = b.state();
  expect(sa.signature).toBe(sb.signature);
  expect(sa.meta).toEqual(sb.meta);
  expect(sa.tensors.length).toBe(sb.tensors.length);
  sa.tensors.forEach((t, i) => expect(exactDiff(t, sb.tensors[i]!), `slot ${i}`).toBeNull());
}

const tq = turboQuantCodec({ kBits: 4, vBits: 2 });
const CODECS: [string, KvCodec][] = [
  ["plain", plainCodec],
  ["affine 8/64", affineCodec(8, 64)],
  ["affine 4/64", affineCodec(4, 64)],
  ["turboquant 4/2", tq],
];

describe("a left-padded prefill row equals a cache fed the unpadded tokens", () => {
  for (const [name, codec] of CODECS) {
    test(name, () => {
      using row = new PrefillRow(codec);
      using ref = new KVCache(codec);
      row.prepare({ leftPadding: 3 });
      expect([row.offset, row.physicalLength, row.leftPadding, row.positionOffset]).toEqual([0, 0, 3, -3]);
      {
        expect(row.positions()).toEqual([-3]);
      }
      let worst = 0;
      {
        using c = chunk(5, 10, 3);
        worst = Math.max(worst, step(row, ref, c, 3, null, false));
      }
      expect([row.offset, row.physicalLength, row.leftPadding, row.positionOffset]).toEqual([5, 8, 3, 5]);
      for (let i = 0; i < 2; i++) {
        using c = chunk(1, 20 + 3 * i);
        worst = Math.max(worst, step(row, ref, c, 0, null, false));
      }
      {
        using c = chunk(3, 40);
        worst = Math.max(worst, step(row, ref, c, 0, 4, false)); // windowed continuation
      }
      {
        // extract: compact, bit-exact; the row is unchanged
        using x = row.extract();
        expect(x.offset).toBe(ref.offset);
        expect(x.capacity).toBe(ref.offset);
        expectSameState(x, ref);
        expect(row.physicalLength).toBe(13);
      }
      // a snapshot never contains padding: it is the KVCache snapshot of the valid tokens
      expectSameState(row, ref);
      {
        using st = row.state();
        using k = new KVCache(codec);
        k.restoreState(
          makeState(
            st.signature,
            st.tensors.map((t) => t.retain()),
            { ...st.meta },
          ),
        );
        expectSameState(k, ref);
      }
      // drop part of the padding, then all of it
      row.removeLeftPadding(1);
      expect([row.offset, row.physicalLength, row.leftPadding]).toEqual([10, 12, 2]);
      {
        using c = chunk(1, 50);
        worst = Math.max(worst, step(row, ref, c, 0, null, false));
      }
      row.finalize();
      expect([row.offset, row.physicalLength, row.leftPadding, row.positionOffset]).toEqual([11, 11, 0, 11]);
      expectSameState(row, ref);
      // once compact, masks and attention are those of the plain cache, bit for bit
      for (const [n, w] of [
        [1, null],
        [4, null],
        [2, 4],
      ] as const) {
        using c = chunk(n, 60 + n);
        step(row, ref, c, 0, w, true);
      }
      console.log(`${name}: padded-row attention vs unpadded, max |diff| on valid rows = ${worst}`);
    });
  }
});

describe("right padding and prefill inside a padded batch", () => {
  for (const [name, codec] of CODECS.slice(0, 2)) {
    test(`${name}: left + right padding on an empty row, then right padding on a row with content`, () => {
      using row = new PrefillRow(codec);
      using ref = new KVCache(codec);
      row.prepare({ leftPadding: [2], rightPadding: [1] });
      {
        using c = chunk(4, 70, 2, 1);
        step(row, ref, c, 2, null, false);
      }
      expect([row.offset, row.physicalLength, row.leftPadding, row.rightPadding]).toEqual([4, 7, 2, 1]);
      expectSameState(row, ref);
      using k1 = rand([1, H, 1, D], 1);
      expect(() => row.updateAndFetch(k1, k1)).toThrow(/call finalize\(\) before more tokens/);
      expect(() => row.trim(1)).toThrow(/call finalize\(\) first/);
      row.finalize();
      expect([row.offset, row.physicalLength, row.leftPadding, row.rightPadding]).toEqual([4, 4, 0, 0]);
      row.prepare({ rightPadding: 2 });
      {
        using c = chunk(3, 80, 0, 2);
        step(row, ref, c, 0, null, false);
      }
      expect([row.offset, row.physicalLength]).toEqual([7, 9]);
      {
        using x = row.extract();
        expectSameState(x, ref);
      }
      row.finalize();
      expectSameState(row, ref);
      using c = chunk(1, 90);
      step(row, ref, c, 0, null, true);
    });
  }

  test("wrap continues a compact KVCache; trim drops valid tokens", () => {
    using ref = new KVCache();
    using k = rand([1, H, 6, D], 3);
    ref.updateAndFetch(k, k).dispose();
    const inner = new KVCache();
    inner.updateAndFetch(k, k).dispose();
    inner.minimumReusableOffset = 6;
    using row = PrefillRow.wrap(inner);
    expect(row.minimumReusableOffset).toBe(6);
    expectSameState(row, ref);
    expect(row.trim(2)).toBe(2);
    ref.trim(2);
    expectSameState(row, ref);
    using x = row.extract();
    expect(x.minimumReusableOffset).toBe(6);
  });
});

describe("joining a decode batch", () => {
  test("BatchKVCache.merge takes a padded row's valid tokens only", () => {
    using row = new PrefillRow(affineCodec(4, 64));
    using ref = new KVCache(affineCodec(4, 64));
    using other = new KVCache(affineCodec(4, 64));
    row.prepare({ leftPadding: 2 });
    {
      using c = chunk(3, 100, 2);
      step(row, ref, c, 2, null, false);
    }
    using k = rand([1, H, 6, D], 101);
    other.updateAndFetch(k, k).dispose();
    using batch = BatchKVCache.merge([row, other]);
    expect(batch.leftPadding).toEqual([3, 0]);
    expect(batch.offsets).toEqual([3, 6]);
    using x = batch.extract(0);
    expectSameState(x, ref);
  });
});

describe("PrefillRow misuse is a clear KvCacheError", () => {
  test("errors", () => {
    using row = new PrefillRow();
    using k2 = rand([2, H, 3, D], 1);
    using k1 = rand([1, H, 3, D], 2);
    expect(() => row.updateAndFetch(k2, k2)).toThrow(/a prefill row is one row/);
    expect(() => row.prepare({ leftPadding: -1 })).toThrow(/non-negative integer/);
    expect(() => row.prepare({ leftPadding: [1, 2] as unknown as [number] })).toThrow(/non-negative integer/);
    row.prepare({ rightPadding: 4 });
    expect(() => row.updateAndFetch(k1, k1)).toThrow(/right padding 4 is longer than the chunk/);
    row.prepare({ rightPadding: 0 });
    row.updateAndFetch(k1, k1).dispose();
    expect(() => row.prepare({ leftPadding: 1 })).toThrow(/only be added to an empty row/);
    expect(() => row.removeLeftPadding(1)).toThrow(/count must be in \[0, 0\]/);
    expect(() => row.trim(4)).toThrow(/cannot trim 4 tokens from a row holding 3/);
    using other = new KVCache(affineCodec(8, 64));
    using st = other.state();
    expect(() => row.restoreState(makeState(st.signature, [], { offset: 0 }))).toThrow(/state is kv:quant:8:64, this cache is kv:plain/);
  });
});

describe("memory", () => {
  test("prefill rows return active memory and handles to baseline", () => {
    {
      using warm = new PrefillRow();
      using k = rand([1, H, 2, D], 1);
      warm.updateAndFetch(k, k).dispose();
    }
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    for (const [, codec] of CODECS) {
      using row = new PrefillRow(codec);
      row.prepare({ leftPadding: 2, rightPadding: 1 });
      using k = rand([1, H, 6, D], 5);
      using q = rand([1, HQ, 6, D], 6);
      const m = row.makeMask(6, null);
      using v = row.updateAndFetch(k, k);
      using o = v.attend(q, SCALE, m);
      o.eval();
      disposeMask(m);
      using x = row.extract();
      using st = row.state();
      row.finalize();
      using k1 = rand([1, H, 1, D], 7);
      row.updateAndFetch(k1, k1).dispose();
    }
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });
});
