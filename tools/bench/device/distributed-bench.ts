// The sharded (tensor-parallel) path on one device with one rank: joins a size-1 group (NCCL when
// the MLX build has it and MLX_BUN_DIST_BACKEND=nccl, else whatever `init` finds), runs the step
// protocol (LeaderModel) and prints prefill/decode tok/s next to the plain Engine, same model.
//   bun tools/bench/device/distributed-bench.ts --model <dir> [--prompt-tokens 512] [--decode-tokens 128]
import { parseArgs } from "node:util";
import { shardModel } from "@mlx-bun/models";
import { backendAvailable, Engine, joinGroup, LeaderModel, type Backend } from "@mlx-bun/runtime";

const { values } = parseArgs({
  options: { model: { type: "string" }, "prompt-tokens": { type: "string", default: "512" }, "decode-tokens": { type: "string", default: "128" } },
});
if (!values.model) throw new Error("--model <dir> is required");
const P = Number(values["prompt-tokens"]);
const D = Number(values["decode-tokens"]);
const backends = (["ring", "nccl", "mpi", "jaccl"] as Backend[]).filter((b) => backendAvailable(b));
const backend = (process.env.MLX_BUN_DIST_BACKEND as Backend | undefined) ?? "any";
console.log(JSON.stringify({ available: backends, backend }));

async function run(engine: Engine, label: string): Promise<void> {
  const V = engine.loaded.tokenizer.vocabSize;
  const prompt = Array.from({ length: P }, (_, i) => 3 + ((i * 7919) % (V - 3)));
  const warm = engine.generate({ promptIds: prompt.slice(0, 32), maxTokens: 8, sampling: { temperature: 0 } });
  for await (const _ of warm) void _;
  await warm.result;
  const s = engine.generate({ promptIds: prompt, maxTokens: D, sampling: { temperature: 0 } });
  for await (const _ of s) void _;
  const r = await s.result;
  console.log(
    JSON.stringify({
      label,
      prompt_tokens: P,
      prefill_tps: P / r.ttft,
      decode_tokens: r.tokens.length,
      decode_tps: r.tokens.length / r.decodeSeconds,
      first_tokens: r.tokens.slice(0, 8),
    }),
  );
}

{
  const plain = Engine.load(values.model);
  await run(plain, "plain Engine");
  plain.dispose();
}
{
  using group = joinGroup(backend);
  console.log(JSON.stringify({ group: { rank: group.rank(), size: group.size() } }));
  const engine = Engine.load(values.model);
  const tp = shardModel(engine.loaded, group);
  const leader = new LeaderModel(engine.loaded.model, tp);
  const sharded = new Engine(engine.loaded, { stepModel: leader });
  await run(sharded, `sharded, ${group.size()} rank, backend ${backend}`);
  leader.stop();
  engine.dispose();
}
