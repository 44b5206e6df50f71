// Per-op overhead of mlx-bun vs MLX Python: microseconds per call of a tiny `add` of two
// 1-element arrays, (a) building the lazy graph and disposing it, (b) also reading the new
// array's shape (as model code does with most op outputs), (c) also evaluating it.
// Python runs as a persistent twin (op_overhead.py --serve); batches alternate between the two
// (TS graph, Py graph, TS eval, Py eval, ...) so machine drift hits both alike.
//
//   .native/bin/bun tools/bench/op-overhead.ts [--reps 15] [--graph-n 20000] [--shape-n 20000] [--eval-n 5000]
import { fileURLToPath } from "node:url";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { oraclePython } from "../oracle/oracle.ts";
import { median } from "./stats.ts";

const arg = (name: string, def: number): number => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
};
const REPS = arg("reps", 15);
const N = { graph: arg("graph-n", 20000), shape: arg("shape-n", 20000), eval: arg("eval-n", 5000) } as const;
type Variant = keyof typeof N;

const a = MlxArray.fromNumbers([1], [1]).eval();
const b = MlxArray.fromNumbers([2], [1]).eval();

const ts: Record<Variant, (n: number) => number> = {
  graph(n) {
    const t = performance.now();
    for (let i = 0; i < n; i++) {
      const c = mx.add(a, b);
      c.dispose();
    }
    return ((performance.now() - t) * 1e3) / n;
  },
  shape(n) {
    const t = performance.now();
    let d = 0;
    for (let i = 0; i < n; i++) {
      const c = mx.add(a, b);
      d += c.shape[0]!;
      c.dispose();
    }
    if (d !== n) throw new Error("shape variant: unexpected shape");
    return ((performance.now() - t) * 1e3) / n;
  },
  eval(n) {
    const t = performance.now();
    for (let i = 0; i < n; i++) {
      const c = mx.add(a, b);
      c.eval();
      c.dispose();
    }
    return ((performance.now() - t) * 1e3) / n;
  },
};

// The Python twin, answering one line per request.
const py = Bun.spawn([oraclePython(), fileURLToPath(new URL("./op_overhead.py", import.meta.url)), "--serve"], {
  stdin: "pipe",
  stdout: "pipe",
  stderr: "inherit",
});
const reader = py.stdout.getReader();
let buf = "";
async function readLine(): Promise<string> {
  for (;;) {
    const nl = buf.indexOf("\n");
    if (nl >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      return line;
    }
    const { value, done } = await reader.read();
    if (done) throw new Error("python twin exited");
    buf += new TextDecoder().decode(value);
  }
}
async function pyRun(v: Variant, n: number): Promise<number> {
  py.stdin.write(`${v} ${n}\n`);
  py.stdin.flush();
  return Number(await readLine());
}

if ((await readLine()) !== "ready") throw new Error("python twin did not start");
const results: Record<"ts" | "py", Record<Variant, number[]>> = { ts: { graph: [], shape: [], eval: [] }, py: { graph: [], shape: [], eval: [] } };
const variants: Variant[] = ["graph", "shape", "eval"];
for (const v of variants) {
  ts[v](N[v]); // warm-up (JIT, allocator, FFI bindings)
  await pyRun(v, N[v]);
}
for (let r = 0; r < REPS; r++) {
  for (const v of variants) {
    results.ts[v].push(ts[v](N[v]));
    results.py[v].push(await pyRun(v, N[v]));
  }
}
py.stdin.end();
await py.exited;

const f = (x: number): string => x.toFixed(3).padStart(8);
console.log(`op overhead: add of two 1-element float32 arrays, ${REPS} interleaved reps (graph n=${N.graph}, shape n=${N.shape}, eval n=${N.eval}), us/call`);
console.log(`${"variant".padEnd(8)} ${"impl".padEnd(9)} ${"min".padStart(8)} ${"median".padStart(8)} ${"max".padStart(8)}`);
for (const v of variants) {
  for (const impl of ["ts", "py"] as const) {
    const xs = results[impl][v];
    console.log(`${v.padEnd(8)} ${(impl === "ts" ? "mlx-bun" : "python").padEnd(9)} ${f(Math.min(...xs))} ${f(median(xs))} ${f(Math.max(...xs))}`);
  }
  const ratio = median(results.ts[v]) / median(results.py[v]);
  const ratioMin = Math.min(...results.ts[v]) / Math.min(...results.py[v]);
  console.log(`${v.padEnd(8)} ratio mlx-bun/python: median ${ratio.toFixed(2)}x, min ${ratioMin.toFixed(2)}x`);
}
a.dispose();
b.dispose();
