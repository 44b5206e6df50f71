// Batched decode through the Scheduler on CUDA: MLX_BUN_FAST_QMV=off (MLX's op on [B, 1, K], as
// mlx-lm runs it) against the default, auto (on sm90 the rows go to MLX's op as one [B, K] matrix,
// packages/mlx-ops/src/kernels/qmv.ts). Every stream's greedy tokens must be the same under both;
// aggregate tok/s of each, the order alternated every repetition; min / median / max.
//   .native/bin/bun tools/bench/device/batch-fold.ts --model DIR [--streams 16] [--tokens 64] [--reps 3] [--json OUT]
import { writeFileSync } from "node:fs";
import { resolve } from "node:path";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine, Scheduler } from "@mlx-bun/runtime";
import { spread } from "../stats.ts";

const arg = (f: string, d: string) => {
  const i = process.argv.indexOf(`--${f}`);
  return i >= 0 ? process.argv[i + 1]! : d;
};
const model = resolve(arg("model", ""));
const streams = Number(arg("streams", "16"));
const maxTokens = Number(arg("tokens", "64"));
const reps = Number(arg("reps", "3"));
const log = (s: string) => process.stderr.write(`[batch-fold] ${s}\n`);

using engine = Engine.load(model, { kv: "bf16" });
const { tokenizer, template } = engine.loaded;
const topics = ["the sea", "a mountain", "the city at night", "a library", "rain", "a train", "the desert", "snow"];
const prompts = Array.from({ length: streams }, (_, i) =>
  template!.apply(tokenizer, [{ role: "user", content: `Stream ${i}: write ${3 + (i % 5)} lines about ${topics[i % topics.length]}.` }], {
    addGenerationPrompt: true,
  }),
);
const sched = new Scheduler(engine, { maxBatch: streams });

type Setting = "off" | "auto";
async function round(setting: Setting): Promise<{ tokens: number[][]; tps: number }> {
  mx.kernels.set_fast_qmv(setting);
  try {
    const t0 = performance.now();
    const res = await Promise.all(prompts.map((promptIds) => sched.submit({ promptIds, maxTokens }).result));
    const dt = (performance.now() - t0) / 1000;
    return { tokens: res.map((r) => r.tokens), tps: res.reduce((a, r) => a + r.tokens.length, 0) / dt };
  } finally {
    mx.kernels.set_fast_qmv(undefined);
  }
}

// Untimed first rounds (a new batch size compiles kernels); their tokens are the reference.
const ref = await round("off");
const tps: Record<Setting, number[]> = { off: [], auto: [] };
const sameAs = (t: number[][]) => t.filter((s, i) => s.join() === ref.tokens[i]!.join()).length;
const same: Record<Setting, number> = { off: streams, auto: sameAs((await round("auto")).tokens) };
for (let r = 0; r < reps; r++) {
  for (const s of (r % 2 ? ["auto", "off"] : ["off", "auto"]) as Setting[]) {
    const x = await round(s);
    tps[s].push(x.tps);
    same[s] = Math.min(same[s], sameAs(x.tokens));
  }
  log(`rep ${r + 1}/${reps}: off ${tps.off.at(-1)!.toFixed(1)}, auto ${tps.auto.at(-1)!.toFixed(1)} tok/s`);
}
await sched.close();
const out = {
  model,
  streams,
  maxTokens,
  tok_s: { off: spread(tps.off), auto: spread(tps.auto) },
  // Streams whose tokens equal the first off round's, in the worst round of each setting.
  streams_same_tokens: same,
};
console.log(JSON.stringify(out));
const json = arg("json", "");
if (json) writeFileSync(json, `${JSON.stringify(out, null, 1)}\n`);
if (same.auto !== streams || same.off !== streams) process.exitCode = 1;
