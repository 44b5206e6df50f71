import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { memory, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine, type GenerateRequest, rejectionSample, Scheduler, SpeculativeDecoder } from "../src/index.ts";
import { mlxLmSpeculative, speculativePairs, tinyModels } from "./helpers.ts";

// Plain-greedy equality uses float32 targets, so that the verify pass (k + 1 tokens at once) and
// single-token steps round alike: in bf16 two logits can tie in one path and not the other
// (docs/speculative.md). bf16 targets are compared with mlx-lm's speculative output instead.
let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  models = tinyModels(speculativePairs(["small", "dense", "moe"]));
});
afterAll(() => models.cleanup());

// 40 prompt tokens wrap the tiny models' sliding window of 8 before decoding starts; 5 (+ 12
// decoded) wrap it during.
const LONG = Array.from({ length: 40 }, (_, i) => 7 + ((i * 53) % 300));
const SHORT = LONG.slice(0, 5);

async function tokens(gen: { generate(r: GenerateRequest): { result: Promise<{ tokens: number[] }> } }, req: GenerateRequest): Promise<number[]> {
  return (await gen.generate(req).result).tokens;
}

describe("greedy speculative output equals plain greedy output", () => {
  for (const variant of ["small", "dense", "moe"]) {
    for (const kv of variant === "small" ? ["bf16", "q8", "turbo:4,3"] : ["bf16", "q8"]) {
      test(`${variant}, KV ${kv}: quantized draft (partial acceptance) and a smaller random draft (rejections)`, async () => {
        // Every layer in the mode: the sliding layers' rotating caches quantized (and rewound) too.
        using target = Engine.load(models.path(variant), { kv, kvSliding: kv });
        using close = Engine.load(models.path(`${variant}-draft4bit`), { kv, kvSliding: kv });
        using small = Engine.load(models.path("draft-small"), { kv, kvSliding: kv });
        for (const prompt of [LONG, SHORT]) {
          const req = { promptIds: prompt, maxTokens: 12 };
          const plain = await tokens(target, req);
          for (const [draft, k] of [
            [close, 3],
            [small, 2],
          ] as const) {
            const sd = new SpeculativeDecoder(target, draft, { numDraftTokens: k });
            const r = await sd.generate(req).result;
            expect(r.tokens, `draft ${draft === close ? "4-bit" : "small"}, k ${k}, prompt ${prompt.length}`).toEqual(plain);
            expect(r.speculative!.drafted).toBeGreaterThan(0);
            if (draft === close && kv === "bf16") expect(r.speculative!.accepted).toBeGreaterThan(0);
          }
        }
      });
    }
  }

  test("equals mlx-lm's speculative_generate_step on the same pair, float32 and bf16 targets (a window that does not wrap: mlx-lm's rotating trim is exact only then)", async () => {
    // A prompt whose 20 greedy tokens hold no eos on either pair (mlx-lm's step function does not stop there).
    const prompt = LONG.slice(0, 16);
    const [f32, bf16] = mlxLmSpeculative(
      [
        [models.path("w64"), models.path("w64-draft4bit")],
        [models.path("w64-bf16"), models.path("w64-bf16-draft4bit")],
      ],
      prompt,
      20,
      3,
    );
    // float32: mlx-lm's speculative tokens are its plain greedy tokens, and so are ours.
    expect(f32!.tokens).toEqual(f32!.plain);
    for (const [name, ref] of [
      ["w64", f32!],
      ["w64-bf16", bf16!],
    ] as const) {
      using target = Engine.load(models.path(name));
      using draft = Engine.load(models.path(`${name}-draft4bit`));
      const r = await new SpeculativeDecoder(target, draft, { numDraftTokens: 3 }).generate({ promptIds: prompt, maxTokens: 20 }).result;
      // bf16: both sides verify through the same multi-token pass, so they agree token for token.
      expect(r.tokens, name).toEqual(ref.tokens);
      // mlx-lm flags the tokens it took from the draft: its acceptance equals ours.
      expect(r.speculative!.accepted, name).toBe(ref.from_draft.filter(Boolean).length);
      expect(r.speculative!.accepted, name).toBeGreaterThan(0);
    }
  });
});

describe("through the Scheduler", () => {
  test("a speculative request gives exactly the plain greedy tokens while num_draft_tokens 0 requests batch beside it", async () => {
    using target = Engine.load(models.path("small"));
    using draft = Engine.load(models.path("small-draft4bit"));
    const sd = new SpeculativeDecoder(target, draft, { numDraftTokens: 3 });
    const specReq: GenerateRequest = { promptIds: LONG, maxTokens: 24 };
    const plainReqs: GenerateRequest[] = [0, 1, 2].map((i) => ({ promptIds: LONG.slice(i, 6 + 3 * i), maxTokens: 6, numDraftTokens: 0 }));
    const alone: number[][] = [];
    for (const r of [specReq, ...plainReqs]) alone.push(await tokens(target, r));
    const sched = new Scheduler(target, { maxBatch: 4, speculative: sd });
    const finished: string[] = [];
    const run = (name: string, req: GenerateRequest) =>
      sched.submit(req).result.then((r) => {
        finished.push(name);
        return r;
      });
    const [spec, ...plain] = await Promise.all([run("spec", specReq), ...plainReqs.map((r, i) => run(`plain${i}`, r))]);
    await sched.close();
    expect(spec!.tokens).toEqual(alone[0]);
    expect(spec!.speculative!.drafted).toBeGreaterThan(0);
    plain.forEach((r, i) => {
      expect(r.tokens, `plain ${i}`).toEqual(alone[i + 1]);
      expect(r.speculative, `plain ${i}`).toBeUndefined();
    });
    // The plain requests ran in the batch while the speculative one was still decoding, together:
    // 3 requests of 6 tokens in fewer decode steps than one at a time would take.
    expect(finished.at(-1)).toBe("spec");
    expect(sched.stats.decodeSteps).toBeLessThan(3 * 5);
  });
});

describe("speculative sampling", () => {
  test("rejection sampling: emitted tokens follow the target distribution (chi-square, 6 tokens, 20000 trials)", () => {
    const p = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05];
    const q = [0.05, 0.1, 0.2, 0.3, 0.15, 0.2];
    const N = 20000;
    const V = p.length;
    using lp1 = MlxArray.fromNumbers(p.map(Math.log), [1, V], "float32");
    using lq1 = MlxArray.fromNumbers(q.map(Math.log), [1, V], "float32");
    // N independent trials as N rows (rows of rejectionSample are independent); row N is the bonus row.
    using P = mx.broadcast_to(lp1, [N + 1, V]);
    using Q = mx.broadcast_to(lq1, [N, V]);
    using kd = mx.random.key(11);
    using drafted = mx.random.categorical(Q, { key: kd });
    using key = mx.random.key(12);
    using r = rejectionSample(P, Q, drafted, key);
    const acc = r.accept.toFloat64Array();
    const cand = r.candidates.toFloat64Array();
    const d = drafted.toFloat64Array();
    const spec = new Array<number>(V).fill(0);
    const draftOnly = new Array<number>(V).fill(0);
    let kept = 0;
    for (let i = 0; i < N; i++) {
      spec[acc[i] ? d[i]! : cand[i]!]!++;
      draftOnly[d[i]!]!++;
      if (acc[i]) kept++;
    }
    const chi2 = (counts: number[]) => counts.reduce((s, c, i) => s + (c - N * p[i]!) ** 2 / (N * p[i]!), 0);
    // 5 degrees of freedom: P(chi2 > 20.5) = 0.001.
    expect(chi2(spec)).toBeLessThan(20.5);
    // The test can fail: always keeping the draft gives the draft's distribution.
    expect(chi2(draftOnly)).toBeGreaterThan(1000);
    // Expected acceptance is sum(min(p, q)).
    const alpha = p.reduce((s, pi, i) => s + Math.min(pi, q[i]!), 0);
    expect(Math.abs(kept / N - alpha)).toBeLessThan(0.02);
  });

  test("seeded speculative sampling is reproducible and reports acceptance; memory returns to baseline", async () => {
    using target = Engine.load(models.path("small"));
    using draft = Engine.load(models.path("small-draft4bit"));
    const sd = new SpeculativeDecoder(target, draft);
    const req = { promptIds: LONG, maxTokens: 20, sampling: { temperature: 0.8, topP: 0.95, seed: 3 } };
    await sd.generate(req).result;
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    const a = await sd.generate(req).result;
    const b = await sd.generate(req).result;
    expect(b.tokens).toEqual(a.tokens);
    expect(a.tokens.length).toBe(20);
    expect(a.speculative!.drafted).toBeGreaterThan(0);
    expect(a.speculative!.accepted).toBeLessThanOrEqual(a.speculative!.drafted);
    const c = await sd.generate({ ...req, sampling: { ...req.sampling, seed: 4 } }).result;
    expect(c.tokens).not.toEqual(a.tokens);
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });
});

describe("start-up checks", () => {
  test("a draft with another vocabulary is refused; a bad num_draft_tokens is a clear error", () => {
    using target = Engine.load(models.path("small"));
    using other = Engine.load(models.path("draft-vocab"));
    expect(() => new SpeculativeDecoder(target, other)).toThrow(/output layer has 256 logits, the target's 512/);
    using draft = Engine.load(models.path("draft-small"));
    expect(() => new SpeculativeDecoder(target, draft, { numDraftTokens: -1 })).toThrow(/numDraftTokens must be an integer in 0\.\.64/);
    const sd = new SpeculativeDecoder(target, draft);
    expect(() => sd.generate({ promptIds: LONG, maxTokens: 4, numDraftTokens: 1.5 })).toThrow(/num_draft_tokens must be an integer/);
  });
});
