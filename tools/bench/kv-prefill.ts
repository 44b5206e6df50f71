// Prefill with each KV mode next to bf16 (issue 24): a synthetic prompt of 2k / 8k tokens fed in
// chunks of --step tokens (mlx-lm's prefill_step_size, 2048) through Engine.prefill, each
// quantized mode twice: on the SDPA prefill path (the default: fast SDPA over the dequantized
// planes) and on the exact path (mlx-lm's quantized-matmul attention, MLX_BUN_KV_PREFILL=exact).
// Modes and paths are interleaved within every repetition (rotating start); min / median / max
// tok/s, and the ratio of medians to bf16's in the same run. Peak memory per mode (one extra
// run each, MLX's peak counter reset before it). A mode X quantizes the full-attention layers and
// leaves the sliding layers bf16 (the engine's default); X~Y gives the sliding layers mode Y
// (EngineOptions.kvSliding), e.g. turbo:4,3~turbo:4,3 for every layer.
//
// --quality-model DIR (a bf16 checkpoint) adds teacher-forced figures on it: the prompt fed in
// chunks, then the logits of the last --quality-tail positions (one forward chunk, so it too takes
// the path under test) compared per position: KL(bf16 ‖ mode), KL(exact ‖ sdpa) and argmax
// agreement, per mode and path.
//
//   .native/bin/bun tools/bench/kv-prefill.ts [--model DIR] [--lengths 2048,8192] [--reps 3] [--step 2048]
//     [--modes q8,q4,turbo:4,3] [--quality-model DIR] [--quality-length 2048] [--quality-tail 128] [--json out.json]
import { renameSync, writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { resolve } from "node:path";
import { defaultDevice, memory, MlxArray, mlxVersion } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { setKvPrefill } from "@mlx-bun/kv-cache";
import { Engine } from "@mlx-bun/runtime";
import { syntheticPrompt } from "./synthetic-prompt.ts";
import { spread } from "./stats.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const argv = process.argv;
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1]! : def;
};
const MODEL = opt("model", resolve(ROOT, ".native/bench-models/gemma4-mini-4bit"));
const LENGTHS = opt("lengths", "2048,8192").split(",").map(Number);
const REPS = Number(opt("reps", "3"));
const STEP = Number(opt("step", "2048"));
const MODES = opt("modes", "q8,q4,turbo:4,3").split(/,(?![0-9])/);
const QUALITY_MODEL = opt("quality-model", "");
const QUALITY_LENGTH = Number(opt("quality-length", "2048"));
const QUALITY_TAIL = Number(opt("quality-tail", "128"));
const JSON_OUT = opt("json", "");

interface Variant {
  name: string;
  kv: string;
  path: "sdpa" | "exact";
}
const VARIANTS: Variant[] = [
  { name: "bf16", kv: "bf16", path: "sdpa" },
  ...MODES.flatMap((m): Variant[] => [
    { name: m, kv: m, path: "sdpa" },
    { name: `${m} exact`, kv: m, path: "exact" },
  ]),
];

const log = (s: string): void => console.error(`[kv-prefill +${(performance.now() / 1000).toFixed(0)}s] ${s}`);

/** "X" → kv X (the sliding layers bf16, the engine's default); "X~Y" → kv X, the sliding layers Y. */
function engineKv(mode: string): { kv: string; kvSliding?: string } {
  const [kv, sliding] = mode.split("~") as [string, string | undefined];
  return sliding ? { kv, kvSliding: sliding } : { kv };
}

const base = Engine.load(MODEL, { prefillStep: STEP });
const engines = new Map<string, Engine>();
const engineFor = (kv: string): Engine => {
  let e = engines.get(kv);
  if (!e) engines.set(kv, (e = new Engine(base.loaded, { ...engineKv(kv), prefillStep: STEP })));
  return e;
};

/** Seconds to prefill `prompt` (every token) with KV mode `v`; the caches are freed after. */
function prefillOnce(v: Variant, prompt: readonly number[]): number {
  setKvPrefill(v.path);
  const e = engineFor(v.kv);
  const caches = e.makeCaches();
  try {
    const t0 = performance.now();
    e.prefill(prompt, caches, 0);
    return (performance.now() - t0) / 1000;
  } finally {
    for (const c of caches) c.dispose();
    setKvPrefill(undefined);
  }
}

// Report (markdown on stdout), each prompt length as soon as it is measured.
const gb = (b: number): string => `${(b / 1e9).toFixed(2)} GB`;
const f1 = (x: number): string => x.toFixed(1);
function printLength(n: number): void {
  const bf = spread(rows.find((r) => r.variant === "bf16" && r.length === n)!.tokPerS).median;
  for (const r of rows.filter((x) => x.length === n)) {
    const s = spread(r.tokPerS);
    const path = r.variant === "bf16" ? "fast SDPA" : r.variant.endsWith(" exact") ? "exact (quantized matmul)" : "SDPA over dequantized";
    console.log(
      `| ${n} | ${r.variant.replace(" exact", "")} | ${path} | ${f1(s.min)} / ${f1(s.median)} / ${f1(s.max)} | ${(s.median / bf).toFixed(2)} | ${gb(r.peakBytes)} |`,
    );
  }
}
console.log(
  `${new Date().toISOString()}, ${cpus().length} cores (${cpus()[0]?.model.trim()}), ${(totalmem() / 2 ** 30).toFixed(0)} GiB, MLX ${mlxVersion()} ${defaultDevice()}; model \`${MODEL.replace(`${ROOT}/`, "")}\`; prefill step ${STEP}; ${REPS} repetitions interleaved (rotating order); tok/s min / median / max; ratio = median / bf16 median.\n`,
);
console.log("| prompt | KV mode | prefill path | tok/s (min / median / max) | vs bf16 | MLX peak |");
console.log("|---|---|---|---|---|---|");
const vocab = base.loaded.config.text.vocabSize;
const rows: { variant: string; length: number; tokPerS: number[]; peakBytes: number }[] = [];
log(`model ${MODEL}, device ${defaultDevice()}, lengths ${LENGTHS.join("/")}, step ${STEP}, reps ${REPS}, variants ${VARIANTS.map((v) => v.name).join(", ")}`);
{
  // Warm-up: one chunk per variant (kernel compilation on a GPU, first-use allocations). A whole
  // chunk, so the exact path's query tiles are full: on CUDA, MLX 0.32.4's quantized_matmul has no
  // kernel for a 64-row tile at head dim 512 ("No implementation for problem shape 64x576x512x16").
  const warm = syntheticPrompt(STEP, 1, vocab);
  for (const v of VARIANTS) prefillOnce(v, warm);
}
for (const n of LENGTHS) {
  const prompt = syntheticPrompt(n, n, vocab);
  const times = new Map<string, number[]>(VARIANTS.map((v) => [v.name, []]));
  for (let r = 0; r < REPS; r++) {
    for (let i = 0; i < VARIANTS.length; i++) {
      const v = VARIANTS[(i + r) % VARIANTS.length]!;
      const s = prefillOnce(v, prompt);
      times.get(v.name)!.push(n / s);
      log(`${n} tokens, rep ${r + 1}, ${v.name}: ${(n / s).toFixed(1)} tok/s`);
    }
  }
  for (const v of VARIANTS) {
    memory.clearCache();
    memory.resetPeak();
    prefillOnce(v, prompt);
    rows.push({ variant: v.name, length: n, tokPerS: times.get(v.name)!, peakBytes: memory.peak() });
  }
  printLength(n);
}

// Teacher-forced quality on a bf16 checkpoint.
interface Quality {
  variant: string;
  klVsBf16: number[];
  klVsExact: number[] | null;
  agreeBf16: number;
  agreeExact: number | null;
}
const quality: Quality[] = [];
if (QUALITY_MODEL) {
  const qBase = Engine.load(QUALITY_MODEL, { prefillStep: STEP });
  const qv = qBase.loaded.config.text.vocabSize;
  const prompt = syntheticPrompt(QUALITY_LENGTH, 3, qv);
  const tail = prompt.slice(QUALITY_LENGTH - QUALITY_TAIL);
  /** float32 log-probabilities [tail, V] of the tail positions after the head was prefilled. */
  const logprobs = (v: Variant): MlxArray => {
    setKvPrefill(v.path);
    const e = new Engine(qBase.loaded, { ...engineKv(v.kv), prefillStep: STEP });
    const caches = e.makeCaches();
    try {
      e.prefill(prompt.slice(0, QUALITY_LENGTH - QUALITY_TAIL), caches, 0);
      using ids = MlxArray.fromNumbers(tail, [1, tail.length], "int32");
      using logits = e.forward(ids, caches);
      using l = mx.index(logits, 0);
      using l32 = mx.astype(l, "float32");
      using lse = mx.logsumexp(l32, -1, { keepdims: true });
      return mx.subtract(l32, lse).eval();
    } finally {
      for (const c of caches) c.dispose();
      setKvPrefill(undefined);
    }
  };
  /** Per-position KL(p ‖ q) in nats. */
  const kl = (p: MlxArray, q: MlxArray): number[] => {
    using ep = mx.exp(p);
    using d = mx.subtract(p, q);
    using prod = mx.multiply(ep, d);
    using s = mx.sum(prod, -1);
    return Array.from(s.toFloat64Array());
  };
  const argmax = (p: MlxArray): number[] => {
    using a = mx.argmax(p, -1);
    return a.tolist() as number[];
  };
  const agree = (a: number[], b: number[]): number => a.filter((x, i) => x === b[i]).length / a.length;
  using ref = logprobs(VARIANTS[0]!);
  const refArg = argmax(ref);
  for (const m of MODES) {
    using exact = logprobs({ name: `${m} exact`, kv: m, path: "exact" });
    using sdpa = logprobs({ name: m, kv: m, path: "sdpa" });
    const exArg = argmax(exact);
    const sdArg = argmax(sdpa);
    quality.push({ variant: `${m} exact`, klVsBf16: kl(ref, exact), klVsExact: null, agreeBf16: agree(exArg, refArg), agreeExact: null });
    quality.push({ variant: m, klVsBf16: kl(ref, sdpa), klVsExact: kl(exact, sdpa), agreeBf16: agree(sdArg, refArg), agreeExact: agree(sdArg, exArg) });
    log(`quality ${m} done`);
  }
}

if (quality.length) {
  const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
  console.log(
    `\nTeacher-forced on \`${QUALITY_MODEL.replace(`${ROOT}/`, "")}\`: ${QUALITY_LENGTH - QUALITY_TAIL} prompt tokens prefilled, then the logits of the last ${QUALITY_TAIL} positions (one chunk); KL in nats, mean / max over positions.\n`,
  );
  console.log("| KV mode | prefill path | KL(bf16 ‖ mode) | argmax = bf16 | KL(exact ‖ sdpa) | argmax = exact |");
  console.log("|---|---|---|---|---|---|");
  for (const q of quality) {
    const k = (xs: number[] | null): string => (xs ? `${mean(xs).toExponential(2)} / ${Math.max(...xs).toExponential(2)}` : "—");
    const pct = (x: number | null): string => (x === null ? "—" : `${(100 * x).toFixed(1)}%`);
    console.log(
      `| ${q.variant.replace(" exact", "")} | ${q.variant.endsWith(" exact") ? "exact" : "SDPA"} | ${k(q.klVsBf16)} | ${pct(q.agreeBf16)} | ${k(q.klVsExact)} | ${pct(q.agreeExact)} |`,
    );
  }
}
if (JSON_OUT) {
  writeFileSync(`${JSON_OUT}.tmp`, JSON.stringify({ model: MODEL, step: STEP, reps: REPS, device: String(defaultDevice()), rows, quality }, null, 1));
  renameSync(`${JSON_OUT}.tmp`, JSON_OUT);
}
base.dispose();
