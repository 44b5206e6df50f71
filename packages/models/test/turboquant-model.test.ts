import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Gemma4Model, loadGemma4Config, loadWeights, parseKvMode } from "../src/index.ts";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { MAKER } from "./helpers.ts";

const dir = mkdtempSync(join(tmpdir(), "mlxb-tq-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * Greedy decode (or, with `forced`, feed those tokens instead of the argmax: teacher forcing, so
 * two cache modes are compared on the same positions); returns the argmax tokens and the
 * float32 log-probabilities of every step.
 */
function decode(model: Gemma4Model, kv: string, prompt: number[], steps: number, forced?: number[]): { tokens: number[]; logprobs: MlxArray[] } {
  const caches = model.makeCaches(parseKvMode(kv));
  const tokens: number[] = [];
  const logprobs: MlxArray[] = [];
  try {
    let ids = MlxArray.fromNumbers(prompt, [1, prompt.length], "int32");
    for (let i = 0; i < steps; i++) {
      using logits = model.forward(ids, caches);
      ids.dispose();
      using last = mx.index(logits, 0, -1);
      using l32 = mx.astype(last, "float32");
      using lse = mx.logsumexp(l32, -1, { keepdims: true });
      const lp = mx.subtract(l32, lse).eval();
      logprobs.push(lp);
      using am = mx.argmax(lp, -1);
      const t = am.item();
      tokens.push(t);
      ids = MlxArray.fromNumbers([forced ? forced[i]! : t], [1, 1], "int32");
    }
    ids.dispose();
    return { tokens, logprobs };
  } finally {
    for (const c of caches) c.dispose();
  }
}

/** KL(p_bf16 || p_turbo) per step, in nats. */
function kl(p: MlxArray, q: MlxArray): number {
  using ep = mx.exp(p);
  using d = mx.subtract(p, q);
  using prod = mx.multiply(ep, d);
  using s = mx.sum(prod);
  return s.item();
}

describe("TurboQuant on a Gemma 4 model (head dims 64/128, every layer's cache quantized)", () => {
  test("greedy agreement and KL divergence of the logits against bf16, reported and bounded", () => {
    const ckpt = join(dir, "small64");
    runPython([MAKER, "--variant", "small", "--out", ckpt, "--set", "head_dim=64", "--set", "global_head_dim=128"]);
    const config = loadGemma4Config(ckpt);
    using weights = loadWeights(ckpt, config);
    using model = new Gemma4Model(config, weights.tensors);
    const prompt = Array.from({ length: 48 }, (_, i) => 7 + ((i * 41) % 300));
    const steps = 40;
    const ref = decode(model, "bf16", prompt, steps);
    const report: string[] = [];
    for (const [mode, maxKl] of [
      ["turbo:8,4", 0.15],
      ["turbo:4,3", 0.5],
    ] as const) {
      // Free-running greedy: how long it follows bf16.
      const free = decode(model, mode, prompt, steps);
      let same = 0;
      while (same < steps && free.tokens[same] === ref.tokens[same]) same++;
      for (const a of free.logprobs) a.dispose();
      // Teacher-forced on the bf16 tokens: KL and argmax agreement at every position.
      const t = decode(model, mode, prompt, steps, ref.tokens);
      const kls = t.logprobs.map((q, i) => kl(ref.logprobs[i]!, q));
      const meanKl = kls.reduce((a, b) => a + b, 0) / kls.length;
      const agree = t.tokens.filter((x, i) => x === ref.tokens[i]).length;
      report.push(
        `${mode}: free-running greedy follows bf16 for ${same}/${steps} tokens; teacher-forced argmax agreement ${agree}/${steps}, mean KL(bf16 || ${mode}) ${meanKl.toExponential(3)} nats`,
      );
      expect(meanKl, mode).toBeLessThan(maxKl);
      expect(agree, mode).toBeGreaterThan(steps / 2);
      for (const a of t.logprobs) a.dispose();
    }
    for (const a of ref.logprobs) a.dispose();
    console.log(report.join("\n"));
  });
});
