// The graph one decode step builds in mlx-bun and in mlx-lm (after the same 65-token prefill),
// compared by node count per primitive: every extra node is an extra kernel launch on a GPU,
// encoded on the host inside async_eval. Writes both .dot files next to the summary.
//   .native/bin/bun tools/bench/decode-graph.ts [--model DIR] [--out DIR] [--all]
// --all lists every primitive's count, not only those that differ (on a GPU: what MLX encodes a step).
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { Engine } from "@mlx-bun/runtime";
import { allCounts, countDiff, decodeStepGraph, mlxLmDecodeStepGraph, opCounts } from "../oracle/graph.ts";

const arg = (f: string, d: string) => {
  const i = process.argv.indexOf(`--${f}`);
  return i >= 0 ? process.argv[i + 1]! : d;
};
const ROOT = resolve(import.meta.dir, "..", "..");
const model = resolve(arg("model", join(ROOT, ".native/bench-models/gemma4-mini-4bit")));
const out = resolve(arg("out", "/tmp/decode-graph"));
mkdirSync(out, { recursive: true });

{
  using engine = Engine.load(model, { kv: "bf16" });
  decodeStepGraph(engine, join(out, "mlx-bun.dot"));
}
mlxLmDecodeStepGraph(model, join(out, "mlx-lm.dot"));
const a = opCounts(join(out, "mlx-bun.dot"));
const b = opCounts(join(out, "mlx-lm.dot"));
const total = (m: Map<string, number>) => [...m.values()].reduce((s, x) => s + x, 0);
console.log(`decode-step graph, ${model.split("/").at(-1)}: op nodes mlx-bun ${total(a)}, mlx-lm ${total(b)}`);
const listed = process.argv.includes("--all") ? allCounts(a, b) : countDiff(a, b);
for (const [n, [x, y]] of Object.entries(listed).sort((p, q) => q[1][0] - p[1][0]))
  console.log(`  ${n.padEnd(28)} mlx-bun ${String(x).padStart(4)}  mlx-lm ${String(y).padStart(4)}`);
console.log(`(dot files in ${out})`);
