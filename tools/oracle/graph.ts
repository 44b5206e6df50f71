// One decode step's graph in mlx-bun and in mlx-lm (tools/oracle/decode_graph.py), as counts of
// op nodes per primitive from mx.export_to_dot. Equal counts mean both issue the same kernels:
// what keeps CUDA results bit-equal and decode free of extra launches (docs/benchmarks.md).
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { evaluate, exportToDot, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Engine, Sequence } from "@mlx-bun/runtime";
import { runPython } from "./oracle.ts";

export { opCounts } from "./dot-ops.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

/** The prompt both sides prefill before the measured step. */
export const GRAPH_PROMPT = Array.from({ length: 65 }, (_, i) => 5 + ((i * 37) % 200));

/** mlx-bun: prefill GRAPH_PROMPT, then write the graph of one pipelined decode step (Engine's ops) to `file`. */
export function decodeStepGraph(engine: Engine, file: string): void {
  const caches = engine.makeCaches();
  const seq = new Sequence({ promptIds: GRAPH_PROMPT, maxTokens: 4 }, engine.loaded.tokenizer);
  try {
    using x = MlxArray.fromNumbers(GRAPH_PROMPT, [1, GRAPH_PROMPT.length], "int32");
    using logits = engine.forward(x, caches);
    using row = mx.index(logits, ":", -1, ":");
    const p = seq.pick(row);
    evaluate(p.token, p.logprobs);
    using x2 = mx.expand_dims(p.token, 0);
    using logits2 = engine.forward(x2, caches);
    using row2 = mx.index(logits2, ":", -1, ":");
    const p2 = seq.pick(row2);
    exportToDot(file, p2.token, p2.logprobs);
    for (const a of [p.token, p.logprobs, p2.token, p2.logprobs]) a.dispose();
  } finally {
    for (const c of caches) c.dispose();
    seq.dispose();
  }
}

/** mlx-lm: the same step (generate_step's _step) for the checkpoint in `dir`, written to `file`. */
export function mlxLmDecodeStepGraph(dir: string, file: string): void {
  runPython([join(ROOT, "tools", "oracle", "decode_graph.py"), dir, file]);
}

/** Primitives whose counts differ: name → [mlx-bun, mlx-lm]. */
export function countDiff(a: Map<string, number>, b: Map<string, number>): Record<string, [number, number]> {
  const out: Record<string, [number, number]> = {};
  for (const n of new Set([...a.keys(), ...b.keys()])) if ((a.get(n) ?? 0) !== (b.get(n) ?? 0)) out[n] = [a.get(n) ?? 0, b.get(n) ?? 0];
  return out;
}

/** Every primitive of either graph: name → [mlx-bun, mlx-lm]. */
export function allCounts(a: Map<string, number>, b: Map<string, number>): Record<string, [number, number]> {
  return Object.fromEntries([...new Set([...a.keys(), ...b.keys()])].map((n) => [n, [a.get(n) ?? 0, b.get(n) ?? 0]]));
}
