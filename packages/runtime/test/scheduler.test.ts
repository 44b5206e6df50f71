import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { memory } from "@mlx-bun/mlx-ffi";
import { Engine, type GenerateRequest, Scheduler } from "../src/index.ts";
import { tinyModels } from "./helpers.ts";

let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  models = tinyModels({ small: ["--variant", "small"], dense: ["--variant", "dense"] });
});
afterAll(() => models.cleanup());

function prompt(i: number): number[] {
  const n = 5 + ((i * 7) % 23);
  return Array.from({ length: n }, (_, j) => 7 + ((i * 31 + j * 53) % 300));
}

async function collect(s: ReturnType<Scheduler["submit"]>): Promise<number[]> {
  for await (const _ of s) {
  }
  return (await s.result).tokens;
}

describe("continuous batching", () => {
  for (const [name, backgroundEval] of [
    ["small", true],
    ["dense", true],
    ["small", false],
  ] as const) {
    test(`${name}: 16 concurrent greedy requests each produce exactly the tokens they produce alone (background eval ${backgroundEval ? "on" : "off"})`, async () => {
      using e = Engine.load(models.path(name), { backgroundEval });
      const reqs: GenerateRequest[] = Array.from({ length: 16 }, (_, i) => ({ promptIds: prompt(i), maxTokens: 6 + (i % 5) * 3 }));
      const alone: number[][] = [];
      for (const r of reqs) {
        const s = e.generate(r);
        for await (const _ of s) {
        }
        alone.push((await s.result).tokens);
      }
      const sched = new Scheduler(e, { maxBatch: 16 });
      // Stagger arrivals so requests join a running batch and leave it at different steps.
      const streams: Promise<number[]>[] = [];
      for (let i = 0; i < reqs.length; i++) {
        streams.push(collect(sched.submit(reqs[i]!)));
        if (i % 4 === 3) await Bun.sleep(5);
      }
      const together = await Promise.all(streams);
      await sched.close();
      together.forEach((t, i) => expect(t, `request ${i}`).toEqual(alone[i]));
    });
  }

  test("random cancellations mid-stream do not disturb the others; memory returns to baseline", async () => {
    using e = Engine.load(models.path("small"));
    const reqs: GenerateRequest[] = Array.from({ length: 10 }, (_, i) => ({ promptIds: prompt(i + 3), maxTokens: 12 }));
    const alone: number[][] = [];
    for (const r of reqs) {
      const s = e.generate(r);
      for await (const _ of s) {
      }
      alone.push((await s.result).tokens);
    }
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    const sched = new Scheduler(e, { maxBatch: 8 });
    const cancel = new Set([1, 4, 7]);
    const results = await Promise.all(
      reqs.map(async (r, i) => {
        const ac = new AbortController();
        const s = sched.submit({ ...r, signal: ac.signal });
        let n = 0;
        for await (const _ of s) if (cancel.has(i) && ++n === 2 + (i % 3)) ac.abort();
        return s.result;
      }),
    );
    await sched.close();
    results.forEach((r, i) => {
      if (cancel.has(i)) {
        expect(r.finishReason).toBe("cancelled");
        expect(alone[i]!.slice(0, r.tokens.length)).toEqual(r.tokens);
      } else expect(r.tokens, `request ${i}`).toEqual(alone[i]);
    });
    expect(sched.active).toBe(0);
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });

  test("admission by memory budget: requests wait for memory, none starves, too-large ones are refused", async () => {
    using e = Engine.load(models.path("dense"));
    const one = new Scheduler(e).bytesFor(20, 10);
    const sched = new Scheduler(e, { memoryBudgetBytes: Math.floor(one * 2.5) });
    let peak = 0;
    const streams = Array.from({ length: 6 }, (_, i) => collect(sched.submit({ promptIds: prompt(i).slice(0, 5), maxTokens: 10 })));
    const timer = setInterval(() => (peak = Math.max(peak, sched.batchSize)), 1);
    const out = await Promise.all(streams);
    clearInterval(timer);
    await sched.close();
    expect(out.every((t) => t.length >= 1 && t.length <= 10)).toBe(true);
    expect(peak).toBeLessThanOrEqual(3);
    expect(() => sched.submit({ promptIds: prompt(1), maxTokens: 10 })).toThrow(/closed/);
    const tiny = new Scheduler(e, { memoryBudgetBytes: 100 });
    expect(() => tiny.submit({ promptIds: prompt(1), maxTokens: 10 })).toThrow(/needs \d+ bytes of KV cache, more than the budget of 100/);
  });
});

describe("scheduler with a prompt cache", () => {
  test("a follow-up request reuses the cached prefix and decodes the same tokens as a cold run", async () => {
    const { PromptCache } = await import("../src/index.ts");
    using e = Engine.load(models.path("dense"));
    const first = prompt(2);
    const cold = new Scheduler(e);
    const a = await cold.submit({ promptIds: first, maxTokens: 6 }).result;
    // A conversation's next turn: the old prompt + reply + new user tokens.
    const follow = [...first, ...a.tokens, 11, 12, 13];
    const coldFollow = await cold.submit({ promptIds: follow, maxTokens: 6 }).result;
    await cold.close();
    using pc = new PromptCache({ maxBytes: 64 * 1024 * 1024 });
    const warm = new Scheduler(e, { promptCache: pc });
    const a2 = await warm.submit({ promptIds: first, maxTokens: 6 }).result;
    expect(a2.tokens).toEqual(a.tokens);
    // The prompt-end snapshot and the finished request's caches: its window wrapped, so the longer
    // entry cannot be trimmed back and does not make the shorter one redundant.
    expect(pc.entries().map((x) => x.tokens)).toEqual([first.length - 1, first.length + a.tokens.length]);
    const b = await warm.submit({ promptIds: follow, maxTokens: 6 }).result;
    await warm.close();
    expect(b.cachedTokens).toBe(first.length + a.tokens.length);
    expect(b.tokens).toEqual(coldFollow.tokens);
    expect(pc.stats.hits).toBe(1);
  });
});
