// One rank of the tensor-parallel test (distributed.test.ts starts 1, 2 or 3 of these; with no
// MLX_HOSTFILE it is the single-process run). It runs each model of a comma-separated list in
// turn (one process start for all variants). Prints one JSON line from rank 0: per model and KV
// mode the greedy tokens and the prompt's last-row logits; followers print {"rank": r, "leak": bytes}.
import { memory, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { loadModel, shardModel } from "@mlx-bun/models";
import { Engine, followSteps, LeaderModel } from "@mlx-bun/runtime";

const [dirList, kvList, promptCsv, maxTokensArg, prefillArg] = process.argv.slice(2) as [string, string, string, string, string];
const prompt = promptCsv.split(",").map(Number);
const maxTokens = Number(maxTokensArg);
const prefillStep = Number(prefillArg);
const base = memory.active();
const out: Record<string, unknown> = {};
const group = mx.distributed.init({ strict: process.env.MLX_HOSTFILE !== undefined, backend: "ring" });
for (const dir of dirList.split(",")) {
  const res: Record<string, unknown> = {};
  out[dir] = res;
  using loaded = loadModel(dir);
  const tp = shardModel(loaded, group);
  out.rank = group.rank();
  out.size = group.size();
  if (group.rank() !== 0) {
    followSteps(loaded.model, tp);
  } else {
    const leader = group.size() > 1 ? new LeaderModel(loaded.model, tp) : undefined;
    try {
      for (const kv of kvList.split(",")) {
        // "X~Y": kv X with the sliding layers in Y (kvSliding); plain "X": the engine's default (quantized X: sliding layers bf16).
        const [full, sliding] = kv.split("~") as [string, string | undefined];
        const engine = new Engine(loaded, { kv: full, prefillStep, ...(sliding ? { kvSliding: sliding } : {}), ...(leader ? { stepModel: leader } : {}) });
        const s = engine.generate({ promptIds: prompt, maxTokens, sampling: { temperature: 0 }, logprobs: 2 });
        // The gap between the best and the second-best log-probability of every greedy pick.
        const margins: number[] = [];
        for await (const ev of s) {
          const top = ev.topLogprobs;
          if (top && top.length >= 2) margins.push(top[0]!.logprob - top[1]!.logprob);
        }
        const r = await s.result;
        // The prompt's logits at its last position, through the same step path.
        const caches = engine.makeCaches();
        try {
          using ids = MlxArray.fromNumbers(prompt, [1, prompt.length], "int32");
          using logits = engine.forward(ids, caches);
          using last = mx.index(logits, 0, -1, ":");
          using f = mx.astype(last, "float32");
          res[kv] = { tokens: r.tokens, finish: r.finishReason, margins, logits: Array.from(f.toTypedArray() as Float32Array) };
        } finally {
          for (const c of caches) c.dispose();
        }
      }
    } finally {
      leader?.stop();
    }
  }
}
group.dispose();
memory.clearCache();
out.leak = memory.active() - base;
process.stdout.write(`${JSON.stringify(out)}\n`);
