import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type Cache, KVCache, toAffine } from "@mlx-bun/kv-cache";
import { memory } from "@mlx-bun/mlx-ffi";
import { type LoadedModel, loadModel } from "@mlx-bun/models";
import { PromptCache } from "../src/prompt-cache.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";
import { cacheDigest, disposeCaches, greedy, makeTiny, promptIds, tempDir, withConfig } from "./kv-helpers.ts";

const tmp = tempDir("mlxb-pcache-");
afterAll(() => tmp.cleanup());

// `wide`: the dense tiny model with a 64-token sliding window, so caches of up to 63 tokens stay
// trimmable; `small`: window 8, so its rotating caches wrap after 8 tokens.
let wide: LoadedModel;
let small: LoadedModel;
let base = { active: 0, handles: 0 };
beforeAll(() => {
  const dense = makeTiny(join(tmp.dir, "dense"), ["--variant", "dense"]);
  wide = loadModel(withConfig(dense, join(tmp.dir, "dense-w64"), { sliding_window: 64 }));
  small = loadModel(makeTiny(join(tmp.dir, "small"), ["--variant", "small"]));
  for (const lm of [wide, small]) {
    const c = lm.model.makeCaches();
    greedy(lm.model, c, promptIds(4), 2).dispose();
    disposeCaches(c);
  }
  base = { active: memory.active(), handles: memory.liveHandles() };
});
afterAll(() => {
  wide.dispose();
  small.dispose();
});

const STEPS = 8;

/** cachedTokens of a lookup (null on a miss), disposing the hit. */
function reused(pc: PromptCache, ids: number[], opts?: { signatures?: string[] }): number | null {
  const hit = pc.lookup(ids, opts);
  hit?.dispose();
  return hit ? hit.cachedTokens : null;
}

/** Run `prompt` through fresh caches, generate STEPS tokens; returns the caches and all token ids. */
function request(lm: LoadedModel, prompt: number[]): { caches: Cache[]; ids: number[]; tokens: number[] } {
  const caches = lm.model.makeCaches();
  using run = greedy(lm.model, caches, prompt, STEPS);
  return { caches, ids: [...prompt, ...run.tokens], tokens: run.tokens };
}

function cold(lm: LoadedModel, prompt: number[]): number[] {
  const caches = lm.model.makeCaches();
  using run = greedy(lm.model, caches, prompt, STEPS);
  disposeCaches(caches);
  return run.tokens;
}

describe("prefix reuse", () => {
  test("a trimmed prefix gives the same greedy tokens as a cold run; the entry stays for others", () => {
    using pc = new PromptCache({ maxBytes: 1 << 30 });
    const a = promptIds(30, 1);
    const r = request(wide, a);
    expect(pc.insert(r.ids, r.caches)).toBe(true);
    disposeCaches(r.caches); // the entry shares arrays, not the caller's cache objects
    expect(pc.entries()[0]!.tokens).toBe(30 + STEPS - 1); // the last token was never fed

    const b = [...a.slice(0, 20), ...promptIds(10, 7)];
    for (let round = 0; round < 2; round++) {
      const hit = pc.lookup(b)!;
      expect(hit).not.toBeNull();
      expect(hit.cachedTokens).toBe(20);
      expect(hit.trimmed).toBe(30 + STEPS - 1 - 20);
      expect(hit.caches.every((c) => c.offset === 20)).toBe(true);
      using run = greedy(wide.model, hit.caches, b.slice(hit.cachedTokens), STEPS);
      hit.dispose();
      expect(run.tokens).toEqual(cold(wide, b));
    }
    expect(pc.size).toBe(1);
    expect(pc.stats).toMatchObject({ hits: 2, misses: 0, cachedTokens: 40 });
  });

  test("an exact extension reuses the whole entry: logits bit-identical to a cold run split the same way", () => {
    using pc = new PromptCache({ maxBytes: 1 << 30 });
    const p = promptIds(24, 2);
    const caches = wide.model.makeCaches();
    greedy(wide.model, caches, p, 1).dispose(); // prefill only: the caches hold p
    pc.insert(p, caches);
    disposeCaches(caches);

    const q = [...p, ...promptIds(6, 9)];
    const hit = pc.lookup(q)!;
    expect(hit.cachedTokens).toBe(24);
    expect(hit.trimmed).toBe(0);
    using warm = greedy(wide.model, hit.caches, q.slice(24), STEPS);
    hit.dispose();

    const ref = wide.model.makeCaches();
    greedy(wide.model, ref, p, 1).dispose();
    using split = greedy(wide.model, ref, q.slice(24), STEPS);
    disposeCaches(ref);
    expect(warm.tokens).toEqual(split.tokens);
    warm.rows.forEach((row, i) => expect(exactDiff(row, split.rows[i]!)).toBeNull());
    expect(warm.tokens).toEqual(cold(wide, q));
  });

  test("a whole-prompt match still leaves one token to run", () => {
    using pc = new PromptCache({ maxBytes: 1 << 30 });
    const p = promptIds(16, 3);
    const caches = wide.model.makeCaches();
    greedy(wide.model, caches, p, 1).dispose();
    pc.insert(p, caches);
    disposeCaches(caches);
    const hit = pc.lookup(p)!;
    expect(hit.cachedTokens).toBe(15);
    using run = greedy(wide.model, hit.caches, p.slice(15), STEPS);
    hit.dispose();
    expect(run.tokens).toEqual(cold(wide, p));
    expect(pc.lookup([p[0]!])).toBeNull(); // nothing left to reuse
    expect(pc.lookup(promptIds(10, 50))).toBeNull(); // no common prefix
  });

  test("a wrapped rotating window is reused only by exact extension", () => {
    using pc = new PromptCache({ maxBytes: 1 << 30 });
    const p = promptIds(20, 4); // > window 8: the sliding layers' rings have wrapped
    const caches = small.model.makeCaches();
    greedy(small.model, caches, p, 1).dispose();
    expect(caches.some((c) => !c.isTrimmable())).toBe(true);
    pc.insert(p, caches);
    disposeCaches(caches);

    expect(pc.lookup([...p.slice(0, 15), ...promptIds(5, 8)])).toBeNull(); // would need a trim
    expect(pc.lookup(p)).toBeNull(); // reuse would need a one-token trim
    const q = [...p, ...promptIds(5, 8)];
    const hit = pc.lookup(q)!;
    expect(hit.cachedTokens).toBe(20);
    using warm = greedy(small.model, hit.caches, q.slice(20), STEPS);
    hit.dispose();
    expect(warm.tokens).toEqual(cold(small, q));
    expect(pc.stats).toMatchObject({ hits: 1, misses: 2 });
  });

  test("minimumReusableOffset is respected", () => {
    using pc = new PromptCache({ maxBytes: 1 << 30 });
    const p = promptIds(30, 5);
    const caches = wide.model.makeCaches();
    greedy(wide.model, caches, p.slice(0, 20), 1).dispose();
    // An irreversible conversion at 20 tokens (dense full-attention layer: index 3).
    const full = caches.findIndex((c) => c instanceof KVCache);
    caches[full] = toAffine(caches[full] as KVCache, 8, 64);
    expect(caches[full]!.minimumReusableOffset).toBe(20);
    greedy(wide.model, caches, p.slice(20), 1).dispose();
    pc.insert(p, caches);
    disposeCaches(caches);

    expect(pc.lookup([...p.slice(0, 15), ...promptIds(8, 6)])).toBeNull(); // trim below 20
    const hit = pc.lookup([...p.slice(0, 25), ...promptIds(8, 6)])!;
    expect(hit.cachedTokens).toBe(25);
    expect(hit.caches[full]!.minimumReusableOffset).toBe(20);
    expect(hit.caches[full]!.signature()).toBe("kv:quant:8:64");
    hit.dispose();
    expect(reused(pc, [...p.slice(0, 20), ...promptIds(8, 6)])).toBe(20);
    expect(reused(pc, [...p.slice(0, 20), ...promptIds(8, 6)], { signatures: ["kv:plain"] })).toBeNull();
  });
});

describe("entries and eviction", () => {
  test("LRU eviction under the byte budget; a hit refreshes an entry", () => {
    const entry = (salt: number): { ids: number[]; caches: Cache[] } => {
      const r = request(wide, promptIds(20, salt));
      return { ids: r.ids, caches: r.caches };
    };
    const e1 = entry(11);
    const one = e1.caches.reduce((s, c) => s + c.nbytes, 0);
    using pc = new PromptCache({ maxBytes: Math.floor(2.5 * one) });
    const digest = cacheDigest(e1.caches);
    pc.insert(e1.ids, e1.caches);
    expect(cacheDigest(e1.caches)).toBe(digest); // insert leaves the caller's caches as they were
    disposeCaches(e1.caches);
    const e2 = entry(12);
    pc.insert(e2.ids, e2.caches);
    disposeCaches(e2.caches);
    expect(pc.size).toBe(2);
    expect(pc.bytes).toBeLessThanOrEqual(pc.maxBytes);

    // Touch the first entry: the second becomes least recently used.
    pc.lookup([...e1.ids.slice(0, 10), 99])!.dispose();
    const e3 = entry(13);
    pc.insert(e3.ids, e3.caches);
    disposeCaches(e3.caches);
    expect(pc.size).toBe(2);
    expect(pc.stats.evictions).toBe(1);
    expect(pc.bytes).toBeLessThanOrEqual(pc.maxBytes);
    expect(reused(pc, [...e2.ids.slice(0, 10), 99])).toBeNull();
    expect(reused(pc, [...e1.ids.slice(0, 10), 99])).toBe(10);

    // An entry larger than the whole budget is not kept, and evicts nothing.
    using tiny = new PromptCache({ maxBytes: one - 1 });
    const e4 = entry(14);
    expect(tiny.insert(e4.ids, e4.caches)).toBe(false);
    expect(tiny.size).toBe(0);
    disposeCaches(e4.caches);
    tiny.dispose();
    pc.clear();
    expect(pc.bytes).toBe(0);
  });

  test("an entry the new one extends is dropped; the same tokens replace", () => {
    using pc = new PromptCache({ maxBytes: 1 << 30, maxEntries: 4 });
    const p = promptIds(30, 15);
    const c = wide.model.makeCaches();
    greedy(wide.model, c, p.slice(0, 12), 1).dispose();
    pc.insert(p.slice(0, 12), c);
    greedy(wide.model, c, p.slice(12), 1).dispose();
    pc.insert(p, c);
    expect(pc.size).toBe(1);
    expect(pc.entries()[0]!.tokens).toBe(30);
    pc.insert(p, c);
    expect(pc.size).toBe(1);
    disposeCaches(c);
    expect(reused(pc, [...p.slice(0, 12), 1, 2])).toBe(12);
  });
});

test("MLX active memory and live handles return to baseline", () => {
  expect(memory.liveHandles()).toBe(base.handles);
  expect(memory.active()).toBe(base.active);
});
