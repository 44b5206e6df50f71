// Decode at batch 1 with the mlx-ops qmv kernel against MLX's quantized_matmul and mlx-lm, in one
// run: (1) teacher-forced KL of the fast path against the exact one, per decoded token; (2) decode
// tok/s of mlx-bun exact, mlx-bun fast and mlx-lm (tools/bench/mlx_lm_bench.py in a Python twin),
// the order rotated every repetition; min / median / max.
//   .native/bin/bun tools/bench/device/qmv-decode.ts --model DIR [--python PY] [--reps 5]
//     [--decode-tokens 256] [--kl-steps 64] [--json OUT.json] [--no-mlx-lm] [--ab qmv|fused|exact-qmv|exact-norms|exact-all|exact-ladder|exact-auto|sdpa|dense-attn|staged|geglu|geglu-pvfold|direct|next|candidates]
// "exact": mx.quantized_matmul everywhere (MLX_BUN_FAST_QMV=0); "fast": the qmv kernel for every
// quantized linear with at most 16 rows of x (decode), MLX's op for prefill.
// --ab fused compares instead fused projections off ("exact") and on ("fast", the default path:
// q/k/v and gate/up as one quantized matmul per decode step; expected bit-equal: KL 0).
// --ab exact-qmv compares MLX's op ("exact") with the exact-order matvec (MLX_BUN_FAST_QMV=exact:
// MLX's own arithmetic with wider loads where MLX runs its qmv; expected bit-equal: KL 0).
// --ab exact-norms: MLX's norms vs the fused exact norms (MLX_BUN_EXACT_NORMS=on: q/k/v norms and
// the residual points in one launch each); --ab exact-all: both exact kernels; --ab exact-ladder:
// MLX's kernels, each exact kernel alone, both; --ab exact-auto: MLX's kernels vs the default
// settings. Expected KL 0 (the last side against the first). --ab dense-attn: the default against the
// default with the plain caches' split-K decode attention kernel (MLX_BUN_DENSE_DECODE=kernel: two
// launches a layer instead of MLX's three, float32 throughout; not MLX's bits, so the KL is the test).
// --ab sdpa: MLX's kernels, the default, the default with the decode attention kernels (mlx-ops
// sdpa_decode, MLX_BUN_SDPA_DECODE=on: MLX's rounding points in two launches instead of four, not its
// bits): the KL is the test.
// --ab staged: the default against the exact matvec's staged launch (MLX_BUN_QMV_STAGED: expected KL 0);
// --ab geglu: MLX's kernels, the default, the default with the gate/up matvec and its GeGLU in one launch
// (MLX_BUN_QMV_GEGLU: expected KL 0 against MLX's kernels);
// --ab geglu-pvfold: those three and the default with both the GeGLU launch and p·v folded (MLX_BUN_PV_FOLD).
// --ab direct: MLX's kernels, the default on MLX's launch path (MLX_BUN_DIRECT_LAUNCH=0), the default.
// --ab next: the default, each of those two alone, both; --ab candidates: MLX's kernels, the default, each
// candidate alone. The KL compares every side with the first.
import { writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { defaultDevice, evaluate, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { setDenseDecode } from "@mlx-bun/kv-cache";
import { setFusedProjections } from "@mlx-bun/models";
import { Engine, Sequence } from "@mlx-bun/runtime";
import { Twin } from "../twin.ts";
import { spread } from "../stats.ts";

const arg = (f: string, d: string) => {
  const i = process.argv.indexOf(`--${f}`);
  return i >= 0 ? process.argv[i + 1]! : d;
};
const ROOT = resolve(import.meta.dir, "..", "..", "..");
const model = resolve(arg("model", ""));
const PY = arg("python", process.env.MLX_BUN_PYTHON ?? "python3");
const REPS = Number(arg("reps", "5"));
const TOKENS = Number(arg("decode-tokens", "256"));
const KL_STEPS = Number(arg("kl-steps", "64"));
const JSON_OUT = arg("json", "");
const WITH_LM = !process.argv.includes("--no-mlx-lm");
const AB = arg("ab", "qmv");
/** One mlx-bun side of a comparison: its label and the kernels it turns on (none: MLX's ops). */
interface Side {
  label: string;
  qmv?: "on" | "exact" | "auto";
  norms?: "on" | "auto";
  fused?: true;
  /** The plain caches' decode attention; unset: MLX_BUN_DENSE_DECODE (default MLX's SDPA). */
  attn?: "kernel";
  /** The exact matvec's staged launch; unset: MLX_BUN_QMV_STAGED (default off). */
  staged?: true;
  /** Decode attention at MLX's rounding points in two launches (mlx-ops sdpa_decode); unset: off (the default). */
  sdpa?: "on";
  /** The gate/up matvec and its GeGLU in one launch; unset: MLX_BUN_QMV_GEGLU (default off). */
  geglu?: true;
  /** A grouped decode row's p·v as one strided batch; unset: MLX_BUN_PV_FOLD (default off). */
  pvfold?: true;
  /** Custom kernels launched directly (docs/custom-kernels.md); unset: MLX_BUN_DIRECT_LAUNCH (default on). */
  direct?: boolean;
}
/** Each --ab: its sides, the reference first; the KL compares the last side with the first. */
const AB_MODES: Record<string, Side[]> = {
  qmv: [{ label: "mlx-bun exact" }, { label: "mlx-bun fast", qmv: "on" }],
  fused: [{ label: "mlx-bun unfused" }, { label: "mlx-bun fused", fused: true }],
  "exact-qmv": [{ label: "mlx-bun MLX's matvec" }, { label: "mlx-bun exact-order matvec", qmv: "exact" }],
  "exact-norms": [{ label: "mlx-bun MLX's norms" }, { label: "mlx-bun fused exact norms", norms: "on" }],
  "exact-all": [{ label: "mlx-bun MLX's kernels" }, { label: "mlx-bun exact norms + matvec", qmv: "exact", norms: "on" }],
  // Each exact kernel alone and both, in one run: what each contributes.
  "exact-ladder": [
    { label: "mlx-bun MLX's kernels" },
    { label: "mlx-bun exact norms", norms: "on" },
    { label: "mlx-bun exact-order matvec", qmv: "exact" },
    { label: "mlx-bun exact norms + matvec", qmv: "exact", norms: "on" },
  ],
  // MLX's kernels, the default, the default with the decode attention kernels (KL of both against the first).
  sdpa: [
    { label: "mlx-bun MLX's kernels" },
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
    { label: "mlx-bun default + decode attention", qmv: "auto", norms: "auto", sdpa: "on" },
  ],
  // What mlx-bun does by default (on CUDA sm90: the fused exact norms, the exact-order matvec on large matrices).
  "exact-auto": [{ label: "mlx-bun MLX's kernels" }, { label: "mlx-bun default", qmv: "auto", norms: "auto" }],
  // The default, then the default with the split-K decode attention kernel.
  "dense-attn": [
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
    { label: "mlx-bun default + attention kernel", qmv: "auto", norms: "auto", attn: "kernel" },
  ],
  // The default, then with the exact matvec's staged launch (expected KL 0).
  staged: [
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
    { label: "mlx-bun default + staged matvec", qmv: "auto", norms: "auto", staged: true },
  ],
  // MLX's kernels (the reference), the default, the default with the fused gate/up + GeGLU launch (KL 0 expected).
  geglu: [
    { label: "mlx-bun MLX's kernels" },
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
    { label: "mlx-bun default + gate/up GeGLU launch", qmv: "auto", norms: "auto", geglu: true },
  ],
  // MLX's kernels, the default, the default with the GeGLU launch and the folded p·v (KL 0 expected for both).
  "geglu-pvfold": [
    { label: "mlx-bun MLX's kernels" },
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
    { label: "mlx-bun default + GeGLU launch", qmv: "auto", norms: "auto", geglu: true },
    { label: "mlx-bun default + GeGLU launch + folded p·v", qmv: "auto", norms: "auto", geglu: true, pvfold: true },
  ],
  // MLX's kernels, the default without direct launches, the default (KL 0 expected for both).
  direct: [
    { label: "mlx-bun MLX's kernels" },
    { label: "mlx-bun default, MLX's launch path", qmv: "auto", norms: "auto", direct: false },
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
  ],
  // MLX's kernels (the reference: the default's KL must be 0), the default, and each candidate for the next default.
  candidates: [
    { label: "mlx-bun MLX's kernels" },
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
    { label: "mlx-bun default + staged matvec", qmv: "auto", norms: "auto", staged: true },
    { label: "mlx-bun default + attention kernel", qmv: "auto", norms: "auto", attn: "kernel" },
  ],
  // The candidates for the next default, each alone and together, against the default.
  next: [
    { label: "mlx-bun default", qmv: "auto", norms: "auto" },
    { label: "mlx-bun default + staged matvec", qmv: "auto", norms: "auto", staged: true },
    { label: "mlx-bun default + attention kernel", qmv: "auto", norms: "auto", attn: "kernel" },
    { label: "mlx-bun default + both", qmv: "auto", norms: "auto", staged: true, attn: "kernel" },
  ],
};
const SIDES = AB_MODES[AB];
if (!SIDES) throw new Error(`--ab must be one of ${Object.keys(AB_MODES).join(", ")}, got ${AB}`);
const REF = SIDES[0]!;
const TOP = SIDES.at(-1)!;
const log = (s: string) => process.stderr.write(`[qmv-decode +${(performance.now() / 1000).toFixed(0)}s] ${s}\n`);

const engine = Engine.load(model, { kv: "bf16" });
const { tokenizer, template } = engine.loaded;
const prompt = template!.apply(
  tokenizer,
  [{ role: "user", content: "Hello world! What is the capital of France? Write a short poem about the sea and the sky." }],
  {
    addGenerationPrompt: true,
  },
);
const use = (side: Side) => {
  mx.kernels.set_fast_qmv(side.qmv ?? "off");
  mx.kernels.set_exact_norms(side.norms ?? "off");
  if (AB === "fused") setFusedProjections(side.fused ? "on" : "off");
  setDenseDecode(side.attn);
  mx.kernels.set_qmv_exact_staged(side.staged);
  mx.kernels.set_qmv_exact_geglu(side.geglu);
  mx.kernels.set_pv_fold(side.pvfold);
  mx.kernels.set_direct_launch(side.direct);
  mx.kernels.set_sdpa_decode(side.sdpa ?? "off");
};
const result: Record<string, unknown> = { model, ab: AB, device: defaultDevice(), prompt_tokens: prompt.length, decode_tokens: TOKENS, reps: REPS };
const save = () => JSON_OUT && writeFileSync(JSON_OUT, JSON.stringify(result, null, 1));

// (1) KL, teacher-forced on the exact path's greedy tokens.
function run(side: Side, feed?: number[]): { tokens: number[]; logprobs: MlxArray[] } {
  use(side);
  const caches = engine.makeCaches();
  const seq = new Sequence({ promptIds: prompt, maxTokens: 100000 }, tokenizer);
  const tokens: number[] = [];
  const logprobs: MlxArray[] = [];
  try {
    let ids = MlxArray.fromNumbers(prompt, [1, prompt.length], "int32");
    for (let i = 0; i <= KL_STEPS; i++) {
      using logits = engine.forward(ids, caches);
      ids.dispose();
      using row = mx.index(logits, ":", -1, ":");
      const p = seq.pick(row);
      const lp = mx.astype(p.logprobs, "float32");
      p.logprobs.dispose();
      evaluate(p.token, lp);
      const t = p.token.item() as number;
      p.token.dispose();
      if (i > 0)
        logprobs.push(lp); // rows of decode steps only (the prompt row is a prefill)
      else lp.dispose();
      tokens.push(t);
      ids = MlxArray.fromNumbers([feed ? feed[i]! : t], [1, 1], "int32");
    }
    ids.dispose();
  } finally {
    for (const c of caches) c.dispose();
    seq.dispose();
  }
  return { tokens, logprobs };
}
{
  log(`KL: ${KL_STEPS} teacher-forced decode steps`);
  const ex = run(REF);
  // Each other side teacher-forced on the reference's tokens; `kl` is the last side's (as before),
  // `kl_by_side` every side's.
  const bySide: Record<string, unknown> = {};
  for (const side of SIDES.slice(1)) {
    const fa = run(side, ex.tokens);
    const kl: number[] = [];
    let argmaxSame = 0;
    let maxDiff = 0;
    for (let i = 0; i < ex.logprobs.length; i++) {
      const e = ex.logprobs[i]!;
      const f = fa.logprobs[i]!;
      using pe = mx.exp(e);
      using d = mx.subtract(e, f);
      using w = mx.multiply(pe, d);
      using s = mx.sum(w);
      kl.push(s.item() as number);
      using ad = mx.abs(d);
      using md = mx.max(ad);
      maxDiff = Math.max(maxDiff, md.item() as number);
      if (ex.tokens[i + 1] === fa.tokens[i + 1]) argmaxSame++;
      f.dispose();
    }
    const sorted = [...kl].sort((a, b) => a - b);
    bySide[side.label] = {
      steps: kl.length,
      max: sorted.at(-1),
      median: sorted[sorted.length >> 1],
      mean: kl.reduce((a, b) => a + b, 0) / kl.length,
      greedy_same: `${argmaxSame}/${kl.length}`,
      max_abs_logprob_diff: maxDiff,
      per_step: kl,
    };
    log(
      `KL per token, ${side.label}: max ${sorted.at(-1)!.toExponential(2)}, median ${sorted[sorted.length >> 1]!.toExponential(2)}; greedy ${argmaxSame}/${kl.length}; max |Δ logprob| ${maxDiff}`,
    );
  }
  for (const e of ex.logprobs) e.dispose();
  result.kl = bySide[TOP.label];
  result.kl_by_side = bySide;
  save();
}

// (2) tok/s.
async function ours(side: Side, n: number): Promise<{ tps: number; tokens: number[] }> {
  use(side);
  const s = engine.generate({ promptIds: prompt, maxTokens: n });
  let tFirst = 0;
  const toks: number[] = [];
  for await (const ev of s) {
    if (!tFirst) tFirst = performance.now();
    toks.push(ev.token);
  }
  const t = performance.now() - tFirst;
  await s.result;
  return { tps: ((toks.length - 1) * 1000) / t, tokens: toks };
}
const twin = WITH_LM ? new Twin(PY, ROOT) : null;
if (twin) {
  await twin.line();
  const l = await twin.call<{ load_s: number }>("load", { model });
  log(`mlx-lm loaded in ${l.load_s.toFixed(1)}s`);
}
const theirs = async (n: number) => {
  const r = await twin!.call<{ decode_s: number; tokens: number[] }>("decode", { prompt, n });
  return { tps: (r.tokens.length - 1) / r.decode_s, tokens: r.tokens };
};
log("warm-up");
for (const side of SIDES) await ours(side, 8);
if (twin) await theirs(8);
const names = [...SIDES.map((s) => s.label), ...(twin ? ["mlx-lm"] : [])];
const runs: Record<string, () => Promise<{ tps: number; tokens: number[] }>> = {
  ...Object.fromEntries(SIDES.map((s) => [s.label, () => ours(s, TOKENS)])),
  "mlx-lm": () => theirs(TOKENS),
};
const tps: Record<string, number[]> = {};
const firstTokens: Record<string, number[]> = {};
for (let r = 0; r < REPS; r++) {
  const order = names.map((_, i) => names[(i + r) % names.length]!);
  for (const n of order) {
    const x = await runs[n]!();
    (tps[n] ??= []).push(x.tps);
    firstTokens[n] ??= x.tokens.slice(0, 32);
  }
  log(`rep ${r + 1}/${REPS}: ${names.map((n) => `${n} ${tps[n]!.at(-1)!.toFixed(1)}`).join(", ")}`);
}
const mmm = (xs: number[]) => ({ ...spread(xs), all: xs });
result.tok_s = Object.fromEntries(names.map((n) => [n, mmm(tps[n]!)]));
result.greedy_first_32 = Object.fromEntries(names.map((n) => [n, JSON.stringify(firstTokens[n]) === JSON.stringify(firstTokens[names[0]!])]));
save();
for (const n of names) {
  const m = mmm(tps[n]!);
  console.log(`| ${n} | ${m.min.toFixed(1)} / ${m.median.toFixed(1)} / ${m.max.toFixed(1)} |`);
}
const klSummary = Object.fromEntries(Object.entries(result.kl_by_side as Record<string, object>).map(([k, v]) => [k, { ...v, per_step: undefined }]));
console.log(JSON.stringify({ kl: klSummary, greedy_first_32: result.greedy_first_32 }));
if (twin) await twin.close();
mx.kernels.set_fast_qmv(undefined);
setFusedProjections(undefined);
engine.dispose();
