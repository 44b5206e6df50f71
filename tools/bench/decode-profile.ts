// Where a decoded token's time goes in mlx-bun (batch 1): the same greedy decode run as
// (a) unpipelined graph build + evaluate, (b) (a) plus reading the token with item(),
// (c) a bare pipelined loop (asyncEval of step n+1 before reading token n, as mlx-lm), (c2) the
// same reading the token with toTypedArray() instead of item(), (c3) (c) on a stream of its own,
// (d) (c) plus Sequence.accept (detokenize, stop strings, event) and a setImmediate per token,
// (e) Engine.generate consumed with for-await (background evaluation, docs/background-eval.md),
// (e0) the same with backgroundEval off, (f) the Scheduler with one request.
// Milliseconds per token, min / median over --reps; variants interleaved per repetition; plus,
// after the warm-up, one run of (a) and one of (c) split into build / asyncEval call / wait per
// token (unpipelined, a wait well above zero after the asyncEval call means the GPU, not the
// host, sets the pace).
//
//   .native/bin/bun tools/bench/decode-profile.ts [--model DIR] [--tokens 64] [--reps 5]
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { asyncEval, evaluate, MlxArray, Stream, withStream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine, Scheduler, type Sequence } from "@mlx-bun/runtime";
import { decodeSteps, type StepPhases } from "./decode-steps.ts";
import { median } from "./stats.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const arg = (f: string, d: string) => {
  const i = process.argv.indexOf(`--${f}`);
  return i >= 0 ? process.argv[i + 1]! : d;
};
const model = resolve(arg("model", join(ROOT, ".native/bench-models/gemma4-mini-4bit")));
if (!existsSync(model)) throw new Error(`no model at ${model} (bash tools/bench/make-bench-model.sh)`);
const N = Number(arg("tokens", "64"));
const REPS = Number(arg("reps", "5"));

using engine = Engine.load(model, { kv: "bf16" });
const plainEngine = new Engine(engine.loaded, { kv: "bf16", backgroundEval: false });
const { tokenizer, template } = engine.loaded;
const prompt = template!.apply(
  tokenizer,
  [{ role: "user", content: "Hello world! What is the capital of France? Write a short poem about the sea and the sky." }],
  { addGenerationPrompt: true },
);

const { prefilled, step, done, unpipelined: unpipelinedSteps } = decodeSteps(engine, prompt, N + 2);

interface PipelineOptions {
  /** Read step n's token (after step n+1 was scheduled). */
  read: (p: ReturnType<typeof step>, seq: Sequence) => void;
  /** Build each step inside this (e.g. on another stream). */
  within?: <T>(f: () => T) => T;
  /** Awaited before each step (e.g. a turn of the event loop, as Engine yields). */
  beforeStep?: () => Promise<unknown>;
  /** When given, accumulates ms spent building, in the asyncEval call and in read(). */
  phases?: StepPhases;
}

/** The pipelined loop (as mlx-lm's generate_step): schedule step n+1, then read token n. Returns ms per token. */
async function pipelined(o: PipelineOptions): Promise<number> {
  const s = prefilled();
  const within = o.within ?? ((f) => f());
  const t0 = performance.now();
  let cur = within(() => step(s));
  asyncEval(cur.token, cur.logprobs);
  for (let i = 0; i < N; i++) {
    if (o.beforeStep) await o.beforeStep();
    const a = performance.now();
    const next = within(() => step(s, cur.token));
    const b = performance.now();
    asyncEval(next.token, next.logprobs);
    const c = performance.now();
    o.read(cur, s.seq);
    if (o.phases) {
      o.phases.build += b - a;
      o.phases.asyncEval += c - b;
      o.phases.wait += performance.now() - c;
    }
    cur.token.dispose();
    cur.logprobs.dispose();
    cur = next;
  }
  cur.token.item();
  const t = performance.now() - t0;
  cur.token.dispose();
  cur.logprobs.dispose();
  done(s);
  return t / N;
}

async function generateMs(e: Engine): Promise<number> {
  const st = e.generate({ promptIds: prompt, maxTokens: N + 1 });
  let t0 = 0;
  for await (const _ of st) if (!t0) t0 = performance.now();
  return (performance.now() - t0) / N;
}

/** N unpipelined steps, each evaluated (and its token read with item() when `read`); ms per token. */
function unpipelinedMs(read: boolean): number {
  const s = prefilled();
  const t0 = performance.now();
  for (let i = 0; i < N; i++) {
    const p = step(s);
    evaluate(p.token, p.logprobs);
    if (read) p.token.item();
    s.tok.dispose();
    p.logprobs.dispose();
    s.tok = p.token;
  }
  const t = performance.now() - t0;
  done(s);
  return t / N;
}

const variants: Record<string, () => Promise<number>> = {
  "a. unpipelined build + eval": async () => unpipelinedMs(false),
  "b. (a) + item()": async () => unpipelinedMs(true),
  "c. pipelined, bare": () => pipelined({ read: (p) => void p.token.item() }),
  "c3. (c) on a stream of its own (mlx-lm's generation_stream)": () => {
    using gen = Stream.create();
    return pipelined({ read: (p) => void p.token.item(), within: (f) => withStream(gen, f) });
  },
  // toTypedArray() reads through the host view (mlxb_array_host_view); item() through mlxb_array_item_f64.
  "c2. pipelined, read with toTypedArray()": () => pipelined({ read: (p) => void p.token.toTypedArray()[0] }),
  "d. (c) + Sequence.accept + setImmediate": () => pipelined({ read: (p, seq) => seq.accept(p), beforeStep: () => new Promise((r) => setImmediate(r)) }),
  "e. Engine.generate (for await)": () => generateMs(engine),
  "e0. (e) with backgroundEval off": () => generateMs(plainEngine),
  "f. Scheduler, one request": async () => {
    const sched = new Scheduler(engine, { maxBatch: 16 });
    const st = sched.submit({ promptIds: prompt, maxTokens: N + 1 });
    let t0 = 0;
    for await (const _ of st) if (!t0) t0 = performance.now();
    const t = (performance.now() - t0) / N;
    await sched.close();
    return t;
  },
};

const res: Record<string, number[]> = {};
for (const k of Object.keys(variants)) await variants[k]!(); // warm-up

// (a) and (c) once more, timing three phases per token: graph build, the asyncEval call itself (on
// a GPU, MLX encodes the kernels in the calling thread) and the wait for the token.
const phases = { build: 0, asyncEval: 0, wait: 0 };
await pipelined({ read: (p) => void p.token.item(), phases });
let unpipelined: StepPhases;
{
  const s = prefilled();
  unpipelined = unpipelinedSteps(s, N);
  done(s);
}
for (let r = 0; r < REPS; r++) {
  const keys = Object.keys(variants);
  for (const k of r % 2 ? keys.reverse() : keys) (res[k] ??= []).push(await variants[k]!());
  process.stderr.write(`\r[decode-profile] rep ${r + 1}/${REPS}`);
}
process.stderr.write("\n");
console.log(`decode profile: ${model.split("/").at(-1)}, ${prompt.length}-token prompt, ${N} tokens, ${REPS} reps (ms per token, min / median)`);
const perPhase = (p: StepPhases, per: number) =>
  `build ${(p.build / per).toFixed(2)}, asyncEval call ${(p.asyncEval / per).toFixed(2)}, wait in item() ${(p.wait / per).toFixed(2)}`;
console.log(`(a) per phase, ms per token: ${perPhase(unpipelined, 1)}`);
console.log(`(c) per phase, ms per token: ${perPhase(phases, N)}`);
for (const [k, xs] of Object.entries(res))
  console.log(
    `${k.padEnd(42)} ${Math.min(...xs)
      .toFixed(2)
      .padStart(7)} / ${median(xs).toFixed(2).padStart(7)}`,
  );
