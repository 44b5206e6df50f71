import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine, KeyStream, logSoftmax, processLogits, resolveSampling, sample, samplingLogProbs, temperedLogits } from "../src/index.ts";
import { xtcSpecialTokens } from "../src/sampling.ts";
import { oracle, runPython } from "../../../tools/oracle/oracle.ts";
import { closeDiff, exactDiff } from "../../../tools/oracle/compare.ts";
import { ROOT, tinyModels } from "./helpers.ts";

const SU = "__import__('mlx_lm.sample_utils', fromlist=['x'])";
const V = 64;

function logits(seed: number): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal([1, V], { key });
  return mx.multiply(x, 3);
}

describe("sampling = mlx-lm sample_utils on the same inputs", () => {
  test("logits processors: logit bias, repetition, presence and frequency penalties", () => {
    using l = logits(1);
    const history = [3, 7, 7, 9, 3, 3, 40];
    const hist = `[${history.join(", ")}]`;
    const cases: [string, Parameters<typeof resolveSampling>[0], string][] = [
      ["bias", { logitBias: { 5: 2.5, 11: -100 } }, `${SU}.make_logits_processors(logit_bias={5: 2.5, 11: -100})[0](mx.array(${hist}), l)`],
      ["rep", { repetitionPenalty: 1.3 }, `${SU}.make_repetition_penalty(1.3, 20)(mx.array(${hist}), mx.array(l))`],
      ["rep_ctx", { repetitionPenalty: 1.3, penaltyContext: 3 }, `${SU}.make_repetition_penalty(1.3, 3)(mx.array(${hist}), mx.array(l))`],
      // A context size of 0 is the whole history in mlx-lm (tokens[-0:]).
      ["rep_ctx0", { repetitionPenalty: 1.3, penaltyContext: 0 }, `${SU}.make_repetition_penalty(1.3, 0)(mx.array(${hist}), mx.array(l))`],
      ["pres_ctx0", { presencePenalty: 0.7, penaltyContext: 0 }, `${SU}.make_presence_penalty(0.7, 0)(mx.array(${hist}), mx.array(l))`],
      ["pres", { presencePenalty: 0.7 }, `${SU}.make_presence_penalty(0.7, 20)(mx.array(${hist}), mx.array(l))`],
      ["freq", { frequencyPenalty: 0.4 }, `${SU}.make_frequency_penalty(0.4, 20)(mx.array(${hist}), l)`],
    ];
    using ref = oracle({ l }, Object.fromEntries(cases.map(([id, , py]) => [id, py])));
    for (const [id, params] of cases) {
      using ours = processLogits(l, history, resolveSampling(params, V));
      expect(exactDiff(ours, ref.get(id)), id).toBeNull();
    }
  });

  test("log-softmax and the top-p / min-p / top-k filters", () => {
    using l = logits(2);
    using lp = logSoftmax(l);
    using ref = oracle(
      { l, lp },
      {
        lsm: "l - mx.logsumexp(l, keepdims=True)",
        topp: `${SU}.apply_top_p(lp, 0.8)`,
        minp: `${SU}.apply_min_p(lp, 0.05)`,
        topk: `${SU}.apply_top_k(lp, 5)`,
        greedy: `${SU}.greedy_sampler(lp)`,
      },
    );
    expect(exactDiff(lp, ref.get("lsm"))).toBeNull();
    // The filters are internal steps of sample(); check them through temperature → 0-like sampling:
    // every sampled token must survive the reference filter.
    for (const [id, params] of [
      ["topp", { temperature: 1, topP: 0.8 }],
      ["minp", { temperature: 1, minP: 0.05 }],
      ["topk", { temperature: 1, topK: 5 }],
    ] as const) {
      const allowed = ref.get(id).toFloat64Array();
      const s = resolveSampling(params, V);
      for (let i = 0; i < 30; i++) {
        using key = mx.random.key(i);
        using t = sample(lp, s, key);
        const tok = t.item();
        expect(allowed[tok], `${id} sampled ${tok}`).toBeGreaterThan(Number.NEGATIVE_INFINITY);
      }
      const kept = allowed.filter((x) => x > Number.NEGATIVE_INFINITY).length;
      expect(kept, id).toBeGreaterThan(0);
      expect(kept, id).toBeLessThan(V);
    }
    using g = sample(lp, resolveSampling({}, V), undefined);
    expect(exactDiff(mx.astype(g, "uint32"), ref.get("greedy"))).toBeNull();
  });

  test("categorical sampling with an explicit key equals MLX's", () => {
    using l = logits(3);
    using lp = logSoftmax(l);
    using key = mx.random.key(42);
    using ref = oracle({ lp, key }, { s: "mx.random.categorical(lp * (1.0 / 0.7), key=key)" });
    using ours = sample(lp, resolveSampling({ temperature: 0.7 }, V), key);
    expect(exactDiff(ours, ref.get("s"))).toBeNull();
  });

  test("bad settings name the field", () => {
    expect(() => resolveSampling({ temperature: -1 }, V)).toThrow(/temperature must be >= 0/);
    expect(() => resolveSampling({ topP: -0.1 }, V)).toThrow(/top_p must be in \[0, 1\]/);
    expect(() => resolveSampling({ penaltyContext: -1 }, V)).toThrow(/repetition_context_size must be a non-negative integer/);
    // top_p 0 is off, as in mlx-lm (0 < top_p < 1 applies it).
    expect(resolveSampling({ topP: 0 }, V).topP).toBe(0);
    expect(() => resolveSampling({ topK: 1.5 }, V)).toThrow(/top_k must be a non-negative integer/);
    expect(() => resolveSampling({ logitBias: { 999: 1 } }, V)).toThrow(/logit_bias: token id 999 is outside the vocabulary/);
    expect(() => resolveSampling({ seed: 1.5 }, V)).toThrow(/seed must be an integer/);
    expect(() => resolveSampling({ xtcProbability: 1.5 }, V)).toThrow(/xtc_probability must be in \[0, 1\]/);
    expect(() => resolveSampling({ xtcProbability: -0.1 }, V)).toThrow(/xtc_probability must be in \[0, 1\]/);
    expect(() => resolveSampling({ xtcThreshold: 0.6 }, V)).toThrow(/xtc_threshold must be in \[0, 0.5\]/);
    expect(() => resolveSampling({ xtcThreshold: Number.NaN }, V)).toThrow(/xtc_threshold must be in/);
    const d = resolveSampling({}, V, [3, 3, V + 5]);
    expect([d.xtcProbability, d.xtcThreshold, d.xtcSpecialTokens]).toEqual([0, 0.1, [3]]);
  });
});

describe("XTC = mlx-lm's apply_xtc / make_sampler on the same inputs and seed", () => {
  // Peaked rows (several tokens above the thresholds), in float32 and bf16 as models give them.
  function peaked(seed: number, dtype: "float32" | "bfloat16"): MlxArray {
    using l = logits(seed);
    using x = mx.multiply(l, 1.5);
    using lp = logSoftmax(x);
    return mx.astype(lp, dtype);
  }
  const list = (ids: number[]) => `[${ids.join(", ")}]`;

  test("the XTC filter (probability 1) with and without special tokens", () => {
    using lp32 = peaked(5, "float32");
    using lp16 = peaked(5, "bfloat16");
    const row = lp32.toFloat64Array();
    const top = Array.from(row.keys()).sort((a, b) => row[b]! - row[a]!);
    const cases: [string, "lp32" | "lp16", number, number[]][] = [
      ["t01", "lp32", 0.1, []],
      ["t005", "lp32", 0.05, []],
      ["t02_special", "lp32", 0.02, [top[0]!, top[2]!, 5]],
      ["t0", "lp32", 0, [top[1]!]],
      ["t05", "lp32", 0.5, []],
      ["bf16_t005", "lp16", 0.05, [top[1]!]],
    ];
    using ref = oracle({ lp32, lp16 }, Object.fromEntries(cases.map(([id, x, t, sp]) => [id, `${SU}.apply_xtc(${x}, 1.0, ${t}, ${list(sp)})`])));
    let changed = 0;
    for (const [id, x, t, sp] of cases) {
      const lp = x === "lp32" ? lp32 : lp16;
      // temperature 1: temperedLogits is the filtered row times 1.
      using ours = temperedLogits(lp, resolveSampling({ temperature: 1, xtcProbability: 1, xtcThreshold: t }, V, sp));
      expect(exactDiff(ours, ref.get(id)), id).toBeNull();
      const kept = ours.toFloat64Array().filter((v) => v > Number.NEGATIVE_INFINITY).length;
      if (kept < V) changed++;
      for (const tok of sp) expect(ours.toFloat64Array()[tok], `${id}: special ${tok} kept`).toBe(lp.toFloat64Array()[tok]);
    }
    expect(changed).toBeGreaterThanOrEqual(4);
  });

  test("sampled tokens equal make_sampler's under the same seed (XTC's coin, then the draw, from one key stream)", () => {
    using lp32 = peaked(6, "float32");
    using lp16 = peaked(6, "bfloat16");
    const N = 48;
    type Case = [string, "lp32" | "lp16", Parameters<typeof resolveSampling>[0], number[], string];
    const cases: Case[] = [
      ["p05_t01", "lp32", { temperature: 1, xtcProbability: 0.5, xtcThreshold: 0.1 }, [], "1.0, xtc_probability=0.5, xtc_threshold=0.1"],
      ["p1_t005", "lp32", { temperature: 0.7, xtcProbability: 1, xtcThreshold: 0.05 }, [], "0.7, xtc_probability=1.0, xtc_threshold=0.05"],
      [
        "p03_t002_sp",
        "lp32",
        { temperature: 1.2, xtcProbability: 0.3, xtcThreshold: 0.02, seed: 0 },
        [1, 6, 2],
        "1.2, xtc_probability=0.3, xtc_threshold=0.02",
      ],
      [
        "chain",
        "lp32",
        { temperature: 0.9, topP: 0.9, minP: 0.02, topK: 12, xtcProbability: 0.6, xtcThreshold: 0.05 },
        [3],
        "0.9, top_p=0.9, min_p=0.02, top_k=12, xtc_probability=0.6, xtc_threshold=0.05",
      ],
      ["bf16", "lp16", { temperature: 1, xtcProbability: 0.8, xtcThreshold: 0.03 }, [7], "1.0, xtc_probability=0.8, xtc_threshold=0.03"],
      // mlx_lm.generate --min-tokens-to-keep: min-p keeps at least this many of the most likely tokens.
      ["minkeep", "lp32", { temperature: 1, minP: 0.9, minTokensToKeep: 4 }, [], "1.0, min_p=0.9, min_tokens_to_keep=4"],
    ];
    const SEED = 11;
    const py = (x: string, args: string, sp: number[]) =>
      `(mx.random.seed(${SEED}), (lambda f: mx.concatenate([f(${x}) for _ in range(${N})]))(${SU}.make_sampler(${args}, xtc_special_tokens=${list(sp)})))[1]`;
    using ref = oracle({ lp32, lp16 }, Object.fromEntries(cases.map(([id, x, , sp, args]) => [id, py(x, args, sp)])));
    for (const [id, x, params, sp] of cases) {
      const s = resolveSampling(params, V, sp);
      using keys = new KeyStream(SEED);
      const toks: MlxArray[] = [];
      for (let i = 0; i < N; i++) toks.push(sample(x === "lp32" ? lp32 : lp16, s, keys));
      using ours = mx.concatenate(toks, 0);
      for (const t of toks) t.dispose();
      expect(exactDiff(ours, ref.get(id)), id).toBeNull();
      if (sp.length) {
        // The draws are not all the argmax: the filter is exercised.
        expect(new Set(ours.toFloat64Array()).size, id).toBeGreaterThan(1);
      }
    }
  });

  test("the distribution speculative decoding compares is XTC's marginal (1 - p) a + p b", () => {
    using lp = peaked(5, "float32");
    const sp = [4];
    using ref = oracle(
      { lp },
      {
        mix: `(lambda a, b: mx.log(0.75 * mx.softmax(a / 0.8) + 0.25 * mx.softmax(b / 0.8)))(lp, ${SU}.apply_xtc(lp, 1.0, 0.05, ${list(sp)}))`,
      },
    );
    using ours = samplingLogProbs(lp, resolveSampling({ temperature: 0.8, xtcProbability: 0.25, xtcThreshold: 0.05 }, V, sp));
    expect(closeDiff(ours, ref.get("mix"), { atol: 1e-5, rtol: 1e-5 })).toBeNull();
  });
});

describe("seeded generation with XTC = mlx-lm generate_step", () => {
  let models: ReturnType<typeof tinyModels>;
  beforeAll(() => {
    models = tinyModels({ small: ["--variant", "small"] });
  });
  afterAll(() => models.cleanup());
  const PROMPT = Array.from({ length: 24 }, (_, i) => 7 + ((i * 53) % 300));

  test("tokens and log-probabilities equal mlx-lm's under the same seed; special tokens as mlx_lm.generate's", async () => {
    // The tiny model's rows are flat (top probability about 0.02): thresholds low enough to bite.
    const runs = [
      { temp: 1, seed: 3, p: 0.5, t: 0.004 },
      { temp: 0.8, seed: 9, p: 1, t: 0.01 },
      { temp: 1, seed: 3, p: 0.5, t: 0.5 }, // XTC never removes anything: only its coin is drawn
    ];
    using e = Engine.load(models.path("small"));
    const got: number[][] = [];
    for (const r of runs) {
      const args = [join(ROOT, "tools", "oracle", "generate_oracle.py"), models.path("small"), "--ids", PROMPT.join(","), "--max-tokens", "16"];
      args.push("--temp", String(r.temp), "--seed", String(r.seed), "--xtc-probability", String(r.p), "--xtc-threshold", String(r.t));
      const ref = JSON.parse(runPython(args)) as { tokens: number[]; logprobs: number[]; xtc_special_tokens: number[] };
      expect(xtcSpecialTokens(e.loaded.tokenizer).sort()).toEqual([...ref.xtc_special_tokens].sort());
      const s = e.generate({
        promptIds: PROMPT,
        maxTokens: 16,
        logprobs: 0,
        sampling: { temperature: r.temp, seed: r.seed, xtcProbability: r.p, xtcThreshold: r.t },
      });
      const lps: number[] = [];
      for await (const ev of s) lps.push(ev.logprob!);
      const res = await s.result;
      expect(res.tokens, JSON.stringify(r)).toEqual(ref.tokens.slice(0, res.tokens.length));
      expect(lps).toEqual(ref.logprobs.slice(0, lps.length));
      got.push(res.tokens);
    }
    // XTC did change the tokens (same seed and key use, threshold 0.004 vs a threshold that never bites).
    expect(got[0]).not.toEqual(got[2]);
  });
});
