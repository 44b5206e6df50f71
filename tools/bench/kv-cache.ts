// KV-cache modes side by side: stored bytes per token and decode attention time (one query
// token over a context of 1k / 8k / 32k tokens), each as a ratio to bf16. Modes are
// interleaved within every repetition so machine drift hits all alike. Quantized modes take the
// fused decode kernels where a GPU backend is live (column "attention"); --unfused adds each
// quantized mode again on the unfused path (MLX_BUN_KERNELS=reference for that call), to compare;
// where the kernels run, "bf16 kernel" is the bf16 cache on the split-K kernel (setDenseDecode).
// --layers N attends N times (N queries, as the N layers of one decode step) and evaluates once,
// reporting the time per attend: the per-evaluation floor (synchronization, ~0.2 ms on the H200)
// is then paid once per step as in a model, not once per attend.
//
// --modes keeps the named modes only (bf16 always runs: it is the ratios' base).
// --profile-last (CUDA, under `ncu --profile-from-start off`): the last repetition's attends of each
// mode in a profiler range, each followed by a marker kernel (tools/kernels/attend-timeline.py).
//
//   .native/bin/bun tools/bench/kv-cache.ts [--reps 7] [--contexts 1024,8192,32768] [--heads 8,2] [--dim 256] [--layers 1] [--scale 0.0625] [--unfused]
//     [--modes "bf16 kernel,turbo:4,3"] [--json out.json]
import { renameSync, writeFileSync } from "node:fs";
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import { defaultDevice, evaluate, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, KVCache, affineCodec, turboQuantCodec, type KvCodec, plainCodec, setDenseDecode } from "@mlx-bun/kv-cache";
import { affineDecodeKernel } from "../../packages/kv-cache/src/kernels/affine-decode.ts";
import { cudaProfiler } from "./device/cuda-profiler.ts";
import { formatSpread, median } from "./stats.ts";

const argv = process.argv;
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1]! : def;
};
const REPS = Number(opt("reps", "7"));
const CONTEXTS = opt("contexts", "1024,8192,32768").split(",").map(Number);
const JSON_OUT = opt("json", "");
const UNFUSED = argv.includes("--unfused");
const backend = mx.kernels.gpu_backend();
const fusedLive = affineDecodeKernel.path() !== "reference";
// A Gemma-4-like attention layer: by default 8 query heads over 2 KV heads of dim 256.
const [HQ, HKV] = opt("heads", "8,2").split(",").map(Number) as [number, number];
const D = Number(opt("dim", "256"));
const LAYERS = Number(opt("layers", "1"));
// The attention scale: 1/16 (1/√256) by default; Gemma 4 attends with 1 (its q/k norms scale),
// where the kernels' queries need no multiply (scaledQueries in decode-plan.ts).
const SCALE = Number(opt("scale", "0.0625"));
if (!Number.isFinite(SCALE) || SCALE <= 0) throw new Error(`--scale must be a positive number, got ${opt("scale", "")}`);
if (!Number.isInteger(LAYERS) || LAYERS < 1) throw new Error(`--layers must be a positive integer, got ${LAYERS}`);
const profiler = argv.includes("--profile-last") ? cudaProfiler() : null;

const QUANT_MODES: [string, () => KvCodec][] = [
  ["q8", () => affineCodec(8, 64)],
  ["q4", () => affineCodec(4, 64)],
  ["turbo:8,4", () => turboQuantCodec({ kBits: 8, vBits: 4 })],
  ["turbo:4,3", () => turboQuantCodec({ kBits: 4, vBits: 3 })],
  ["turbo:4,2", () => turboQuantCodec({ kBits: 4, vBits: 2 })],
];
const ALL_MODES: [string, () => KvCodec][] = [
  ["bf16", () => plainCodec],
  ...(fusedLive ? [["bf16 kernel", () => plainCodec] as [string, () => KvCodec]] : []),
  ...QUANT_MODES,
  ...(UNFUSED && fusedLive ? QUANT_MODES.map(([n, f]): [string, () => KvCodec] => [`${n} unfused`, f]) : []),
];
// Mode names hold commas (turbo:4,3): read the list name by name, the longest known name first.
function parseModes(list: string): Set<string> {
  const names = ALL_MODES.map(([n]) => n).sort((a, b) => b.length - a.length);
  const out = new Set<string>();
  for (let at = 0; at < list.length; ) {
    const n = names.find((x) => list.startsWith(x, at) && (at + x.length === list.length || list[at + x.length] === ","));
    if (!n) throw new Error(`--modes ${list}: no known mode at "${list.slice(at)}" (known: ${names.join(" | ")})`);
    out.add(n);
    at += n.length + 1;
  }
  return out;
}
const wanted = argv.includes("--modes") ? parseModes(opt("modes", "")) : null;
const MODES = wanted === null ? ALL_MODES : ALL_MODES.filter(([n]) => n === "bf16" || wanted.has(n));
/** Which attention path a mode's decode step takes here. */
const pathOf = (mode: string): string =>
  mode === "bf16"
    ? "fast SDPA"
    : mode === "bf16 kernel"
      ? `split-K kernel (${backend})`
      : fusedLive && !mode.endsWith("unfused")
        ? `fused kernels (${backend})`
        : "unfused";

function rand(shape: number[], seed: number): MlxArray {
  using key = mx.random.key(seed);
  using x = mx.random.normal(shape, { key });
  return mx.astype(x, "bfloat16");
}

interface Row {
  mode: string;
  context: number;
  bytesPerToken: number;
  times: number[];
  /** Graph building alone (the attend calls before the evaluation), ms per attend. */
  build: number[];
  /** Set when the backend could not run this mode; its times stay empty. */
  error?: string;
}

const rows: Row[] = [];
const total = CONTEXTS.length * MODES.length * REPS;
let done = 0;
for (const ctx of CONTEXTS) {
  // One cache per mode holding `ctx` tokens, filled in 4k chunks.
  const caches: [string, Cache][] = MODES.map(([name, make]) => [name, new KVCache(make())]);
  for (let start = 0, i = 0; start < ctx; start += 4096, i++) {
    const n = Math.min(4096, ctx - start);
    using k = rand([1, HKV, n, D], 2 * i);
    using v = rand([1, HKV, n, D], 2 * i + 1);
    for (const [, c] of caches) {
      using view = c.updateAndFetch(k, v);
      for (const p of view.planes) p.eval();
    }
  }
  const byMode = new Map<string, Row>();
  for (const [name, c] of caches) {
    const r = { mode: name, context: ctx, bytesPerToken: c.bytesPerToken(), times: [] as number[], build: [] as number[] };
    byMode.set(name, r);
    rows.push(r);
  }
  const qs = Array.from({ length: LAYERS }, (_, i) => rand([1, HQ, 1, D], 99 + 1000 * i));
  using k1 = rand([1, HKV, 1, D], 98);
  for (let rep = 0; rep < REPS; rep++) {
    for (const [name, c] of caches) {
      // One decode step: append a token, attend over the whole context.
      using view = c.updateAndFetch(k1, k1);
      for (const p of view.planes) p.eval();
      const unfused = name.endsWith("unfused");
      if (unfused) process.env.MLX_BUN_KERNELS = "reference";
      if (name === "bf16 kernel") setDenseDecode("kernel");
      const r = byMode.get(name)!;
      try {
        if (!r.error) {
          const profiled = profiler !== null && rep === REPS - 1;
          if (profiled) profiler.start();
          const t = performance.now();
          const outs = qs.map((q) => view.attend(q, SCALE, null));
          r.build.push((performance.now() - t) / LAYERS);
          evaluate(...outs);
          r.times.push((performance.now() - t) / LAYERS);
          if (profiled) {
            profiler.mark();
            profiler.stop();
          }
          for (const o of outs) o.dispose();
        }
      } catch (e) {
        // A mode the backend cannot run (e.g. CUDA's quantized_matmul lacks a shape) is reported, not fatal.
        r.error = (e as Error).message.split("\n")[0]!.slice(0, 200);
      } finally {
        if (unfused) delete process.env.MLX_BUN_KERNELS;
        setDenseDecode(undefined);
      }
      c.trim(1);
      done++;
      process.stderr.write(`\r[kv-cache bench] ${done}/${total}  context ${ctx}  ${name.padEnd(10)}`);
    }
  }
  for (const [, c] of caches) c.dispose();
  for (const q of qs) q.dispose();
  memory.clearCache();
}
process.stderr.write("\n");

const lines = [
  `MLX default device ${defaultDevice()}, GPU backend ${backend ?? "none"}; ${HQ} query heads over ${HKV} KV heads of dim ${D}, bf16; ${REPS} reps; scale ${SCALE}; ${LAYERS} attend${LAYERS > 1 ? "s" : ""} per evaluation (time per attend).`,
  "",
  `| mode | attention | context | bytes/token | × bf16 | decode attention ms (min / median / max) | × bf16 (median) | of which building ms (median) |`,
  `| --- | --- | --- | --- | --- | --- | --- | --- |`,
];
for (const ctx of CONTEXTS) {
  const base = rows.find((r) => r.context === ctx && r.mode === "bf16")!;
  for (const r of rows.filter((x) => x.context === ctx)) {
    const t = r.times;
    if (r.error) {
      lines.push(
        `| ${r.mode} | ${pathOf(r.mode)} | ${ctx} | ${r.bytesPerToken} | ${(r.bytesPerToken / base.bytesPerToken).toFixed(3)} | failed: ${r.error.replaceAll("|", "/")} | — | — |`,
      );
      continue;
    }
    lines.push(
      `| ${r.mode} | ${pathOf(r.mode)} | ${ctx} | ${r.bytesPerToken} | ${(r.bytesPerToken / base.bytesPerToken).toFixed(3)} | ${formatSpread(t)} | ${(median(t) / median(base.times)).toFixed(2)} | ${median(r.build).toFixed(3)} |`,
    );
  }
}
console.log(lines.join("\n"));
if (JSON_OUT) {
  const json = {
    gpu_backend: backend,
    heads: { q: HQ, kv: HKV, dim: D },
    reps: REPS,
    layers: LAYERS,
    scale: SCALE,
    rows: rows.map((r) => ({ ...r, attention: pathOf(r.mode) })),
  };
  writeFileSync(`${JSON_OUT}.tmp`, JSON.stringify(json, null, 2));
  renameSync(`${JSON_OUT}.tmp`, JSON_OUT);
}
