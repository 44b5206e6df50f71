// The graph one decode step builds in mlx-bun and in mlx-lm (after the same 65-token prefill),
// compared by node count per primitive: every extra node is an extra kernel launch on a GPU,
// encoded on the host inside async_eval. Writes both .dot files next to the summary.
//   .native/bin/bun tools/bench/decode-graph.ts [--model DIR] [--out DIR]
import { mkdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { evaluate, exportToDot, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine, Sequence } from "@mlx-bun/runtime";
import { runPython } from "../oracle/oracle.ts";

const arg = (f: string, d: string) => {
  const i = process.argv.indexOf(`--${f}`);
  return i >= 0 ? process.argv[i + 1]! : d;
};
const ROOT = resolve(import.meta.dir, "..", "..");
const model = resolve(arg("model", join(ROOT, ".native/bench-models/gemma4-mini-4bit")));
const out = resolve(arg("out", "/tmp/decode-graph"));
mkdirSync(out, { recursive: true });
const prompt = Array.from({ length: 65 }, (_, i) => 5 + ((i * 37) % 200));

using engine = Engine.load(model, { kv: "bf16" });
const caches = engine.makeCaches();
const seq = new Sequence({ promptIds: prompt, maxTokens: 4 }, engine.loaded.tokenizer);
{
  using x = MlxArray.fromNumbers(prompt, [1, prompt.length], "int32");
  using logits = engine.forward(x, caches);
  using row = mx.index(logits, ":", -1, ":");
  const p = seq.pick(row);
  evaluate(p.token, p.logprobs);
  using x2 = mx.expand_dims(p.token, 0);
  using logits2 = engine.forward(x2, caches);
  using row2 = mx.index(logits2, ":", -1, ":");
  const p2 = seq.pick(row2);
  exportToDot(join(out, "mlx-bun.dot"), p2.token, p2.logprobs);
  for (const a of [p.token, p.logprobs, p2.token, p2.logprobs]) a.dispose();
}
for (const c of caches) c.dispose();
seq.dispose();
runPython([join(ROOT, "tools", "bench", "decode_graph.py"), model, join(out, "mlx-lm.dot")]);

/** Primitive name → count of op nodes in a dot file (nodes drawn as rectangles are ops). */
function ops(file: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const line of readFileSync(file, "utf8").split("\n")) {
    const r = /label\s*=\s*"([A-Za-z][A-Za-z0-9_]*)[^"]*".*shape\s*=\s*rectangle/.exec(line);
    if (r) m.set(r[1]!, (m.get(r[1]!) ?? 0) + 1);
  }
  return m;
}
const a = ops(join(out, "mlx-bun.dot"));
const b = ops(join(out, "mlx-lm.dot"));
const names = [...new Set([...a.keys(), ...b.keys()])].sort();
const total = (m: Map<string, number>) => [...m.values()].reduce((s, x) => s + x, 0);
console.log(`decode-step graph, ${model.split("/").at(-1)}: op nodes mlx-bun ${total(a)}, mlx-lm ${total(b)}`);
for (const n of names) if ((a.get(n) ?? 0) !== (b.get(n) ?? 0)) console.log(`  ${n.padEnd(28)} mlx-bun ${String(a.get(n) ?? 0).padStart(4)}  mlx-lm ${String(b.get(n) ?? 0).padStart(4)}`);
console.log(`(dot files in ${out})`);
