import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { memory } from "@mlx-bun/mlx-ffi";
import { Engine, type GenerateRequest } from "../src/index.ts";
import { mlxLmGenerate, tinyModels } from "./helpers.ts";

let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  models = tinyModels({ small: ["--variant", "small"], moe: ["--variant", "moe", "--quant", "4bit", "--dtype", "float32"] });
});
afterAll(() => models.cleanup());

const PROMPT = Array.from({ length: 40 }, (_, i) => 7 + ((i * 53) % 300));

async function run(e: Engine, req: GenerateRequest): Promise<{ tokens: number[]; text: string; streamed: string; logprobs: number[]; finish: string }> {
  const s = e.generate(req);
  let streamed = "";
  const logprobs: number[] = [];
  for await (const ev of s) {
    streamed += ev.text;
    if (ev.logprob !== undefined) logprobs.push(ev.logprob);
  }
  const r = await s.result;
  return { tokens: r.tokens, text: r.text, streamed, logprobs, finish: r.finishReason };
}

describe("generation", () => {
  for (const [name, step, backgroundEval] of [
    ["small", 2048, true],
    ["small", 16, true],
    ["moe", 9, true],
    ["small", 16, false],
    ["moe", 9, false],
  ] as const) {
    test(`greedy tokens and log-probabilities equal mlx-lm generate_step (${name}, prefill step ${step}, background eval ${backgroundEval ? "on" : "off"})`, async () => {
      using e = Engine.load(models.path(name), { prefillStep: step, backgroundEval });
      const ref = mlxLmGenerate(models.path(name), PROMPT, 24, step);
      const ours = await run(e, { promptIds: PROMPT, maxTokens: 24, logprobs: 0 });
      expect(ours.tokens).toEqual(ref.tokens);
      // bf16/f32 log-probabilities read as numbers: identical values
      expect(ours.logprobs).toEqual(ref.logprobs);
    });
  }

  test("streamed text is the UTF-8-safe decode of the tokens; stop strings cut the text", async () => {
    using e = Engine.load(models.path("small"));
    const a = await run(e, { promptIds: PROMPT, maxTokens: 30 });
    expect(a.streamed).toBe(a.text);
    expect(a.text).toBe(e.loaded.tokenizer.decode(a.tokens, { skipSpecialTokens: true }));
    expect(a.finish).toBe("length");
    const cutAt = a.text.slice(3, 5);
    if (cutAt.length === 2) {
      const b = await run(e, { promptIds: PROMPT, maxTokens: 30, stop: [cutAt] });
      expect(b.finish).toBe("stop");
      expect(b.text).toBe(a.text.slice(0, a.text.indexOf(cutAt)));
      expect(b.streamed).toBe(b.text);
    }
    const c = await run(e, { promptIds: PROMPT, maxTokens: 30, stopTokenIds: [a.tokens[4]!] });
    expect(c.finish).toBe("stop");
    expect(c.tokens).toEqual(a.tokens.slice(0, a.tokens.indexOf(a.tokens[4]!) + 1));
  });

  test("seeded sampling is reproducible, different seeds differ", async () => {
    using e = Engine.load(models.path("small"));
    const sampling = { temperature: 1.5, topP: 0.95, seed: 7 };
    const a = await run(e, { promptIds: PROMPT, maxTokens: 16, sampling });
    const b = await run(e, { promptIds: PROMPT, maxTokens: 16, sampling });
    const c = await run(e, { promptIds: PROMPT, maxTokens: 16, sampling: { ...sampling, seed: 8 } });
    expect(a.tokens).toEqual(b.tokens);
    expect(c.tokens).not.toEqual(a.tokens);
    const pen = await run(e, { promptIds: PROMPT, maxTokens: 16, sampling: { repetitionPenalty: 1.5, presencePenalty: 0.5, frequencyPenalty: 0.5 } });
    expect(pen.tokens.length).toBe(16);
  });

  test("cancellation stops at the next step; memory returns to baseline", async () => {
    using e = Engine.load(models.path("small"));
    await run(e, { promptIds: PROMPT, maxTokens: 2 }); // warm up
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    const ac = new AbortController();
    const s = e.generate({ promptIds: PROMPT, maxTokens: 200, signal: ac.signal });
    let n = 0;
    for await (const _ of s) if (++n === 5) ac.abort();
    const r = await s.result;
    expect(r.finishReason).toBe("cancelled");
    expect(r.tokens.length).toBeLessThanOrEqual(6);
    for (let i = 0; i < 3; i++) await run(e, { promptIds: PROMPT, maxTokens: 8, logprobs: 3 });
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });

  test("bad requests are clear errors", () => {
    using e = Engine.load(models.path("small"));
    expect(() => e.generate({ promptIds: [], maxTokens: 4 })).toThrow(/prompt is empty/);
    expect(() => e.generate({ promptIds: [1, 99999], maxTokens: 4 })).toThrow(/token id 99999 is outside the vocabulary/);
    expect(() => e.generate({ promptIds: [1], maxTokens: 0 })).toThrow(/max_tokens must be a positive integer/);
    expect(() => e.generate({ promptIds: [1], maxTokens: 10 ** 7 })).toThrow(/exceeds the model's context/);
  });
});

describe("faults", () => {
  test("a generation fault is an error of the stream (alone and batched), not a cancelled result; the scheduler keeps serving", async () => {
    // A KV mode the model cannot hold is refused at load (q8 needs head dims divisible by 64; the
    // tiny model's sliding layers have 32, which a quantized kv leaves bf16 unless kvSliding says so).
    expect(() => Engine.load(models.path("small"), { kv: "q8", kvSliding: "q8" })).toThrow(/group size 64/);
    // A forward pass that fails mid-generation.
    const loaded = (await import("@mlx-bun/models")).loadModel(models.path("small"));
    const failing = {
      makeCaches: (m?: Parameters<typeof loaded.model.makeCaches>[0]) => loaded.model.makeCaches(m),
      forward: () => {
        throw new Error("the forward pass failed: group size 64 (injected)");
      },
    };
    using e = new Engine(loaded, { stepModel: failing });
    const s = e.generate({ promptIds: PROMPT, maxTokens: 4 });
    await expect(s.result).rejects.toThrow(/group size 64/);
    const it = s[Symbol.asyncIterator]();
    await expect(it.next()).rejects.toThrow(/group size 64/);
    const { Scheduler } = await import("../src/index.ts");
    const sched = new Scheduler(e);
    await expect(sched.submit({ promptIds: PROMPT, maxTokens: 4 }).result).rejects.toThrow(/group size 64/);
    await expect(sched.submit({ promptIds: PROMPT, maxTokens: 4 }).result).rejects.toThrow(/group size 64/);
    await sched.close();
    using ok = Engine.load(models.path("small"));
    const r = await ok.generate({ promptIds: PROMPT, maxTokens: 3 }).result;
    expect(r.tokens.length).toBe(3);
  });
});
