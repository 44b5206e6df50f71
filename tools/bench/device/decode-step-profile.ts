// One decode step of mlx-bun at batch 1, on the device: host phases and, under Nsight Compute,
// the GPU kernels of exactly one step per quantized-matmul path (MLX's op, then the qmv kernel).
//
//   .native/bin/bun tools/bench/device/decode-step-profile.ts --model DIR --host [--tokens 48] [--reps 2] [--fast on|exact|auto]
//     per path (exact = mx.quantized_matmul, fast = the mlx-ops qmv kernel, or with --fast exact the
//     exact-order matvec, MLX_BUN_FAST_QMV=exact; --fast auto: MLX's kernels, matvec and norms, against
//     the defaults, MLX_BUN_FAST_QMV and MLX_BUN_EXACT_NORMS auto): an unpipelined step split
//     into graph build / asyncEval call (MLX encodes the kernels there) / wait for the token, and
//     Engine.generate (background evaluation) ms per token; paths interleaved per repetition.
//     --only exact|fast: that path alone (for a JavaScript profile of one path's build:
//     bun --cpu-prof --cpu-prof-md ... --host --only fast).
//   ncu --profile-from-start off ... .native/bin/bun tools/bench/device/decode-step-profile.ts --model DIR --ncu
//     warms both paths up (MLX JIT-compiles its kernels on first use), then between
//     cuProfilerStart/Stop (the driver's: MLX links the CUDA runtime statically): one exact step, a
//     marker kernel (mlxb_profile_marker), one fast step.
// The model's KV cache holds the prompt plus the warm-up tokens (~100 tokens).
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { evaluate, MlxArray, synchronize } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine } from "@mlx-bun/runtime";
import { decodeSteps } from "../decode-steps.ts";
import { cudaProfiler } from "./cuda-profiler.ts";

const arg = (f: string, d: string) => {
  const i = process.argv.indexOf(`--${f}`);
  return i >= 0 ? process.argv[i + 1]! : d;
};
const has = (f: string) => process.argv.includes(`--${f}`);
const model = resolve(arg("model", ""));
if (!existsSync(model)) throw new Error(`no model at ${model}`);
const N = Number(arg("tokens", "48"));
const REPS = Number(arg("reps", "2"));
const log = (s: string) => process.stderr.write(`[step-profile] ${s}\n`);

const t0 = performance.now();
using engine = Engine.load(model, { kv: "bf16" });
log(`loaded ${model} in ${((performance.now() - t0) / 1000).toFixed(1)}s; qmv kernel path ${mx.kernels.qmv_kernel.path()}`);
const { tokenizer, template } = engine.loaded;
const prompt = template!.apply(
  tokenizer,
  [{ role: "user", content: "Hello world! What is the capital of France? Write a short poem about the sea and the sky." }],
  {
    addGenerationPrompt: true,
  },
);
const FAST = arg("fast", "on");
if (FAST !== "on" && FAST !== "exact" && FAST !== "auto") throw new Error(`--fast must be on, exact or auto, got ${FAST}`);
const PATHS = { exact: "off", fast: FAST } as const;
type PathName = keyof typeof PATHS;
const ONLY = arg("only", "");
if (ONLY && !(ONLY in PATHS)) throw new Error(`--only must be exact or fast, got ${ONLY}`);
/** The host mode's paths: both, or the one --only names. */
const HOST_PATHS = (ONLY ? [ONLY] : ["exact", "fast"]) as PathName[];
// --fast auto: MLX's kernels (matvec and norms off) against the defaults (both auto), as qmv-decode.ts --ab exact-auto.
const NORMS = FAST === "auto" ? ({ exact: "off", fast: "auto" } as const) : null;
const use = (p: PathName) => {
  mx.kernels.set_fast_qmv(PATHS[p]);
  if (NORMS) mx.kernels.set_exact_norms(NORMS[p]);
};

const { prefilled, step, done, unpipelined } = decodeSteps(engine, prompt, 100000);

async function generateMs(n: number): Promise<number> {
  const st = engine.generate({ promptIds: prompt, maxTokens: n + 1 });
  let ts = 0;
  for await (const _ of st) if (!ts) ts = performance.now();
  await st.result;
  return (performance.now() - ts) / n;
}

if (has("ncu")) {
  const prof = cudaProfiler();
  const s = prefilled();
  for (const p of ["exact", "fast", "exact", "fast"] as PathName[]) {
    use(p);
    unpipelined(s, 8);
  }
  prof.mark();
  log(`cudaProfilerStart ${prof.start()} (${prof.library})`);
  use("exact");
  const pe = step(s);
  evaluate(pe.token, pe.logprobs);
  synchronize();
  prof.mark();
  use("fast");
  s.tok.dispose();
  pe.logprobs.dispose();
  s.tok = pe.token;
  const pf = step(s);
  evaluate(pf.token, pf.logprobs);
  log(`cudaProfilerStop ${prof.stop()}`);
  s.tok.dispose();
  pf.logprobs.dispose();
  s.tok = pf.token;
  done(s);
} else {
  // Warm-up of both paths (JIT), then REPS interleaved repetitions.
  for (const p of HOST_PATHS) {
    use(p);
    const s = prefilled();
    unpipelined(s, 4);
    done(s);
    await generateMs(4);
  }
  const out: Record<string, { unpipelined: ReturnType<typeof unpipelined>[]; generate_ms: number[] }> = {};
  for (let r = 0; r < REPS; r++) {
    const order = r % 2 ? HOST_PATHS.toReversed() : HOST_PATHS;
    for (const p of order) {
      use(p);
      const o = (out[p] ??= { unpipelined: [], generate_ms: [] });
      const s = prefilled();
      o.unpipelined.push(unpipelined(s, N));
      done(s);
      o.generate_ms.push(await generateMs(N));
    }
  }
  mx.kernels.set_fast_qmv(undefined);
  mx.kernels.set_exact_norms(undefined);
  console.log(JSON.stringify({ model: model.split("/").at(-1), prompt: prompt.length, tokens: N, reps: REPS, paths: out }));
}
