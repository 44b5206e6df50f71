// Prompt reuse across chat turns once a sliding window has wrapped (8-token window): the scheduler
// keeps a snapshot at each request's cache checkpoints and at its prompt's end, so a repeated
// prompt and a next turn that extends the history reuse them; tokens equal a cold run with the
// same prefill chunks.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { memory } from "@mlx-bun/mlx-ffi";
import { Engine, type GenerateRequest, PromptCache, Scheduler } from "../src/index.ts";
import { tinyModels } from "./helpers.ts";

let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  models = tinyModels({ small: ["--variant", "small"] });
});
afterAll(() => models.cleanup());

const ids = (seed: number, n: number): number[] => Array.from({ length: n }, (_, j) => 7 + ((seed * 31 + j * 53) % 300));

describe("multi-turn prompt reuse with a wrapped sliding window", () => {
  test("a repeated prompt reuses all but its last token; a next turn reuses the history checkpoint", async () => {
    using e = Engine.load(models.path("small"));
    // Turn 1: history (system + user) then a 3-token generation prompt; turn 2 extends the history.
    const history1 = ids(1, 40);
    const turn1: GenerateRequest = { promptIds: [...history1, 5, 6, 7], maxTokens: 12, cacheCheckpoints: [history1.length] };
    const history2 = [...history1, ...ids(2, 15), ...ids(3, 20)];
    const turn2: GenerateRequest = { promptIds: [...history2, 5, 6, 7], maxTokens: 12, cacheCheckpoints: [history2.length] };
    // Cold runs with the same prefill chunks (with a prompt cache, a chunk ends at each checkpoint).
    const coldRun = async (req: GenerateRequest) => {
      using pc = new PromptCache({ maxBytes: 64 * 1024 * 1024 });
      const s = new Scheduler(e, { promptCache: pc });
      const r = await s.submit(req).result;
      await s.close();
      expect(r.cachedTokens).toBe(0);
      return r;
    };
    const c1 = await coldRun(turn1);
    const c2 = await coldRun({ ...turn2, cacheCheckpoints: [history1.length, history2.length] });
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();

    const pc = new PromptCache({ maxBytes: 64 * 1024 * 1024 });
    const warm = new Scheduler(e, { promptCache: pc });
    const w1 = await warm.submit(turn1).result;
    expect(w1.cachedTokens).toBe(0);
    expect(w1.tokens).toEqual(c1.tokens);
    // The same prompt again: everything but its last token comes from the prompt-end snapshot.
    const again = await warm.submit(turn1).result;
    expect(again.cachedTokens).toBe(turn1.promptIds.length - 1);
    expect(again.tokens).toEqual(c1.tokens);
    // The next turn extends turn 1's history (not its generation prompt or reply).
    const w2 = await warm.submit(turn2).result;
    expect(w2.cachedTokens).toBe(history1.length);
    expect(w2.tokens).toEqual(c2.tokens);
    await warm.close();
    pc.dispose();
    memory.clearCache();
    expect(memory.active()).toBe(base);
    expect(memory.liveHandles()).toBe(handles);
  });
});
