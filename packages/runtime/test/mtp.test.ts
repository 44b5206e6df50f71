import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { memory } from "@mlx-bun/mlx-ffi";
import { loadAssistant } from "@mlx-bun/models";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { Engine, type GenerateRequest, PromptCache, Scheduler, SpeculativeDecoder } from "../src/index.ts";
import { mlxLmGenerate, ROOT, tinyModels } from "./helpers.ts";

// Gemma 4 MTP drafters (gemma4_assistant) made with mlx-vlm's own modules for tiny float32 targets:
// a random drafter (rejections), one with the centroid head of the E2B/E4B drafters, and an "echo"
// drafter whose drafts are the target's own predictions (random targets repeat, so rounds accept).
const DRAFTER = join(ROOT, "tools", "make-tiny-model", "make_tiny_drafter.py");
const ORACLE = join(ROOT, "tools", "oracle", "mtp_oracle.py");
const BASE = ["--dtype", "float32", "--set", "head_dim=64"];

let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  models = tinyModels({
    small: ["--variant", "small", ...BASE],
    moe: ["--variant", "moe", ...BASE],
    other: ["--variant", "small", ...BASE, "--set", "hidden_size=48"],
  });
  const drafters: [string, string, string[]][] = [
    ["small", "small-mtp", []],
    ["small", "small-mtp-ordered", ["--ordered", "--seed", "1"]],
    ["small", "small-mtp-echo", ["--echo"]],
    ["small", "small-mtp-4bit", ["--quant", "4bit", "--seed", "2"]],
    ["moe", "moe-mtp", ["--seed", "3"]],
    ["moe", "moe-mtp-echo", ["--echo"]],
  ];
  const argvs = drafters.map(([t, d, extra]) => ["--target", models.path(t), "--out", models.path(d), ...extra]);
  const driver = `import json, sys; sys.path.insert(0, ${JSON.stringify(join(ROOT, "tools", "make-tiny-model"))}); import make_tiny_drafter as m\nfor a in json.loads(sys.argv[1]): m.main(a)`;
  runPython(["-c", driver, JSON.stringify(argvs)]);
});
afterAll(() => models.cleanup());

const LONG = Array.from({ length: 40 }, (_, i) => 7 + ((i * 53) % 300));
const SHORT = LONG.slice(0, 5);

function oracle(
  target: string,
  drafter: string,
  ids: number[],
  maxTokens: number,
  k: number,
): { tokens: number[]; drafts: number[][]; accepted: number[]; plain: number[] } {
  return JSON.parse(runPython([ORACLE, target, drafter, "--ids", ids.join(","), "--max-tokens", String(maxTokens), "--num-draft-tokens", String(k)]));
}

describe("MTP drafters: the same drafted and accepted tokens as mlx-vlm's MTP path", () => {
  for (const [target, drafter] of [
    ["small", "small-mtp"],
    ["small", "small-mtp-ordered"],
    ["small", "small-mtp-echo"],
    ["moe", "moe-mtp"],
    ["moe", "moe-mtp-echo"],
  ] as const) {
    test(`${target} + ${drafter}`, async () => {
      // 5 + 24 tokens: the window of 8 wraps, and mlx-vlm's buffered sliding cache never compacts
      // (past max_size + 32 tokens its drafter's window is one token short: docs/speculative.md).
      const maxTokens = 24;
      const ref = oracle(models.path(target), models.path(drafter), SHORT, maxTokens, 3);
      using t = Engine.load(models.path(target));
      using a = loadAssistant(models.path(drafter));
      const rounds: { drafted: number[]; accepted: number }[] = [];
      const sd = new SpeculativeDecoder(t, a, { onRound: (r) => rounds.push(r) });
      expect(sd.numDraftTokens).toBe(3);
      const r = await sd.generate({ promptIds: SHORT, maxTokens }).result;
      expect(r.tokens).toEqual(ref.plain);
      expect(ref.tokens).toEqual(ref.plain);
      // Our first round drafts nothing (a plain step gives the first token and the hidden state,
      // where mlx-vlm takes both from its prefill); every later round is one of mlx-vlm's.
      expect(rounds[0]!.drafted).toEqual([]);
      expect(rounds.slice(1).map((x) => x.drafted)).toEqual(ref.drafts);
      expect(rounds.slice(1).map((x) => x.accepted)).toEqual(ref.accepted);
      if (drafter.endsWith("echo")) expect(r.speculative!.accepted).toBeGreaterThan(0);
    });
  }
});

describe("MTP drafters: greedy output equals plain greedy output", () => {
  test("every KV mode whose caches trim, prompts that wrap the window before and during decoding; memory returns to its baseline", async () => {
    // Quantized modes on every layer (kvSliding: the sliding layers' rotating caches quantized and
    // trimmed too), and turbo:4,3's default, whose sliding layers keep the model dtype.
    for (const [kv, kvSliding] of [
      ["bf16", "bf16"],
      ["q8", "q8"],
      ["turbo:4,3", "turbo:4,3"],
      ["turbo:4,3", undefined],
    ] as const) {
      for (const opts of [
        { kv, ...(kvSliding ? { kvSliding } : {}) },
        { kv, ...(kvSliding ? { kvSliding } : {}), maxKvSize: 16 },
      ]) {
        using t = Engine.load(models.path("small"), opts);
        using a1 = loadAssistant(models.path("small-mtp"));
        using a2 = loadAssistant(models.path("small-mtp-echo"));
        using a3 = loadAssistant(models.path("small-mtp-4bit"));
        const cases: [string, SpeculativeDecoder][] = [];
        for (const [name, a] of [
          ["random", a1],
          ["echo", a2],
          ["4-bit", a3],
        ] as const)
          for (const k of [3, 2]) cases.push([`${name} k ${k}`, new SpeculativeDecoder(t, a, { numDraftTokens: k })]);
        // Weights load lazily and KV codecs make their tables once: warm up before the baseline.
        for (const [, sd] of cases) await sd.generate({ promptIds: SHORT, maxTokens: 4 }).result;
        memory.clearCache();
        const base = memory.active();
        const handles = memory.liveHandles();
        for (const prompt of [LONG, SHORT]) {
          const req = { promptIds: prompt, maxTokens: 16 };
          const plain = (await t.generate(req).result).tokens;
          for (const [name, sd] of cases) {
            const r = await sd.generate(req).result;
            expect(r.tokens, `${JSON.stringify(opts)} ${name} prompt ${prompt.length}`).toEqual(plain);
            expect(r.speculative!.drafted).toBeGreaterThan(0);
          }
        }
        memory.clearCache();
        expect(memory.liveHandles()).toBe(handles);
        expect(memory.active()).toBe(base);
      }
    }
  });

  test("equals mlx-lm's greedy tokens; through the Scheduler; sampling is seeded-reproducible", async () => {
    using t = Engine.load(models.path("small"));
    using a = loadAssistant(models.path("small-mtp-echo"));
    const ref = mlxLmGenerate(models.path("small"), LONG, 20);
    const sched = new Scheduler(t, { speculative: new SpeculativeDecoder(t, a) });
    const r = await sched.submit({ promptIds: LONG, maxTokens: 20 }).result;
    expect(r.tokens).toEqual(ref.tokens);
    expect(r.speculative!.accepted).toBeGreaterThan(0);
    const sd = new SpeculativeDecoder(t, a);
    const req = { promptIds: SHORT, maxTokens: 16, sampling: { temperature: 0.8, seed: 5 } };
    const s1 = await sd.generate(req).result;
    const s2 = await sd.generate(req).result;
    expect(s1.tokens).toEqual(s2.tokens);
    expect(s1.tokens.length).toBe(16);
    expect(s1.speculative!.drafted).toBeGreaterThan(0);
  });
});

describe("MTP drafters: speculative rows inside the continuous batch", () => {
  // Rows of different prompt lengths (left padding), draft lengths (3, 2, 1: padded to the widest)
  // and max_tokens, plain rows (num_draft_tokens 0) beside them, a penalty row (processors over
  // the drafted history), and rows that join while others speculate.
  const P = [LONG, SHORT, LONG.slice(3, 20), LONG.slice(10, 12), LONG.slice(5, 30), LONG.slice(20, 29)];
  const reqs = (): GenerateRequest[] => [
    { promptIds: P[0]!, maxTokens: 20 },
    { promptIds: P[1]!, maxTokens: 24, numDraftTokens: 2 },
    { promptIds: P[2]!, maxTokens: 12, numDraftTokens: 0 },
    { promptIds: P[3]!, maxTokens: 18, numDraftTokens: 1 },
    { promptIds: P[4]!, maxTokens: 16, sampling: { repetitionPenalty: 1.3 } },
    { promptIds: P[5]!, maxTokens: 14, numDraftTokens: 0 },
  ];

  /** Submit rows 0-3 together, then 4-5 once row 0 has emitted two tokens; all results. */
  async function run(sched: Scheduler) {
    const rs = reqs();
    const first = rs.slice(0, 4).map((r) => sched.submit(r));
    const it = first[0]![Symbol.asyncIterator]();
    await it.next();
    await it.next();
    const later = rs.slice(4).map((r) => sched.submit(r));
    return Promise.all([...first, ...later].map((s) => s.result));
  }

  test("greedy: every row's tokens are its plain greedy tokens (mlx-lm's for bf16 KV), every KV mode, a bounded window; memory returns to its baseline", async () => {
    const golden = reqs().map((r) => mlxLmGenerate(models.path("small"), r.promptIds, r.maxTokens).tokens);
    // Every layer in the mode (kvSliding: the sliding layers' rotating caches quantized too).
    for (const kv of ["bf16", "q8", "turbo:4,3"]) {
      for (const opts of [
        { kv, kvSliding: kv },
        { kv, kvSliding: kv, maxKvSize: 16 },
      ]) {
        using t = Engine.load(models.path("small"), opts);
        // Plain greedy tokens of each request (the penalty row's with its penalty).
        const plain: number[][] = [];
        for (const r of reqs()) plain.push((await t.generate({ ...r, numDraftTokens: 0 }).result).tokens);
        if (kv === "bf16" && opts.maxKvSize === undefined) expect(plain.filter((_, i) => i !== 4)).toEqual(golden.filter((_, i) => i !== 4));
        for (const name of ["small-mtp-echo", "small-mtp"]) {
          using a = loadAssistant(models.path(name));
          const rounds: number[] = [];
          const sd = new SpeculativeDecoder(t, a, { onRound: (r) => rounds.push(r.accepted) });
          // Warm up (lazy weights, codec tables), then measure from a baseline.
          await new Scheduler(t, { speculative: sd }).submit({ promptIds: SHORT, maxTokens: 4 }).result;
          memory.clearCache();
          const base = memory.active();
          const handles = memory.liveHandles();
          const sched = new Scheduler(t, { speculative: sd });
          const res = await run(sched);
          await sched.close();
          const label = `${JSON.stringify(opts)} ${name}`;
          res.forEach((r, i) => expect(r.tokens, `${label} row ${i}`).toEqual(plain[i]));
          // In the batch, not aside: the first four were prefilled together and decoded by the scheduler's steps.
          expect(sched.stats.largestPrefill).toBe(4);
          expect(sched.stats.decodeSteps).toBeGreaterThan(0);
          for (const i of [0, 1, 3, 4]) expect(res[i]!.speculative!.drafted, `${label} row ${i}`).toBeGreaterThan(0);
          for (const i of [2, 5]) expect(res[i]!.speculative).toBeUndefined();
          if (name.endsWith("echo")) expect(rounds.some((n) => n > 0)).toBe(true);
          memory.clearCache();
          expect(memory.liveHandles()).toBe(handles);
          expect(memory.active()).toBe(base);
        }
      }
    }
  });

  test("with a prompt cache: a finished speculative row's caches serve the next turn, whose tokens stay the plain greedy tokens", async () => {
    using t = Engine.load(models.path("small"));
    using a = loadAssistant(models.path("small-mtp-echo"));
    using pc = new PromptCache({ maxBytes: 64 * 1024 * 1024 });
    const sched = new Scheduler(t, { speculative: new SpeculativeDecoder(t, a), promptCache: pc });
    const first = await sched.submit({ promptIds: LONG, maxTokens: 10 }).result;
    expect(first.tokens).toEqual((await t.generate({ promptIds: LONG, maxTokens: 10 }).result).tokens);
    expect(first.speculative!.drafted).toBeGreaterThan(0);
    // The next turn: prompt + reply + new tokens. A speculative row's caches hold all its tokens
    // but the last target token (all of them when its last round ended on drafts); the prompt-end
    // snapshot holds LONG.length - 1.
    const follow = [...LONG, ...first.tokens, 11, 12, 13];
    const b = await sched.submit({ promptIds: follow, maxTokens: 10 }).result;
    await sched.close();
    expect(b.cachedTokens).toBeGreaterThanOrEqual(LONG.length + first.tokens.length - 1);
    expect(b.cachedTokens).toBeLessThanOrEqual(LONG.length + first.tokens.length);
    expect(b.tokens).toEqual((await t.generate({ promptIds: follow, maxTokens: 10 }).result).tokens);
    expect(pc.stats.hits).toBe(1);
  });

  test("sampling rows in the batch: seeded rows run to max_tokens or a stop, drafts are drafted and judged by rejection sampling", async () => {
    using t = Engine.load(models.path("small"));
    using a = loadAssistant(models.path("small-mtp-echo"));
    const sched = new Scheduler(t, { speculative: new SpeculativeDecoder(t, a) });
    const sampled = { temperature: 0.8, seed: 5 };
    const res = await Promise.all([
      sched.submit({ promptIds: LONG, maxTokens: 16, sampling: sampled }).result,
      sched.submit({ promptIds: SHORT, maxTokens: 16, sampling: { ...sampled, seed: 6 }, numDraftTokens: 2 }).result,
      sched.submit({ promptIds: SHORT, maxTokens: 16 }).result,
    ]);
    await sched.close();
    expect(sched.stats.largestPrefill).toBe(3);
    for (const r of res) {
      // max_tokens, or a stop token drawn earlier.
      if (r.finishReason === "length") expect(r.tokens.length).toBe(16);
      else expect([r.finishReason, r.tokens.length < 16]).toEqual(["stop", true]);
      expect(r.speculative!.drafted).toBeGreaterThan(0);
      expect(r.speculative!.accepted).toBeLessThanOrEqual(r.speculative!.drafted);
    }
  });
});

describe("MTP drafter checks", () => {
  test("a drafter made for another target is refused, naming the field", () => {
    using t = Engine.load(models.path("other"));
    using a = loadAssistant(models.path("small-mtp"));
    expect(() => new SpeculativeDecoder(t, a)).toThrow(/backbone_hidden_size 64 differs from the target's hidden_size 48/);
  });
});
