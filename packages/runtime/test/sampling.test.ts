import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { logSoftmax, processLogits, resolveSampling, sample } from "../src/index.ts";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

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
    expect(() => resolveSampling({ topP: 0 }, V)).toThrow(/top_p must be in \(0, 1\]/);
    expect(() => resolveSampling({ topK: 1.5 }, V)).toThrow(/top_k must be a non-negative integer/);
    expect(() => resolveSampling({ logitBias: { 999: 1 } }, V)).toThrow(/logit_bias: token id 999 is outside the vocabulary/);
    expect(() => resolveSampling({ seed: 1.5 }, V)).toThrow(/seed must be an integer/);
  });
});
