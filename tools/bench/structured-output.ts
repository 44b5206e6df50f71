// Structured output (response_format json_schema): decode tok/s with and without a grammar, in
// process through a Scheduler, at 1 and 16 concurrent streams; repetitions interleave the variants
// (order rotating). Variants: "plain" (no processor), "history" (a no-op processor that reads the
// history: the rows are decoded as grammar rows are, without background evaluation), "schema" (a
// JSON-schema grammar). The schema asks for 64 records, more than the token budget, so every
// variant decodes exactly `--tokens` per stream. Also: grammar build time (cold schema, cached
// schema) and, for a synthetic 262,144-token vocabulary (Gemma 4's size; the bench models have
// the 512-token tiny tokenizer), the host time of a matcher step and of the mask on the logits.
// Stall (--stall-only runs only this): while 8 streams decode on the bench model (4 plain, 4 with
// a schema), a grammar is compiled for the synthetic vocabulary (the first: cold, then a new
// schema on the warm compiler); measured: the longest event-loop stall (1 ms interval probe), the
// longest gap between two tokens of a running stream during the compile (the same without a
// compile as the reference), and how long an advance() of a live processor of that synthetic
// tokenizer, issued 50 ms into the new schema's compile, waits.
//
//   .native/bin/bun tools/bench/structured-output.ts [--model DIR] [--reps 5] [--tokens 64]
//        [--json FILE] [--stall-only]
import { writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { evaluate, MlxArray } from "@mlx-bun/mlx-ffi";
import {
  Engine,
  type GenerateRequest,
  type GenerationStream,
  grammarProcessor,
  type LogitsProcessor,
  Scheduler,
  StructuredOutputCompiler,
} from "@mlx-bun/runtime";
import { stallProbe } from "./stall-probe.ts";
import { syntheticTokenizer } from "./synthetic-tokenizer.ts";
import { spread } from "./stats.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const argv = process.argv.slice(2);
const val = (f: string): string | undefined => {
  const i = argv.indexOf(`--${f}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const O = {
  model: resolve(val("model") ?? join(ROOT, ".native", "bench-models", "gemma4-mini-4bit")),
  reps: Number(val("reps") ?? 5),
  tokens: Number(val("tokens") ?? 64),
  json: val("json"),
};

const SCHEMA = {
  type: "object",
  properties: {
    rows: {
      type: "array",
      items: {
        type: "object",
        properties: {
          id: { type: "integer", minimum: 0, maximum: 9999 },
          name: { type: "string", maxLength: 12 },
          tags: { type: "array", items: { enum: ["a", "b", "c"] }, maxItems: 2 },
          ok: { type: "boolean" },
        },
        required: ["id", "name", "ok"],
      },
      minItems: 64,
      maxItems: 64,
    },
  },
  required: ["rows"],
};

type Variant = "plain" | "history" | "schema";
const VARIANTS: Variant[] = ["plain", "history", "schema"];
const STREAMS = [1, 16];

async function main(): Promise<void> {
  const engine = Engine.load(O.model);
  const tok = engine.loaded.tokenizer;
  const vocab = tok.vocabSize;
  const prompt = (i: number) => Array.from({ length: 24 }, (_, j) => 30 + ((i * 131 + j * 53) % (vocab - 30)));
  const sched = new Scheduler(engine, { maxBatch: 16 });

  // Grammar build: a schema never seen (conversion in the worker + compile), then the cached one.
  let t0 = performance.now();
  (await grammarProcessor(tok, { type: "json_schema", schema: SCHEMA })).dispose();
  const coldMs = performance.now() - t0;
  const warm: number[] = [];
  for (let i = 0; i < 20; i++) {
    t0 = performance.now();
    (await grammarProcessor(tok, { type: "json_schema", schema: SCHEMA })).dispose();
    warm.push(performance.now() - t0);
  }

  async function processors(v: Variant, promptLen: number): Promise<LogitsProcessor[]> {
    if (v === "plain") return [];
    if (v === "history") return [{ readsHistory: true, process: (_h, l) => l.retain() }];
    return [await grammarProcessor(tok, { type: "json_schema", schema: SCHEMA }, { promptTokens: promptLen })];
  }

  /** One run: C streams; 1 stream → its decode tok/s (after the first token), else aggregate tok/s. */
  async function run(v: Variant, C: number): Promise<number> {
    const reqs: GenerateRequest[] = await Promise.all(
      Array.from({ length: C }, async (_, i) => {
        const promptIds = prompt(i + C);
        return { promptIds, maxTokens: O.tokens, logitsProcessors: await processors(v, promptIds.length) };
      }),
    );
    let tFirst = 0;
    const t00 = performance.now();
    const counts = await Promise.all(
      reqs.map(async (r) => {
        const s: GenerationStream = sched.submit(r);
        let n = 0;
        for await (const _ of s) {
          if (!tFirst) tFirst = performance.now();
          n++;
        }
        const res = await s.result;
        for (const p of r.logitsProcessors ?? []) (p as { dispose?(): void }).dispose?.();
        if (res.finishReason !== "length") throw new Error(`${v}: finished by ${res.finishReason} after ${n} tokens`);
        return n;
      }),
    );
    const t = performance.now();
    return C === 1 ? (counts[0]! - 1) / ((t - tFirst) / 1000) : counts.reduce((a, b) => a + b, 0) / ((t - t00) / 1000);
  }

  // Warm-up of every path.
  for (const v of VARIANTS) for (const C of STREAMS) await run(v, C);
  const figures: Record<string, number[]> = {};
  for (let rep = 0; rep < O.reps; rep++) {
    const order = VARIANTS.map((_, i) => VARIANTS[(i + rep) % VARIANTS.length]!);
    for (const C of STREAMS) {
      for (const v of order) (figures[`${v}@${C}`] ??= []).push(await run(v, C));
    }
    console.error(`rep ${rep + 1}/${O.reps} done`);
  }
  await sched.close();
  const stall = await compileStall(engine);
  engine.dispose();

  const synth = await syntheticVocab();
  const out = {
    model: O.model,
    tokens: O.tokens,
    reps: O.reps,
    decode: Object.fromEntries(Object.entries(figures).map(([k, xs]) => [k, spread(xs)])),
    grammarBuildMs: { cold: coldMs, cached: spread(warm) },
    syntheticVocab262144: synth,
    compileStall262144: stall,
  };
  console.log(JSON.stringify(out, null, 2));
  console.log("\n| streams | variant | tok/s min / median / max | × plain (median) |\n| --- | --- | --- | --- |");
  for (const C of STREAMS) {
    const base = spread(figures[`plain@${C}`]!).median;
    for (const v of VARIANTS) {
      const s = spread(figures[`${v}@${C}`]!);
      console.log(`| ${C} | ${v} | ${s.min.toFixed(1)} / ${s.median.toFixed(1)} / ${s.max.toFixed(1)} | ${(s.median / base).toFixed(2)} |`);
    }
  }
  if (O.json) writeFileSync(O.json, `${JSON.stringify(out, null, 2)}\n`);
}

/** The synthetic 262,144-token vocabulary (synthetic-tokenizer.ts) with Gemma's first three specials. */
const synthetic = () => syntheticTokenizer({ specials: ["<pad>", "<eos>", "<bos>"], eos: [1] });

/**
 * The compile stall: 8 streams decode on `engine` (4 plain, 4 with a schema) while a grammar of
 * the synthetic 262,144-token vocabulary compiles (cold, then a new schema on the warm compiler).
 */
async function compileStall(engine: Engine) {
  const tok = engine.loaded.tokenizer;
  const vocab = tok.vocabSize;
  const sched = new Scheduler(engine, { maxBatch: 16 });
  const fake = synthetic();
  const probe = stallProbe();
  // A live processor of the synthetic tokenizer whose advance() is issued as each compile starts.
  let live: Awaited<ReturnType<typeof grammarProcessor>> | null = null;
  const liveHist = [2];
  async function phase(compile: (() => Promise<void>) | null) {
    const stop = new AbortController();
    const times: number[][] = [];
    const streams = await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        const promptIds = Array.from({ length: 24 }, (_, j) => 30 + ((i * 131 + j * 53) % (vocab - 30)));
        const logitsProcessors: LogitsProcessor[] =
          i < 4 ? [] : [await grammarProcessor(tok, { type: "json_schema", schema: SCHEMA }, { promptTokens: promptIds.length })];
        const s = sched.submit({ promptIds, maxTokens: 4000, logitsProcessors, signal: stop.signal });
        const ts: number[] = [];
        times.push(ts);
        // Wrapped: an async function returning the promise itself would wait for it.
        const done = (async () => {
          for await (const _ of s) ts.push(performance.now());
          await s.result;
          for (const p of logitsProcessors) (p as { dispose?(): void }).dispose?.();
        })();
        return { done };
      }),
    );
    console.error(`stall phase ${compile ? "compile" : "reference"}: streams submitted`);
    // Decoding steadily first.
    while (times.some((ts) => ts.length < 8)) await new Promise((r) => setTimeout(r, 5));
    probe.reset();
    const t0 = performance.now();
    let waitMs = 0;
    if (compile) {
      const compiling = compile();
      // Once the compile is under way (50 ms in), a live grammar row of the same tokenizer steps.
      await new Promise((r) => setTimeout(r, 50));
      if (live) {
        const a0 = performance.now();
        liveHist.push((fake.tokenizerJson as { model: { vocab: Record<string, number> } }).model.vocab["{"]!);
        await live.advance(liveHist);
        waitMs = performance.now() - a0;
      }
      await compiling;
    } else await new Promise((r) => setTimeout(r, 1000));
    const t1 = performance.now();
    console.error(`stall phase: done in ${(t1 - t0).toFixed(0)} ms`);
    await new Promise((r) => setTimeout(r, 20));
    const stallMs = probe.max;
    stop.abort();
    await Promise.all(streams.map((s) => s.done));
    let gap = 0;
    for (const ts of times) for (let k = 1; k < ts.length; k++) if (ts[k]! > t0 && ts[k - 1]! < t1 + 20) gap = Math.max(gap, ts[k]! - ts[k - 1]!);
    return {
      compileMs: +(t1 - t0).toFixed(1),
      maxEventLoopStallMs: +stallMs.toFixed(1),
      maxTokenGapMs: +gap.toFixed(1),
      liveAdvanceWaitMs: +waitMs.toFixed(1),
    };
  }
  const reference = await phase(null);
  const cold = await phase(async () => {
    live = await grammarProcessor(fake, { type: "json_schema", schema: SCHEMA }, { promptTokens: 1 });
  });
  const fresh = await phase(async () => {
    // A schema not seen before (a title alone would not change the grammar: it would be cached).
    const schema = { ...SCHEMA, properties: { rows: { ...SCHEMA.properties.rows, minItems: 63, maxItems: 63 } } };
    (await grammarProcessor(fake, { type: "json_schema", schema }, { promptTokens: 1 })).dispose();
  });
  probe.stop();
  (live as { dispose(): void } | null)?.dispose();
  StructuredOutputCompiler.for(fake).close();
  await sched.close();
  return { reference, coldCompile: cold, newSchemaCompile: fresh };
}

/**
 * A random byte-fallback vocabulary of 262,144 tokens (256 byte tokens, then strings of 1-10
 * characters: letters, digits, punctuation, "▁" for spaces, some non-ASCII), the same schema:
 * tokenizer info + compile time, and per generated token the host time of advance() (accept the
 * token, compute the next bitmask) and of the mask applied to a [1, 262144] bf16 logits row.
 */
async function syntheticVocab() {
  const V = 262144;
  let seed = 12345;
  const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
  const fake = synthetic();
  let t0 = performance.now();
  const p = await grammarProcessor(fake, { type: "json_schema", schema: SCHEMA }, { promptTokens: 1 });
  const buildMs = performance.now() - t0;
  t0 = performance.now();
  (await grammarProcessor(fake, { type: "json_schema", schema: { ...SCHEMA, title: "x", required: ["rows"] } }, { promptTokens: 1 })).dispose();
  const cachedMs = performance.now() - t0;
  // Walk: at each step take the first allowed id from a random permutation (cheap on the host).
  using logits = MlxArray.fromTypedArray(new Float32Array(V), [1, V], "float32");
  const hist = [2];
  const adv: number[] = [];
  const mask: number[] = [];
  for (let step = 0; step < 200; step++) {
    t0 = performance.now();
    const masked = p.process(hist, logits);
    evaluate(masked);
    mask.push(performance.now() - t0);
    const row = masked.toFloat64Array();
    masked.dispose();
    const allowed: number[] = [];
    row.forEach((v, i) => v !== Number.NEGATIVE_INFINITY && allowed.push(i));
    const t = allowed[Math.floor(rnd() * allowed.length)]!;
    if (t === 1) break;
    hist.push(t);
    t0 = performance.now();
    await p.advance(hist);
    adv.push(performance.now() - t0);
  }
  p.dispose();
  StructuredOutputCompiler.for(fake).close();
  return { buildMs, cachedBuildMs: cachedMs, steps: adv.length, advanceMs: spread(adv), maskMs: spread(mask) };
}

if (argv.includes("--synthetic-only")) console.log(JSON.stringify(await syntheticVocab(), null, 2));
else if (argv.includes("--stall-only")) {
  const engine = Engine.load(O.model);
  console.log(JSON.stringify(await compileStall(engine), null, 2));
  engine.dispose();
} else await main();
process.exit(0);
