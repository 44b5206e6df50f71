// The one decode pipeline (runner.ts): a lone request runs on single-sequence caches and keeps its
// tokens when others join it mid-stream; per-row logits processors equal mlx-lm's
// logits_processors alone and inside a batch; the FIFO lock hands over without polling.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine, type GenerateRequest, type GenerationStream, type LogitsProcessor, Mutex, Scheduler } from "../src/index.ts";
import { mlxLmGenerate, tinyModels } from "./helpers.ts";

let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  models = tinyModels({ small: ["--variant", "small"], dense: ["--variant", "dense"] });
});
afterAll(() => models.cleanup());

function prompt(i: number, n = 12): number[] {
  return Array.from({ length: n }, (_, j) => 7 + ((i * 31 + j * 53) % 300));
}

async function drain(s: GenerationStream): Promise<{ tokens: number[]; logprobs: number[] }> {
  const logprobs: number[] = [];
  for await (const ev of s) if (ev.logprob !== undefined) logprobs.push(ev.logprob);
  return { tokens: (await s.result).tokens, logprobs };
}

/** logits[:, ids] = -inf for a host list of ids (a [1, V] mask, as `logits[:, ids] = -inf` in Python). */
function banIds(logits: MlxArray, ids: Iterable<number>): MlxArray {
  const V = logits.shape[logits.ndim - 1]!;
  const mask = new Uint8Array(V);
  for (const i of ids) mask[i] = 1;
  using m = MlxArray.fromTypedArray(mask, [1, V], "bool");
  return mx.where(m, Number.NEGATIVE_INFINITY, logits);
}

const ban = (ids: number[]): LogitsProcessor => ({ readsHistory: false, process: (_h, logits) => banIds(logits, ids) });
const noRepeat = (promptLength: number): LogitsProcessor => ({ process: (h, logits) => banIds(logits, new Set(h.slice(promptLength))) });
/** The same ban with its state computed asynchronously (as a grammar matcher's mask), checked against the history it is given. */
const asyncNoRepeat = (promptLength: number): LogitsProcessor => {
  let banned = new Set<number>();
  let seen = promptLength;
  return {
    async advance(h) {
      await Bun.sleep(0);
      banned = new Set(h.slice(promptLength));
      seen = h.length;
    },
    process(h, logits) {
      if (h.length !== seen) throw new Error(`process called for ${h.length} ids after advance for ${seen}`);
      return banIds(logits, banned);
    },
  };
};

describe("decode pipeline", () => {
  for (const backgroundEval of [true, false]) {
    test(`a lone request keeps its tokens when others join it mid-stream (window 8 wraps; background eval ${backgroundEval ? "on" : "off"})`, async () => {
      using e = Engine.load(models.path("small"), { backgroundEval });
      const reqs: GenerateRequest[] = [0, 1, 2, 3].map((i) => ({ promptIds: prompt(i, 10 + 3 * i), maxTokens: 30, logprobs: 0 }));
      const alone: { tokens: number[]; logprobs: number[] }[] = [];
      for (const r of reqs) alone.push(await drain(e.generate(r)));
      const base = memory.active();
      const sched = new Scheduler(e, { maxBatch: 8 });
      const first = sched.submit(reqs[0]!);
      const firstDone = drain(first);
      // Let the first run alone for a few steps, then join two, then one more.
      while (sched.stats.decodeSteps < 5) await Bun.sleep(1);
      expect(sched.batchSize).toBe(1);
      const rest = [sched.submit(reqs[1]!), sched.submit(reqs[2]!)].map(drain);
      while (sched.stats.decodeSteps < 12) await Bun.sleep(1);
      rest.push(drain(sched.submit(reqs[3]!)));
      const together = await Promise.all([firstDone, ...rest]);
      await sched.close();
      expect(sched.stats.largestPrefill).toBe(2);
      together.forEach((t, i) => {
        expect(t.tokens, `request ${i}`).toEqual(alone[i]!.tokens);
        expect(t.logprobs, `request ${i}`).toEqual(alone[i]!.logprobs);
      });
      expect(memory.active()).toBe(base);
    });
  }

  test("logits processors = mlx-lm's logits_processors (history-free ban, history-reading no-repeat, the same with async per-step work), alone and batched", async () => {
    using e = Engine.load(models.path("dense"));
    const p = prompt(5, 20);
    const plain = mlxLmGenerate(models.path("dense"), p, 16);
    const banned = plain.tokens.slice(0, 3);
    const refBan = mlxLmGenerate(models.path("dense"), p, 16, 2048, { ban: banned });
    const refNoRepeat = mlxLmGenerate(models.path("dense"), p, 16, 2048, { noRepeat: true });
    const refBoth = mlxLmGenerate(models.path("dense"), p, 16, 2048, { ban: banned, noRepeat: true });
    // The processors change the output (else the test proves nothing).
    expect(refBan.tokens).not.toEqual(plain.tokens);
    expect(new Set(refNoRepeat.tokens).size).toBe(refNoRepeat.tokens.length);
    // mlx-lm's generate_step runs to max_tokens; ours stops at an end-of-sequence id.
    const eos = new Set(e.loaded.tokenizer.eosTokenIds);
    const upToEos = (r: { tokens: number[]; logprobs: number[] }) => {
      const n = r.tokens.findIndex((t) => eos.has(t)) + 1 || r.tokens.length;
      return { tokens: r.tokens.slice(0, n), logprobs: r.logprobs.slice(0, n) };
    };
    const reqs: [GenerateRequest, { tokens: number[]; logprobs: number[] }][] = [
      [{ promptIds: p, maxTokens: 16, logprobs: 0 }, plain],
      [{ promptIds: p, maxTokens: 16, logprobs: 0, logitsProcessors: [ban(banned)] }, refBan],
      [{ promptIds: p, maxTokens: 16, logprobs: 0, logitsProcessors: [noRepeat(p.length)] }, refNoRepeat],
      [{ promptIds: p, maxTokens: 16, logprobs: 0, logitsProcessors: [ban(banned), noRepeat(p.length)] }, refBoth],
      [{ promptIds: p, maxTokens: 16, logprobs: 0, logitsProcessors: [asyncNoRepeat(p.length)] }, refNoRepeat],
    ];
    for (const [req, ref] of reqs) {
      const ours = await drain(e.generate(req));
      expect(ours).toEqual(upToEos(ref));
    }
    // Batched: each row with its own processors gives its tokens alone.
    const sched = new Scheduler(e, { maxBatch: 4 });
    // Fresh processors (the async one holds state per request).
    const fresh = (r: GenerateRequest, i: number): GenerateRequest => (i === 4 ? { ...r, logitsProcessors: [asyncNoRepeat(p.length)] } : r);
    const together = await Promise.all(reqs.map(([r], i) => drain(sched.submit(fresh(r, i)))));
    await sched.close();
    together.forEach((t, i) => expect(t.tokens, `row ${i}`).toEqual(upToEos(reqs[i]![1]).tokens));
  });

  test("Mutex: FIFO hand-over, no polling", async () => {
    const lock = new Mutex();
    const order: number[] = [];
    const work = async (i: number, ms: number) => {
      using _ = await lock.acquire();
      order.push(i);
      await Bun.sleep(ms);
      order.push(-i);
    };
    await Promise.all([work(1, 5), work(2, 1), work(3, 0)]);
    expect(order).toEqual([1, -1, 2, -2, 3, -3]);
    expect(lock.locked).toBe(false);
  });
});
