// Op nodes per primitive in a graph written by mx.export_to_dot (exportToDot): what the graph
// tests and tools/bench/decode-graph.ts compare (an op node is a kernel launch on a GPU).
import { readFileSync } from "node:fs";

/** Primitive name → number of op nodes in a dot file (ops are the rectangles). */
export function opCounts(file: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const line of readFileSync(file, "utf8").split("\n")) {
    const r = /label\s*=\s*"([A-Za-z][A-Za-z0-9_]*)[^"]*".*shape\s*=\s*rectangle/.exec(line);
    if (r) m.set(r[1]!, (m.get(r[1]!) ?? 0) + 1);
  }
  return m;
}
