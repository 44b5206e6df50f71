// Long context end to end with each KV mode (issue 24): for every prompt length and KV mode, a
// synthetic prompt prefilled through Engine.prefill (chunks of --step tokens, the engine's default
// 2,048; the default prefill path), then --decode-tokens greedy tokens through the engine's decode
// pipeline (DecodeRunner, as Engine.generate runs it: background evaluation where the engine
// turns it on). Per variant: prefill tok/s (prompt tokens / time to the first token), decode tok/s
// (tokens after the first / time from the first to the last), MLX peak memory of the variant
// (the counter reset before it; the weights included), and for the quantized modes the
// teacher-forced KL against bf16 over the decode steps: the bf16 run's greedy tokens fed to the
// mode's caches, KL(bf16 ‖ mode) per step from the full-vocab log-softmax (float32), and the
// argmax agreement. mlx-lm with its bf16 cache at each length (prefill, decode, peak) runs in a
// Python process beside (the `long` command of tools/bench/mlx_lm_bench.py through twin.ts,
// MLX_BUN_PYTHON or --python).
//
// How one variant runs: prefill (timed) → MLX peak read → snapshot of the sliding-window caches
// → the teacher-forced pass (bf16: greedy, its tokens and log-probs kept on the host; other
// modes: bf16's tokens fed, KL per step; untimed) → the caches rewound (full-attention caches
// trimmed back, sliding ones restored from the snapshot) → MLX peak reset → the timed decode.
// One prefill serves both, so a 128k prompt is prefilled once per variant. Reported peak =
// max(peak of the prefill, peak of the timed decode).
//
//   .native/bin/bun tools/bench/long-context.ts --model DIR [--lengths 8192,32768,131072]
//     [--modes bf16,q8,q4,turbo:4,3,turbo:8,4] [--decode-tokens 64] [--reps 1] [--step 2048]
//     [--deadline SECONDS] [--no-mlx-lm] [--python PY] [--no-warmup] [--json FILE] [--md FILE]
//
// A quantized mode X is the engine's default: X on the full-attention layers, the sliding layers
// bf16. A mode may carry the sliding layers' own mode after "~" (EngineOptions.kvSliding; e.g.
// turbo:4,3~turbo:4,3: TurboQuant on every layer, as plain turbo:4,3 meant before the default
// changed) and "+kernel" for the plain caches' split-K decode kernel instead of fast SDPA
// (setDenseDecode), e.g. bf16+kernel; "+composition" encodes TurboQuant values through the
// composition op by op instead of the encode kernel (setTurboEncode), e.g. turbo:4,3+composition;
// "+scoresN" sets the quantized prefill's score budget to N GiB (setPrefillScoreBudget), e.g.
// turbo:4,3+scores4. Flags combine: turbo:4,3+composition+scores4.
//
// --deadline: seconds from the start of the process; a variant that would start after it is
// skipped (and reported as skipped). The JSON (and the markdown) is rewritten after every variant.
// With --reps > 1 the variants of a length run in a rotating order per repetition (the figures are
// medians); the KL pass runs in the first repetition only (bf16 first there).
import { renameSync, writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join, resolve } from "node:path";
import { type Cache, RotatingKVCache, type CacheState, setDenseDecode, setPrefillScoreBudget, setTurboEncode } from "@mlx-bun/kv-cache";
import { defaultDevice, evaluate, memory, MlxArray, mlxVersion } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { DecodeRunner, Engine, logSoftmax, Row, Sequence } from "@mlx-bun/runtime";
import { syntheticPrompt } from "./synthetic-prompt.ts";
import { Twin } from "./twin.ts";
import { median } from "./stats.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const argv = process.argv.slice(2);
const has = (name: string): boolean => argv.includes(`--${name}`);
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1]! : def;
};
const MODEL = resolve(opt("model", join(ROOT, ".native/bench-models/gemma4-12b-4bit")));
const LENGTHS = opt("lengths", "8192,32768,131072").split(",").map(Number);
const MODES = opt("modes", "bf16,q8,q4,turbo:4,3,turbo:8,4").split(/,(?![0-9])/);
const DECODE = Number(opt("decode-tokens", "64"));
const REPS = Number(opt("reps", "1"));
const STEP = Number(opt("step", "2048"));
const DEADLINE = Number(opt("deadline", "Infinity"));
const MLX_LM = !has("no-mlx-lm");
const PYTHON = opt("python", process.env.MLX_BUN_PYTHON ?? join(ROOT, ".native/venv/bin/python"));
const WARMUP = !has("no-warmup");
const JSON_OUT = opt("json", "");
const MD_OUT = opt("md", "");
if (!MODES.includes("bf16")) MODES.unshift("bf16"); // the reference of the ratios and the KL
if (DECODE < 2) throw new Error("--decode-tokens must be at least 2");

const T0 = performance.now();
const elapsed = (): number => (performance.now() - T0) / 1000;
const log = (s: string): void => console.error(`[long-context +${elapsed().toFixed(0)}s] ${s}`);

// ------------------------------------------------------------------------------------------
// One variant of mlx-bun: prefill, teacher-forced pass, rewind, timed decode
// ------------------------------------------------------------------------------------------
/** bf16's greedy decode at one length: the tokens fed / chosen and float32 log-probs per step. */
interface Reference {
  tokens: number[];
  logprobs: Float32Array[];
}

interface Measured {
  prefillS: number;
  firstS: number;
  decodeS: number;
  tokens: number[];
  peakBytes: number;
  kl?: number[];
  agree?: number;
  /** Unpipelined steps of the untimed pass, median ms: graph building, and building + evaluation. */
  passBuildMs?: number;
  passStepMs?: number;
}

/**
 * The last position of logits [1, L, V]: float32 log-probabilities [1, V] (for the KL) and the
 * greedy token chosen as the decode pipeline chooses it (argmax of the log-softmax in the model's
 * dtype: Sequence.pick with temperature 0), so ties resolve the same way.
 */
function lastStep(logits: MlxArray): { lp: MlxArray; token: MlxArray } {
  using row = mx.index(logits, ":", -1, ":");
  using native = logSoftmax(row);
  using l32 = mx.astype(row, "float32");
  using lse = mx.logsumexp(l32, -1, { keepdims: true });
  return { lp: mx.subtract(l32, lse), token: mx.argmax(native, -1) };
}

/**
 * The untimed pass: DECODE steps from the last prompt token. Without `ref`: greedy (bf16), its
 * tokens and log-probs returned. With `ref`: ref's tokens fed (teacher-forced), KL(ref ‖ this)
 * and argmax agreement per step.
 */
function forcedPass(
  e: Engine,
  caches: Cache[],
  last: number,
  ref: Reference | null,
): { ref?: Reference; kl?: number[]; agree?: number; passBuildMs?: number; passStepMs?: number } {
  const tokens: number[] = [];
  // Each step is unpipelined (built, evaluated, read): its graph building against its whole time
  // says whether a mode's decode is paced by the host or by the GPU at this context.
  const build: number[] = [];
  const whole: number[] = [];
  const logprobs: Float32Array[] = [];
  const kl: number[] = [];
  let agree = 0;
  let input = last;
  for (let i = 0; i < DECODE; i++) {
    const t0 = performance.now();
    using ids = MlxArray.fromNumbers([input], [1, 1], "int32");
    using logits = e.forward(ids, caches);
    const step = lastStep(logits);
    using lp = step.lp;
    using am = step.token;
    build.push(performance.now() - t0);
    if (!ref) {
      evaluate(lp, am);
      const tok = am.item();
      tokens.push(tok);
      logprobs.push(lp.toTypedArray() as Float32Array);
      input = tok;
    } else {
      using p = MlxArray.fromTypedArray(ref.logprobs[i]!, [1, ref.logprobs[i]!.length], "float32");
      using ep = mx.exp(p);
      using d = mx.subtract(p, lp);
      using prod = mx.multiply(ep, d);
      using s = mx.sum(prod, -1);
      evaluate(s, am);
      kl.push(s.item());
      if (am.item() === ref.tokens[i]) agree++;
      input = ref.tokens[i]!;
    }
    whole.push(performance.now() - t0);
  }
  const phases = { passBuildMs: median(build), passStepMs: median(whole) };
  return ref ? { kl, agree: agree / DECODE, ...phases } : { ref: { tokens, logprobs }, ...phases };
}

async function runVariant(
  kv: string,
  prompt: readonly number[],
  ref: Reference | null,
  withPass: boolean,
  n = DECODE,
): Promise<Measured & { ref?: Reference }> {
  const [spec, ...flags] = kv.split("+") as [string, ...string[]];
  const [full, sliding] = spec.split("~") as [string, string | undefined];
  let scoresGiB: number | undefined;
  for (const f of flags) {
    const m = /^scores(\d+(?:\.\d+)?)$/.exec(f);
    if (m) scoresGiB = Number(m[1]);
    else if (f !== "kernel" && f !== "composition") throw new Error(`--modes ${kv}: "+${f}" is not a variant flag (+kernel, +composition, +scoresN)`);
  }
  const e = new Engine(base.loaded, { kv: full, prefillStep: STEP, ...(sliding ? { kvSliding: sliding } : {}) });
  setDenseDecode(flags.includes("kernel") ? "kernel" : undefined);
  setTurboEncode(flags.includes("composition") ? "composition" : undefined);
  setPrefillScoreBudget(scoresGiB === undefined ? undefined : Math.round(scoresGiB * 2 ** 30));
  memory.clearCache();
  memory.resetPeak();
  const caches = e.makeCaches();
  const snaps = new Map<Cache, CacheState>();
  try {
    let t = performance.now();
    e.prefill(prompt, caches, 1);
    const prefillS = (performance.now() - t) / 1000;
    const peakPrefill = memory.peak();
    let pass: ReturnType<typeof forcedPass> = {};
    if (withPass) {
      // Sliding-window caches have wrapped (older tokens overwritten): a snapshot of their window.
      // Full-attention caches are trimmed back after the pass (exact within what they hold).
      const offsets = caches.map((c) => c.offset);
      for (const c of caches) if (c instanceof RotatingKVCache) snaps.set(c, c.state());
      evaluate(...[...snaps.values()].flatMap((s) => s.tensors));
      pass = forcedPass(e, caches, prompt.at(-1)!, ref);
      caches.forEach((c, i) => {
        const s = snaps.get(c);
        if (s) {
          snaps.delete(c);
          c.restoreState(s);
        } else c.trim(c.offset - offsets[i]!);
        if (c.offset !== offsets[i]) throw new Error(`rewind: cache ${i} holds ${c.offset} tokens, not ${offsets[i]}`);
      });
      memory.clearCache();
      memory.resetPeak();
    }
    // The timed decode: the engine's pipeline over the prefilled caches (Engine.generate's path).
    const seq = new Sequence({ promptIds: [...prompt], maxTokens: n }, base.loaded.tokenizer);
    const row = new Row(seq);
    const runner = new DecodeRunner(e, { background: e.backgroundEval });
    let tFirst = 0;
    try {
      t = performance.now();
      runner.start([row], caches);
      while (!seq.done) {
        await runner.step([row], caches);
        if (!tFirst && seq.generated.length > 0) tFirst = performance.now();
      }
      runner.drain();
    } finally {
      row.release();
      seq.dispose();
    }
    const tEnd = performance.now();
    const tokens = [...seq.generated];
    return {
      prefillS,
      firstS: (tFirst - t) / 1000,
      decodeS: (tEnd - tFirst) / 1000,
      tokens,
      peakBytes: Math.max(peakPrefill, memory.peak()),
      ...(pass.ref ? { ref: pass.ref } : {}),
      ...(pass.kl ? { kl: pass.kl, agree: pass.agree } : {}),
      ...(pass.passBuildMs !== undefined ? { passBuildMs: pass.passBuildMs, passStepMs: pass.passStepMs } : {}),
    };
  } finally {
    setDenseDecode(undefined);
    setTurboEncode(undefined);
    setPrefillScoreBudget(undefined);
    for (const s of snaps.values()) s[Symbol.dispose]();
    for (const c of caches) c.dispose();
    memory.clearCache();
  }
}

// ------------------------------------------------------------------------------------------
// The run
// ------------------------------------------------------------------------------------------
interface Result {
  length: number;
  variant: string; // a KV mode, or "mlx-lm bf16"
  status: "ok" | "skipped" | "failed";
  error?: string;
  rep: number;
  prefillTokPerS?: number;
  decodeTokPerS?: number;
  decodeTokens?: number;
  peakBytes?: number;
  klMean?: number;
  klMax?: number;
  kl?: number[];
  argmaxAgree?: number;
  /** The untimed pass's unpipelined steps (median ms): graph building, and building + evaluation. */
  passBuildMs?: number;
  passStepMs?: number;
  /** The timed decode's greedy tokens equal bf16's teacher-forcing reference (bf16: a check of the rewind; other variants: their own greedy tokens, which may differ). */
  tokensMatchBf16?: boolean;
  startedAtS?: number;
  wallS?: number;
}
const results: Result[] = [];
const MLX_LM_NAME = "mlx-lm bf16";
const VARIANTS = [...MODES, ...(MLX_LM ? [MLX_LM_NAME] : [])];

log(`model ${MODEL}; lengths ${LENGTHS.join("/")}; variants ${VARIANTS.join(", ")}; decode ${DECODE}; reps ${REPS}; step ${STEP}; deadline ${DEADLINE}s`);
const base = Engine.load(MODEL, { prefillStep: STEP });
const vocab = base.loaded.config.text.vocabSize;
const header = `${new Date().toISOString()}; ${cpus().length} cores (${cpus()[0]?.model.trim()}), ${(totalmem() / 2 ** 30).toFixed(0)} GiB, MLX ${mlxVersion()} ${defaultDevice()}; model \`${MODEL.replace(`${ROOT}/`, "")}\` (${base.loaded.config.text.numHiddenLayers} layers, sliding window ${base.loaded.config.text.slidingWindow}); prefill step ${STEP}; ${DECODE} decode tokens; ${REPS} repetition(s)`;
log(`loaded (${(memory.active() / 1e9).toFixed(2)} GB active), background eval ${new Engine(base.loaded).backgroundEval}`);

let py: Twin | null = null;
let pyInfo: Record<string, unknown> = {};
if (MLX_LM) {
  py = new Twin(PYTHON, ROOT);
  pyInfo = JSON.parse(await py.line()) as Record<string, unknown>;
  pyInfo = { ...pyInfo, ...(await py.call<Record<string, unknown>>("load", { model: MODEL })) };
  log(`mlx-lm loaded: ${JSON.stringify(pyInfo)}`);
}

if (WARMUP) {
  // One chunk and a few decode steps per mode (kernel compilation, first-use allocations).
  const warm = syntheticPrompt(Math.min(STEP, Math.min(...LENGTHS)) + 1, 1, vocab);
  for (const m of MODES) await runVariant(m, warm, null, false, 4);
  if (py) await py.call("long", { prompt: warm, n: 4 });
  log("warm-up done");
}

/** One row per (length, variant): medians over the repetitions that ran. */
function summary(): Array<Omit<Result, "rep" | "kl" | "startedAtS" | "wallS"> & { reps: number }> {
  const out: Array<Omit<Result, "rep" | "kl" | "startedAtS" | "wallS"> & { reps: number }> = [];
  for (const n of LENGTHS)
    for (const v of VARIANTS) {
      const rs = results.filter((r) => r.length === n && r.variant === v);
      if (!rs.length) continue;
      const ok = rs.filter((r) => r.status === "ok");
      if (!ok.length) {
        out.push({
          length: n,
          variant: v,
          status: rs.some((r) => r.status === "failed") ? "failed" : "skipped",
          reps: 0,
          ...(rs.find((r) => r.error) ? { error: rs.find((r) => r.error)!.error } : {}),
        });
        continue;
      }
      const withKl = ok.find((r) => r.klMean !== undefined);
      const timedPass = ok.find((r) => r.passBuildMs !== undefined);
      out.push({
        length: n,
        variant: v,
        status: "ok",
        reps: ok.length,
        prefillTokPerS: median(ok.map((r) => r.prefillTokPerS!)),
        decodeTokPerS: median(ok.map((r) => r.decodeTokPerS!)),
        decodeTokens: ok[0]!.decodeTokens,
        peakBytes: Math.max(...ok.map((r) => r.peakBytes!)),
        ...(withKl ? { klMean: withKl.klMean, klMax: withKl.klMax, argmaxAgree: withKl.argmaxAgree } : {}),
        ...(timedPass ? { passBuildMs: timedPass.passBuildMs, passStepMs: timedPass.passStepMs } : {}),
        ...(ok[0]!.tokensMatchBf16 !== undefined ? { tokensMatchBf16: ok.every((r) => r.tokensMatchBf16) } : {}),
      });
    }
  return out;
}

function markdown(): string {
  const rows = summary();
  const lines = [
    header,
    "",
    "Prefill tok/s = prompt tokens / time to the first token; decode tok/s = tokens after the first / time from the first to the last; peak = MLX peak memory of the variant (weights included); KL(bf16 ‖ mode) in nats over the decode steps, teacher-forced on bf16's greedy tokens (mean / max), and argmax = bf16's; pass ms = the untimed pass's unpipelined step (median): graph building / building + evaluation (the KL's few ops included for the quantized modes).",
    "",
    "| prompt | KV | prefill tok/s | vs bf16 | decode tok/s | vs bf16 | peak GB | vs bf16 | KL mean / max | argmax = bf16 | pass ms build / step |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ];
  const f1 = (x: number): string => x.toFixed(1);
  for (const r of rows) {
    const bf = rows.find((x) => x.length === r.length && x.variant === "bf16" && x.status === "ok");
    const ratio = (a: number | undefined, b: number | undefined): string => (a !== undefined && b ? (a / b).toFixed(2) : "—");
    if (r.status !== "ok") {
      lines.push(`| ${r.length} | ${r.variant} | ${r.status}${r.error ? ` (${r.error.split("\n")[0]!.slice(0, 80)})` : ""} | | | | | | | | |`);
      continue;
    }
    const kl = r.klMean !== undefined ? `${r.klMean.toExponential(2)} / ${r.klMax!.toExponential(2)}` : "—";
    const agree = r.argmaxAgree !== undefined ? `${(100 * r.argmaxAgree).toFixed(0)}%` : "—";
    const pass = r.passBuildMs !== undefined ? `${r.passBuildMs.toFixed(2)} / ${r.passStepMs!.toFixed(2)}` : "—";
    lines.push(
      `| ${r.length} | ${r.variant} | ${f1(r.prefillTokPerS!)} | ${ratio(r.prefillTokPerS, bf?.prefillTokPerS)} | ${f1(r.decodeTokPerS!)} | ${ratio(r.decodeTokPerS, bf?.decodeTokPerS)} | ${(r.peakBytes! / 1e9).toFixed(2)} | ${ratio(r.peakBytes, bf?.peakBytes)} | ${kl} | ${agree} | ${pass} |`,
    );
  }
  return `${lines.join("\n")}\n`;
}

function save(complete: boolean): void {
  if (JSON_OUT) {
    const doc = {
      complete,
      header,
      model: MODEL,
      argv,
      lengths: LENGTHS,
      modes: MODES,
      decodeTokens: DECODE,
      reps: REPS,
      step: STEP,
      deadline: DEADLINE,
      mlxLm: pyInfo,
      elapsedS: elapsed(),
      summary: summary(),
      results,
    };
    writeFileSync(`${JSON_OUT}.tmp`, `${JSON.stringify(doc, null, 1)}\n`);
    renameSync(`${JSON_OUT}.tmp`, JSON_OUT);
  }
  if (MD_OUT) {
    writeFileSync(`${MD_OUT}.tmp`, markdown());
    renameSync(`${MD_OUT}.tmp`, MD_OUT);
  }
}

const fmtRes = (r: Result): string =>
  r.status !== "ok"
    ? r.status
    : `prefill ${r.prefillTokPerS!.toFixed(1)} tok/s, decode ${r.decodeTokPerS!.toFixed(1)} tok/s (${r.decodeTokens} tokens), peak ${(r.peakBytes! / 1e9).toFixed(2)} GB${r.klMean !== undefined ? `, KL ${r.klMean.toExponential(2)} / ${r.klMax!.toExponential(2)}, argmax ${(100 * r.argmaxAgree!).toFixed(0)}%` : ""}${r.tokensMatchBf16 !== undefined ? `, tokens ${r.tokensMatchBf16 ? "=" : "≠"} bf16` : ""} in ${r.wallS!.toFixed(1)}s`;

for (const n of LENGTHS) {
  const prompt = syntheticPrompt(n, n, vocab);
  let ref: Reference | null = null;
  for (let rep = 0; rep < REPS; rep++) {
    for (let i = 0; i < VARIANTS.length; i++) {
      const v = VARIANTS[(i + rep) % VARIANTS.length]!;
      const res: Result = { length: n, variant: v, status: "skipped", rep };
      results.push(res);
      if (elapsed() > DEADLINE) {
        log(`${n} tokens, ${v}: skipped (deadline ${DEADLINE}s passed)`);
        save(false);
        continue;
      }
      res.startedAtS = elapsed();
      log(`${n} tokens, ${v}, rep ${rep + 1}: start`);
      try {
        if (v === MLX_LM_NAME) {
          const r = await py!.call<{ ttft_s: number; decode_s: number; tokens: number[]; peak_bytes: number }>("long", { prompt, n: DECODE });
          Object.assign(res, {
            status: "ok",
            prefillTokPerS: n / r.ttft_s,
            decodeTokPerS: (r.tokens.length - 1) / r.decode_s,
            decodeTokens: r.tokens.length,
            peakBytes: r.peak_bytes,
            ...(ref ? { tokensMatchBf16: ref.tokens.slice(0, r.tokens.length).every((x, j) => x === r.tokens[j]) } : {}),
          });
        } else {
          const pass = rep === 0 && (v === "bf16" || ref !== null);
          const r = await runVariant(v, prompt, v === "bf16" ? null : ref, pass);
          if (r.ref) ref = r.ref;
          Object.assign(res, {
            status: "ok",
            prefillTokPerS: n / (r.prefillS + r.firstS),
            decodeTokPerS: (r.tokens.length - 1) / r.decodeS,
            decodeTokens: r.tokens.length,
            peakBytes: r.peakBytes,
            ...(r.kl ? { kl: r.kl, klMean: r.kl.reduce((a, b) => a + b, 0) / r.kl.length, klMax: Math.max(...r.kl), argmaxAgree: r.agree } : {}),
            ...(r.passBuildMs !== undefined ? { passBuildMs: r.passBuildMs, passStepMs: r.passStepMs } : {}),
            ...(ref ? { tokensMatchBf16: ref.tokens.slice(0, r.tokens.length).every((x, j) => x === r.tokens[j]) } : {}),
          });
        }
      } catch (e) {
        res.status = "failed";
        res.error = String((e as Error)?.stack ?? e);
        log(`${n} tokens, ${v}: FAILED ${res.error}`);
      }
      res.wallS = elapsed() - res.startedAtS;
      log(`${n} tokens, ${v}, rep ${rep + 1}: ${fmtRes(res)}`);
      save(false);
    }
  }
}
save(true);
console.log(markdown());
await py?.close();
base.dispose();
