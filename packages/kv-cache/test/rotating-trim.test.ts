import { describe, expect, test } from "vitest";
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { affineCodec, RotatingKVCache, turboQuantCodec } from "../src/index.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

const D = 64;

function rand(n: number, seed: number): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal([1, 2, n, D], { key });
  return mx.astype(x, "bfloat16");
}

/** Feed chunks [len, seed]; returns nothing, the cache keeps them. */
function feed(c: RotatingKVCache, chunks: [number, number][]): void {
  for (const [n, seed] of chunks) {
    using k = rand(n, seed);
    using v = rand(n, seed + 1000);
    c.updateAndFetch(k, v).dispose();
  }
}

// Speculative verification: a wrapped window takes a chunk of L tokens, then drops up to L - 1.
describe("RotatingKVCache trim after a wrapped multi-token chunk", () => {
  const codecs = [
    ["plain", undefined],
    ["affine 4/64", affineCodec(4, 64)],
    ["turboquant 4/3", turboQuantCodec({ kBits: 4, vBits: 3 })],
  ] as const;
  for (const [name, codec] of codecs) {
    test(`${name}: trim n of an L-chunk equals never feeding those n (then single and chunk steps)`, () => {
      for (const keep of [0, 2]) {
        for (const n of [1, 2]) {
          // Prefix of 20 single tokens wraps the 8-slot window; then a 4-token chunk.
          const prefix: [number, number][] = Array.from({ length: 20 }, (_, i) => [1, i]);
          using a = new RotatingKVCache(8, keep, codec);
          using b = new RotatingKVCache(8, keep, codec);
          // b gets the chunk without its last n tokens (still a chunk, so the same temporal layout).
          feed(a, prefix);
          feed(b, prefix);
          using k4 = rand(4, 99);
          using v4 = rand(4, 1099);
          a.updateAndFetch(k4, v4).dispose();
          expect(a.canTrim(n)).toBe(true);
          expect(a.canTrim(4)).toBe(false);
          a.trim(n);
          using kb = mx.slice(k4, [0, 0, 0, 0], [1, 2, 4 - n, D]);
          using vb = mx.slice(v4, [0, 0, 0, 0], [1, 2, 4 - n, D]);
          b.updateAndFetch(kb, vb).dispose();
          expect(a.offset).toBe(b.offset);
          // Continue both the same way: a single token, then a chunk; the fetched planes agree.
          for (const len of [1, 3, 1]) {
            using k = rand(len, 500 + len);
            using v = rand(len, 600 + len);
            using va = a.updateAndFetch(k, v);
            using vb2 = b.updateAndFetch(k, v);
            expect(va.length).toBe(vb2.length);
            va.planes.forEach((p, i) => expect(exactDiff(vb2.planes[i]!, p), `keep ${keep}, n ${n}, plane ${i}`).toBeNull());
          }
        }
      }
    });
  }

  test("a wrapped ring written one token at a time refuses to trim with a clear error", () => {
    using c = new RotatingKVCache(8, 0);
    feed(
      c,
      Array.from({ length: 12 }, (_, i) => [1, i] as [number, number]),
    );
    expect(c.canTrim(1)).toBe(false);
    expect(c.canTrim(0)).toBe(true);
    expect(() => c.trim(1)).toThrow(/the window has wrapped \(offset 12\)/);
  });
});
