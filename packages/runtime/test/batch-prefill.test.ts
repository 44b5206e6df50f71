// Batched prefill in the scheduler: requests that arrive together are prefilled as one padded
// batch and join a running decode batch; each must produce what it produces alone, and what
// mlx-lm's BatchGenerator produces for the same batch.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { join } from "node:path";
import { memory } from "@mlx-bun/mlx-ffi";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { Engine, type GenerateRequest, PromptCache, Scheduler } from "../src/index.ts";
import { ROOT, tinyModels } from "./helpers.ts";

let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  models = tinyModels({
    small: ["--variant", "small"],
    dense: ["--variant", "dense"],
    // MLX's CPU backend runs the bf16 MoE expert matmul in float32 only.
    moe: ["--variant", "moe", "--dtype", "float32"],
    // TurboQuant needs head dims of 64 or more.
    small64: ["--variant", "small", "--set", "head_dim=64"],
  });
});
afterAll(() => models.cleanup());

function prompt(i: number, n: number): number[] {
  return Array.from({ length: n }, (_, j) => 7 + ((i * 31 + j * 53) % 300));
}

interface Out {
  tokens: number[];
  logprobs: number[];
}

async function drain(s: AsyncIterable<{ logprob?: number }> & { result: Promise<{ tokens: number[] }> }, onToken?: (n: number) => void): Promise<Out> {
  const logprobs: number[] = [];
  for await (const ev of s) {
    logprobs.push(ev.logprob ?? Number.NaN);
    onToken?.(logprobs.length);
  }
  return { tokens: (await s.result).tokens, logprobs };
}

async function alone(e: Engine, reqs: readonly GenerateRequest[]): Promise<Out[]> {
  const out: Out[] = [];
  for (const r of reqs) out.push(await drain(e.generate(r)));
  return out;
}

// The sliding window of the tiny models is 8 tokens and the prefill step below is 16: several
// prompts are longer than the window, and longer than one chunk.
const EARLY = [12, 5, 30];
const LATE = [3, 40, 9, 2, 25, 70];

describe("batched prefill", () => {
  const cases = [
    { model: "small", kv: "bf16", exact: true },
    { model: "dense", kv: "bf16", exact: true },
    { model: "moe", kv: "bf16", exact: false },
    // TurboQuant on every layer: the sliding layers' rotating caches quantized too (kvSliding given).
    { model: "small64", kv: "turbo:4,3", kvSliding: "turbo:4,3", exact: true },
    // TurboQuant on the full-attention layers only; the sliding layers keep bf16 (the default).
    { model: "small64", kv: "turbo:4,3", exact: true },
  ] as const;
  for (const c of cases) {
    const sliding = "kvSliding" in c ? c.kvSliding : undefined;
    test(`${c.model} ${c.kv}${sliding ? ` (sliding ${sliding})` : ""}: requests of different lengths arriving together are prefilled as one batch next to running requests; each equals its solo run`, async () => {
      using e = Engine.load(models.path(c.model), { kv: c.kv, prefillStep: 16, ...(sliding ? { kvSliding: sliding } : {}) });
      if (c.kv !== "bf16" && !sliding) {
        // Each layer type's caches carry its mode's codec.
        const caches = e.makeCaches();
        const types = e.loaded.config.text.layerTypes.slice(0, caches.length);
        caches.forEach((cache, i) =>
          expect((cache as unknown as { codec: { name: string } }).codec.name, `layer ${i}`).toBe(
            types[i] === "full_attention" ? "kv:turboquant:4:3" : "kv:plain",
          ),
        );
        for (const cache of caches) cache.dispose();
        expect(() => Engine.load(models.path(c.model), { kv: c.kv, kvSliding: "q5" })).toThrow(/unknown KV mode "q5"/);
      }
      const early: GenerateRequest[] = EARLY.map((n, i) => ({ promptIds: prompt(i, n), maxTokens: 20, logprobs: 0 }));
      const late: GenerateRequest[] = LATE.map((n, i) => ({ promptIds: prompt(i + 10, n), maxTokens: 6 + i, logprobs: 0 }));
      const solo = await alone(e, [...early, ...late]);
      memory.clearCache();
      const base = memory.active();
      const handles = memory.liveHandles();
      const sched = new Scheduler(e, { maxBatch: 16, prefillBatch: 8 });
      let started!: () => void;
      const twoTokens = new Promise<void>((r) => (started = r));
      const first = early.map((r, i) => drain(sched.submit(r), i === 0 ? (n) => n === 2 && started() : undefined));
      // (A failing early request ends the wait too, so a fault shows as its error, not a timeout.)
      await Promise.race([twoTokens, Promise.all(first)]);
      // The early requests are decoding when the late ones arrive (all in one tick).
      expect(sched.batchSize).toBe(EARLY.length);
      const second = late.map((r) => drain(sched.submit(r)));
      const got = await Promise.all([...first, ...second]);
      await sched.close();
      expect(sched.stats.prefills).toBe(2);
      expect(sched.stats.largestPrefill).toBe(LATE.length);
      got.forEach((g, i) => {
        expect(g.tokens, `request ${i}`).toEqual(solo[i]!.tokens);
        // bf16/TurboQuant: bit-identical log-probabilities; float32 MoE: within 1e-4 (measured 3e-6).
        if (c.exact) expect(g.logprobs, `request ${i}`).toEqual(solo[i]!.logprobs);
        else g.logprobs.forEach((x, j) => expect(Math.abs(x - solo[i]!.logprobs[j]!), `request ${i} token ${j}`).toBeLessThan(1e-4));
      });
      memory.clearCache();
      expect(memory.liveHandles()).toBe(handles);
      expect(memory.active()).toBe(base);
    });
  }

  for (const name of ["small", "dense", "moe"]) {
    test(`${name}: greedy tokens and log-probabilities equal mlx-lm's BatchGenerator on the same batch (prefill step 16)`, async () => {
      using e = Engine.load(models.path(name), { prefillStep: 16 });
      const reqs: GenerateRequest[] = [...EARLY, ...LATE].map((n, i) => ({ promptIds: prompt(i, n), maxTokens: 5 + i, logprobs: 0 }));
      const sched = new Scheduler(e, { maxBatch: 16, prefillBatch: 16 });
      const got = await Promise.all(reqs.map((r) => drain(sched.submit(r))));
      await sched.close();
      expect(sched.stats.prefills).toBe(1);
      const ref = JSON.parse(
        runPython([
          join(ROOT, "tools", "oracle", "batch_generate_oracle.py"),
          models.path(name),
          "--prompts",
          JSON.stringify(reqs.map((r) => r.promptIds)),
          "--max-tokens",
          JSON.stringify(reqs.map((r) => r.maxTokens)),
          "--eos",
          [...e.loaded.tokenizer.eosTokenIds].join(","),
          "--prefill-step",
          "16",
          "--prefill-batch",
          "16",
        ]),
      ) as { tokens: number[][]; logprobs: number[][] };
      got.forEach((g, i) => {
        expect(g.tokens, `request ${i}`).toEqual(ref.tokens[i]);
        expect(g.logprobs, `request ${i}`).toEqual(ref.logprobs[i]);
      });
    });
  }

  test("prompt-cache prefixes of different lengths and fresh prompts prefill together; each equals a cold run", async () => {
    using e = Engine.load(models.path("small"), { prefillStep: 16 });
    const a = prompt(1, 20);
    const b = prompt(2, 6);
    const cold = new Scheduler(e);
    const ra = await cold.submit({ promptIds: a, maxTokens: 4 }).result;
    const rb = await cold.submit({ promptIds: b, maxTokens: 4 }).result;
    const follow: GenerateRequest[] = [
      { promptIds: [...a, ...ra.tokens, 11, 12, 13], maxTokens: 7 },
      { promptIds: prompt(3, 33), maxTokens: 7 },
      { promptIds: [...b, ...rb.tokens, 21], maxTokens: 7 },
    ];
    const want = await Promise.all(follow.map((r) => cold.submit(r).result));
    await cold.close();
    using pc = new PromptCache({ maxBytes: 64 * 1024 * 1024 });
    const warm = new Scheduler(e, { promptCache: pc });
    await warm.submit({ promptIds: a, maxTokens: 4 }).result;
    await warm.submit({ promptIds: b, maxTokens: 4 }).result;
    const prefills = warm.stats.prefills;
    const got = await Promise.all(follow.map((r) => warm.submit(r).result));
    await warm.close();
    expect(warm.stats.prefills).toBe(prefills + 1);
    // The finished requests' caches hold their prompts and every generated token (the last one is fed too).
    expect(got.map((g) => g.cachedTokens)).toEqual([a.length + ra.tokens.length, 0, b.length + rb.tokens.length]);
    got.forEach((g, i) => expect(g.tokens, `request ${i}`).toEqual(want[i]!.tokens));
  });
});

describe("prefill groups", () => {
  test("a short prompt splits off its group and decodes between the long prompts' chunks; a row cancelled mid-prefill leaves; memory returns to baseline", async () => {
    using e = Engine.load(models.path("small"), { prefillStep: 4 });
    const reqs: GenerateRequest[] = [
      { promptIds: prompt(1, 3), maxTokens: 30, logprobs: 0 },
      { promptIds: prompt(2, 60), maxTokens: 6, logprobs: 0 },
      { promptIds: prompt(3, 50), maxTokens: 6, logprobs: 0 },
    ];
    const solo = await alone(e, reqs);
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    const sched = new Scheduler(e);
    const ac = new AbortController();
    let shortTokens = 0;
    let shortAtLongFirst = -1;
    const short = drain(sched.submit(reqs[0]!), (n) => {
      shortTokens = n;
      if (n === 1) ac.abort();
    });
    const cancelled = sched.submit({ ...reqs[1]!, signal: ac.signal });
    const long = drain(sched.submit(reqs[2]!), (n) => {
      if (n === 1) shortAtLongFirst = shortTokens;
    });
    const [a, c] = await Promise.all([short, long]);
    const b = await cancelled.result;
    await sched.close();
    expect(sched.stats.prefills).toBe(1);
    expect(b.finishReason).toBe("cancelled");
    expect(b.tokens).toEqual([]);
    expect(a).toEqual(solo[0]);
    expect(c).toEqual(solo[2]);
    // 49 prompt tokens in chunks of 4: the short row decoded between them (one step per chunk).
    expect(shortAtLongFirst).toBeGreaterThanOrEqual(10);
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });
});

describe("pipelined decode", () => {
  test("rows with penalties, seeded sampling, logit bias, max_tokens 1, a one-token prompt and greedy rows decode together; each equals its solo run", async () => {
    using e = Engine.load(models.path("small"));
    const reqs: GenerateRequest[] = [
      { promptIds: prompt(1, 9), maxTokens: 14, logprobs: 0 },
      { promptIds: prompt(2, 17), maxTokens: 10, logprobs: 0, sampling: { repetitionPenalty: 1.5, frequencyPenalty: 0.5 } },
      { promptIds: prompt(3, 4), maxTokens: 12, logprobs: 0, sampling: { temperature: 0.9, seed: 7 } },
      { promptIds: prompt(4, 25), maxTokens: 8, logprobs: 0, sampling: { logitBias: { 9: 5 } } },
      { promptIds: prompt(5, 12), maxTokens: 1, logprobs: 0 },
      { promptIds: [9], maxTokens: 5, logprobs: 0 },
    ];
    const solo = await alone(e, reqs);
    const sched = new Scheduler(e);
    const got = await Promise.all(reqs.map((r) => drain(sched.submit(r))));
    await sched.close();
    got.forEach((g, i) => {
      expect(g.tokens, `request ${i}`).toEqual(solo[i]!.tokens);
      expect(g.logprobs, `request ${i}`).toEqual(solo[i]!.logprobs);
    });
  });
});
