// mlx-bun vs mlx-lm, one command, one machine state: each figure is measured on both sides in
// the same run, repetitions interleaved (A B, B A, ...), and reported as min / median / max with
// the mlx-bun / mlx-lm ratio of the medians. The mlx-lm side is a persistent Python twin
// (tools/bench/mlx_lm_bench.py --serve) driven over stdin/stdout; the HTTP figures start
// `mlx-bun serve` and `mlx_lm.server` on 127.0.0.1 and send both the same requests.
//
//   .native/bin/bun tools/bench/compare.ts [--model DIR] [--quick] [--label CPU]
//        [--reps N] [--decode-tokens N] [--prefill 512,4096] [--prefill-reps N] [--streams 1,4,16]
//        [--stream-tokens N] [--stream-reps N] [--ttft-reps N] [--ttft-words N] [--kv-tokens N]
//        [--kv-modes bf16,q8,q4,turbo:4,3] [--bandwidth-mb N] [--no-http] [--skip PHASE,...]
//        [--md docs/benchmarks.md | --no-md] [--json FILE] [--python PY] [--section TITLE]
//   .native/bin/bun tools/bench/compare.ts --render FILE.json [--no-md]   # a saved run's table
//
// Checkpoints: bash tools/bench/make-bench-model.sh. The H200 run: tools/bench/device/*.sh.
//
// Figures: decode tok/s at batch 1; prefill tok/s; TTFT over HTTP; HTTP overhead against
// in-process generation; aggregate tok/s at 1/4/16 concurrent streams; MLX peak memory of each
// process; KV bytes per token per --kv mode; a bandwidth roofline for decode; and, for the
// mlx-bun side, FFI crossings and host graph-building time per decoded token.
import { syntheticPrompt } from "./synthetic-prompt.ts";
import { Twin } from "./twin.ts";
import { appendFileSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, readSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { cpus, totalmem } from "node:os";
import { evaluate, lib, memory, MlxArray, mlxVersion, defaultDevice } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Engine, Scheduler, Sequence } from "@mlx-bun/runtime";
import { median, spread, type Spread } from "./stats.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

// ------------------------------------------------------------------------------------------
// Options
// ------------------------------------------------------------------------------------------
const argv = process.argv.slice(2);
const has = (f: string) => argv.includes(`--${f}`);
const val = (f: string): string | undefined => {
  const i = argv.indexOf(`--${f}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const num = (f: string, d: number) => (val(f) !== undefined ? Number(val(f)) : d);
const list = (f: string, d: number[]) => (val(f) !== undefined ? val(f)!.split(",").filter(Boolean).map(Number) : d);

const QUICK = has("quick");
// --skip decode,prefill,...: leave out in-process phases (by name, as in the progress lines), e.g.
// to fit the HTTP figures into one device call after the others were measured.
const SKIP = new Set((val("skip") ?? "").split(",").filter(Boolean));
// The 1B checkpoint on a GPU; on a CPU the mini one (the 1B decodes at ~15 s/token on the CI VM).
const defaultModel = (defaultDeviceName() === "GPU" ? ["gemma4-1b-4bit", "gemma4-mini-4bit"] : ["gemma4-mini-4bit", "gemma4-1b-4bit"])
  .map((p) => join(ROOT, ".native", "bench-models", p))
  .find((p) => existsSync(p));
const O = {
  model: resolve(val("model") ?? defaultModel ?? ""),
  label: val("label") ?? `${defaultDeviceName()}`,
  reps: num("reps", QUICK ? 3 : 5),
  decodeTokens: num("decode-tokens", QUICK ? 32 : 128),
  prefill: list("prefill", [512, 4096]),
  prefillReps: num("prefill-reps", QUICK ? 1 : 2),
  ttftReps: num("ttft-reps", QUICK ? 3 : 5),
  ttftWords: num("ttft-words", 100),
  streams: list("streams", [1, 4, 16]),
  streamTokens: num("stream-tokens", QUICK ? 32 : 64),
  streamReps: num("stream-reps", QUICK ? 1 : 2),
  kvTokens: num("kv-tokens", 1024),
  kvModes: (val("kv-modes") ?? "bf16,q8,q4,turbo:4,3").split(/,(?=[a-z])/),
  bwMb: num("bandwidth-mb", 1024),
  http: !has("no-http"),
  md: has("no-md") ? null : resolve(val("md") ?? join(ROOT, "docs", "benchmarks.md")),
  json: val("json"),
  python: val("python") ?? process.env.MLX_BUN_PYTHON ?? join(ROOT, ".native", "venv", "bin", "python"),
  section: val("section") ?? "Decode, prefill, HTTP and batching: mlx-bun vs mlx-lm (issue 7)",
};
if (val("render")) {
  // Re-render a run's JSON (e.g. one cut short on the device machine) into the markdown.
  const text = renderMarkdown(JSON.parse(readFileSync(val("render")!, "utf8")) as Report);
  console.log(text);
  if (O.md) writeMarkdown(O.md, text);
  process.exit(0);
}
if (!O.model || !existsSync(join(O.model, "config.json"))) {
  console.error(`compare: no model at ${O.model || "(none)"}; make one with bash tools/bench/make-bench-model.sh`);
  process.exit(2);
}
const CLI = join(ROOT, "apps", "mlx-bun", "src", "cli.ts");
const HTTP = O.http && existsSync(CLI);

function machineLine(): string {
  return `${cpus().length} cores (${cpus()[0]?.model ?? "?"}), ${(totalmem() / 2 ** 30).toFixed(0)} GiB, MLX ${mlxVersion()} ${defaultDeviceName()} backend`;
}
function defaultDeviceName(): string {
  try {
    return defaultDevice() === "gpu" ? "GPU" : "CPU";
  } catch {
    return "CPU";
  }
}

// ------------------------------------------------------------------------------------------
// Progress display (one status line on a terminal; a line per phase otherwise)
// ------------------------------------------------------------------------------------------
const T0 = performance.now();
const TTY = process.stderr.isTTY;
let curPhase = "";
const clock = () => {
  const s = Math.round((performance.now() - T0) / 1000);
  return `${String(Math.floor(s / 60)).padStart(2, "0")}:${String(s % 60).padStart(2, "0")}`;
};
function progress(p: string, detail = ""): void {
  if (TTY) process.stderr.write(`\r\x1b[2K[compare ${clock()}] ${p}${detail ? ` · ${detail}` : ""}`);
  else if (p !== curPhase) process.stderr.write(`[compare ${clock()}] ${p}\n`);
  curPhase = p;
}
function note(s: string): void {
  if (TTY) process.stderr.write("\r\x1b[2K");
  process.stderr.write(`[compare ${clock()}] ${s}\n`);
}

// ------------------------------------------------------------------------------------------
// Stats
// ------------------------------------------------------------------------------------------
type Stat = Spread;

interface Row {
  figure: string;
  unit: string;
  higherIsBetter: boolean;
  ours: Stat | null;
  theirs: Stat | null;
  note?: string;
}
const rows: Row[] = [];
const extra: Record<string, unknown> = {};
const jsonPath = resolve(O.json ?? join(ROOT, "docs", "bench-results", `compare-${O.label.toLowerCase().replace(/[^a-z0-9]+/g, "-")}.json`));
/** Rewritten after every figure, so a run cut short still leaves its figures. */
function writeJson(complete: boolean): void {
  mkdirSync(dirname(jsonPath), { recursive: true });
  const cmd = `.native/bin/bun tools/bench/compare.ts ${argv.map((a) => (/[\s(),;&|]/.test(a) ? JSON.stringify(a) : a)).join(" ")}`.trim();
  const cfg = JSON.parse(readFileSync(join(O.model, "config.json"), "utf8"));
  const tc = cfg.text_config ?? cfg;
  const model_config = Object.fromEntries(
    ["hidden_size", "num_hidden_layers", "num_kv_shared_layers", "vocab_size", "dtype", "quantization"].map((k) => [k, tc[k] ?? cfg[k]]),
  );
  writeFileSync(
    jsonPath,
    `${JSON.stringify({ model_config, date: new Date(performance.timeOrigin + T0).toISOString(), machine: machineLine(), command: cmd, complete, model: O.model, options: O, rows, extra, elapsed_s: (performance.now() - T0) / 1000 }, null, 2)}\n`,
  );
}
function addRow(figure: string, unit: string, higherIsBetter: boolean, ours: number[] | null, theirs: number[] | null, noteText?: string): Row {
  const r: Row = {
    figure,
    unit,
    higherIsBetter,
    ours: ours?.length ? spread(ours) : null,
    theirs: theirs?.length ? spread(theirs) : null,
    ...(noteText ? { note: noteText } : {}),
  };
  rows.push(r);
  writeJson(false);
  const f = (s: Stat | null) => (s ? (unit === "bytes" ? fmtBytes(s.median) : fmt(s.median)) : "—");
  note(`${figure}: mlx-bun ${f(r.ours)} / mlx-lm ${f(r.theirs)} ${unit}${r.ours && r.theirs ? ` (×${(r.ours.median / r.theirs.median).toFixed(2)})` : ""}`);
  return r;
}
function fmtBytes(x: number): string {
  if (x >= 1e9) return `${(x / 1e9).toFixed(2)} GB`;
  if (x >= 1e6) return `${(x / 1e6).toFixed(1)} MB`;
  if (x >= 1e3) return `${(x / 1e3).toFixed(1)} kB`;
  return `${x} B`;
}
function fmt(x: number): string {
  if (!Number.isFinite(x)) return String(x);
  const a = Math.abs(x);
  if (a >= 1e9) return `${(x / 1e9).toFixed(2)}G`;
  if (a >= 1e6) return `${(x / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return x.toFixed(0);
  if (a >= 100) return x.toFixed(1);
  if (a >= 1) return x.toFixed(2);
  return x.toPrecision(3);
}

// ------------------------------------------------------------------------------------------
// Prompts (the same ids on both sides)
// ------------------------------------------------------------------------------------------
// syntheticPrompt (synthetic-prompt.ts): vocab 512, the bench models' text ids.
const WORDS = "the quick brown fox jumps over the lazy dog while the model thinks before it answers and calls a tool to get the weather in london".split(" ");
function words(n: number, seed: number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push(WORDS[(i * 7 + seed * 13) % WORDS.length]!);
  return out.join(" ");
}

// ------------------------------------------------------------------------------------------
// mlx-bun in-process measurements
// ------------------------------------------------------------------------------------------
async function oursDecode(engine: Engine, prompt: number[], n: number): Promise<{ ttft: number; decode: number; tokens: number[] }> {
  const t0 = performance.now();
  const s = engine.generate({ promptIds: prompt, maxTokens: n });
  let tFirst = 0;
  const toks: number[] = [];
  for await (const ev of s) {
    if (!tFirst) tFirst = performance.now();
    toks.push(ev.token);
  }
  const tEnd = performance.now();
  await s.result;
  return { ttft: (tFirst - t0) / 1000, decode: (tEnd - tFirst) / 1000, tokens: toks };
}

async function oursPrefill(engine: Engine, prompt: number[]): Promise<number> {
  const t0 = performance.now();
  const s = engine.generate({ promptIds: prompt, maxTokens: 1 });
  for await (const _ of s) break;
  const t = (performance.now() - t0) / 1000;
  await s.result;
  return t;
}

/** Unpipelined decode: host time to build one step's graph, and the time to evaluate it. */
function oursSteps(engine: Engine, prompt: number[], n: number): { build: number; eval: number } {
  const caches = engine.makeCaches();
  const seq = new Sequence({ promptIds: prompt, maxTokens: n + 1 }, engine.loaded.tokenizer);
  let build = 0;
  let ev = 0;
  try {
    let tok: MlxArray;
    {
      using x = MlxArray.fromNumbers(prompt, [1, prompt.length], "int32");
      using logits = engine.forward(x, caches);
      using row = mx.index(logits, ":", -1, ":");
      const p = seq.pick(row);
      p.logprobs.dispose();
      tok = p.token;
      evaluate(tok);
    }
    for (let i = 0; i < n; i++) {
      const t0 = performance.now();
      using t32 = mx.astype(tok, "int32");
      using x = mx.reshape(t32, [1, 1]);
      using logits = engine.forward(x, caches);
      using row = mx.index(logits, ":", -1, ":");
      const p = seq.pick(row);
      const t1 = performance.now();
      evaluate(p.token, p.logprobs);
      const t2 = performance.now();
      build += t1 - t0;
      ev += t2 - t1;
      tok.dispose();
      p.logprobs.dispose();
      tok = p.token;
    }
    tok.dispose();
  } finally {
    for (const c of caches) c.dispose();
    seq.dispose();
  }
  return { build: build / n / 1000, eval: ev / n / 1000 };
}

/** FFI crossings per decoded token: every native call through the core table, plus every op result. */
async function countCrossings(engine: Engine, prompt: number[], n: number): Promise<Record<string, number>> {
  const core = lib() as unknown as Record<string, (...a: unknown[]) => unknown>;
  const counts = new Map<string, number>();
  const saved = new Map<string, (...a: unknown[]) => unknown>();
  for (const k of Object.keys(core)) {
    const f = core[k];
    if (typeof f !== "function") continue;
    saved.set(k, f);
    core[k] = (...a: unknown[]) => {
      counts.set(k, (counts.get(k) ?? 0) + 1);
      return f(...a);
    };
  }
  const M = MlxArray as unknown as { fromHandle: (...a: unknown[]) => MlxArray };
  const fromHandle = M.fromHandle;
  let made = 0;
  M.fromHandle = (...a: unknown[]) => {
    made++;
    return fromHandle.apply(MlxArray, a);
  };
  const snapshot = () => ({ made, core: new Map(counts) });
  let a: ReturnType<typeof snapshot>;
  let b: ReturnType<typeof snapshot>;
  try {
    // Count two runs that differ only in decoded tokens: the difference is per-token cost.
    a = snapshot();
    await oursDecode(engine, prompt, 2);
    const m1 = snapshot();
    await oursDecode(engine, prompt, 2 + n);
    b = snapshot();
    const d = (k: string) => (b.core.get(k) ?? 0) - (m1.core.get(k) ?? 0) - ((m1.core.get(k) ?? 0) - (a.core.get(k) ?? 0));
    const coreKeys = new Set([...b.core.keys()]);
    const perCore: Record<string, number> = {};
    let coreTotal = 0;
    for (const k of coreKeys) {
      const v = d(k) / n;
      if (Math.abs(v) >= 0.01) perCore[k] = Math.round(v * 100) / 100;
      coreTotal += v;
    }
    const ops = (b.made - m1.made - (m1.made - a.made)) / n;
    // Arrays made through the core table (fromBytes, scalars) are counted in both; ops made by
    // other tables (mlx-ops, kv-cache, models) only in `made`.
    const coreMade =
      (perCore.mlxb_array_from_bytes ?? 0) + (perCore.mlxb_array_scalar ?? 0) + (perCore.mlxb_array_scalar_int ?? 0) + (perCore.mlxb_array_retain ?? 0);
    return { arrays_made_per_token: ops, core_calls_per_token: coreTotal, crossings_per_token: coreTotal + ops - coreMade, ...perCore };
  } finally {
    for (const [k, f] of saved) core[k] = f;
    M.fromHandle = fromHandle;
  }
}

function oursBandwidth(mb: number, reps: number): number[] {
  using x = mx.random.uniform(0, 1, [(mb * 1024 * 1024) / 4]);
  evaluate(x);
  {
    using y = mx.add(x, 1);
    evaluate(y);
  }
  const out: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t = performance.now();
    using y = mx.add(x, 1);
    evaluate(y);
    out.push((2 * mb * 1024 * 1024) / ((performance.now() - t) / 1000) / 1e9);
  }
  memory.clearCache();
  return out;
}

// ------------------------------------------------------------------------------------------
// Checkpoint arithmetic: bytes read per decoded token
// ------------------------------------------------------------------------------------------
function tensorBytes(dir: string): Map<string, number> {
  const out = new Map<string, number>();
  const files = [
    ...new Set(
      existsSync(join(dir, "model.safetensors.index.json"))
        ? Object.values(JSON.parse(readFileSync(join(dir, "model.safetensors.index.json"), "utf8")).weight_map as Record<string, string>)
        : ["model.safetensors"],
    ),
  ];
  for (const f of files) {
    const fd = openSync(join(dir, f), "r");
    const head = Buffer.alloc(8);
    readSync(fd, head, 0, 8, 0);
    const n = Number(head.readBigUInt64LE(0));
    const js = Buffer.alloc(n);
    readSync(fd, js, 0, n, 8);
    closeSync(fd);
    for (const [k, v] of Object.entries(JSON.parse(js.toString("utf8")) as Record<string, { data_offsets?: [number, number] }>)) {
      if (v.data_offsets) out.set(k, v.data_offsets[1] - v.data_offsets[0]);
    }
  }
  return out;
}

function bytesPerDecodedToken(engine: Engine, context: number): { weights: number; kv: number; table: number; total: number; params_bytes: number } {
  const tb = tensorBytes(engine.loaded.dir);
  let weights = 0;
  let table = 0;
  let all = 0;
  const rowsOf = engine.loaded.config.text.vocabSize;
  for (const [k, b] of tb) {
    all += b;
    if (k.includes("embed_tokens_per_layer.")) {
      table += b;
      weights += b / (engine.loaded.config.text.vocabSizePerLayerInput ?? rowsOf); // one row is looked up
    } else if (k.includes("vision") || k.includes("audio")) {
      // not used by text decoding
    } else weights += b; // the tied embedding is read whole by the lm_head
  }
  // KV read: every layer attends over its (or its donor's) cache; bf16 K and V.
  let kv = 0;
  for (const s of engine.loaded.model.specs) {
    const tokens = s.window !== null ? Math.min(context, s.window) : context;
    kv += 2 * s.numKvHeads * s.headDim * 2 * tokens;
  }
  return { weights, kv, table, total: weights + kv, params_bytes: all };
}

// ------------------------------------------------------------------------------------------
// HTTP
// ------------------------------------------------------------------------------------------
interface Srv {
  name: string;
  url: string;
  proc: ReturnType<typeof Bun.spawn>;
}
async function freePort(): Promise<number> {
  const s = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const p = s.port;
  s.stop(true);
  return p;
}
async function waitHealthy(url: string, proc: ReturnType<typeof Bun.spawn>, seconds: number): Promise<void> {
  const until = performance.now() + seconds * 1000;
  while (performance.now() < until) {
    if (proc.exitCode !== null) throw new Error(`server at ${url} exited with ${proc.exitCode}`);
    try {
      const r = await fetch(`${url}/health`);
      if (r.ok) return;
    } catch {}
    await Bun.sleep(200);
  }
  throw new Error(`server at ${url} did not answer /health within ${seconds}s`);
}
async function startServers(): Promise<Srv[]> {
  const [p1, p2] = [await freePort(), await freePort()];
  const ours = Bun.spawn([process.execPath, CLI, "serve", "--model", O.model, "--host", "127.0.0.1", "--port", String(p1), "--no-log", "--max-batch", "16"], {
    stdout: "ignore",
    stderr: "pipe",
    env: { ...process.env },
  });
  const theirs = Bun.spawn([O.python, "-m", "mlx_lm.server", "--model", O.model, "--host", "127.0.0.1", "--port", String(p2), "--log-level", "WARNING"], {
    stdout: "ignore",
    stderr: "pipe",
    env: { ...process.env, PYTHONUNBUFFERED: "1" },
  });
  const srv: Srv[] = [
    { name: "mlx-bun serve", url: `http://127.0.0.1:${p1}`, proc: ours },
    { name: "mlx_lm.server", url: `http://127.0.0.1:${p2}`, proc: theirs },
  ];
  for (const s of srv) drain(s);
  for (const s of srv) await waitHealthy(s.url, s.proc, 600);
  return srv;
}
const serverLogs = new Map<string, string>();
async function drain(s: Srv): Promise<void> {
  const r = (s.proc.stderr as ReadableStream<Uint8Array>).getReader();
  const d = new TextDecoder();
  let log = "";
  for (;;) {
    const { value, done } = await r.read();
    if (done) break;
    log = (log + d.decode(value)).slice(-4000);
    serverLogs.set(s.name, log);
  }
}

interface ChatResult {
  ttft: number; // first non-empty content delta
  total: number;
  tFirst: number;
  tLast: number;
  tStart: number;
  completionTokens: number;
  promptTokens: number;
  chunks: number;
}
async function chat(url: string, content: string, maxTokens: number): Promise<ChatResult> {
  const tStart = performance.now();
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "default_model",
      messages: [{ role: "user", content }],
      chat_template_kwargs: { enable_thinking: false },
      max_tokens: maxTokens,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (!r.ok || !r.body) throw new Error(`${url}: HTTP ${r.status} ${await r.text()}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let tFirst = 0;
  let tLast = 0;
  let chunks = 0;
  let usage: { prompt_tokens?: number; completion_tokens?: number } | undefined;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i: number;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") continue;
      const j = JSON.parse(data);
      if (j.usage) usage = j.usage;
      const c = j.choices?.[0]?.delta?.content ?? j.choices?.[0]?.delta?.reasoning;
      if (typeof c === "string" && c.length) {
        const now = performance.now();
        if (!tFirst) tFirst = now;
        tLast = now;
        chunks++;
      }
    }
  }
  const tEnd = performance.now();
  return {
    ttft: (tFirst - tStart) / 1000,
    total: (tEnd - tStart) / 1000,
    tFirst,
    tLast,
    tStart,
    completionTokens: usage?.completion_tokens ?? chunks,
    promptTokens: usage?.prompt_tokens ?? -1,
    chunks,
  };
}

// ------------------------------------------------------------------------------------------
// Main
// ------------------------------------------------------------------------------------------
const startedAt = new Date();
note(`model ${O.model}; ${QUICK ? "quick" : "full"} run; HTTP ${HTTP ? "on" : O.http ? "off (apps/mlx-bun/src/cli.ts not found)" : "off"}`);
progress("loading both sides");
const twin = new Twin(O.python, ROOT);
const ready = JSON.parse(await twin.line());
const tl = performance.now();
const engine = Engine.load(O.model, { kv: "bf16" });
const oursLoad = (performance.now() - tl) / 1000;
{
  // Materialize weights that load lazily, so "active" memory counts them.
  await oursDecode(engine, [2, 5, 300, 301], 2);
}
const oursWeights = memory.active();
const theirsLoad = await twin.call<{ load_s: number; active_bytes: number; device: string }>("load", { model: O.model });
extra.load = { ours_s: oursLoad, theirs_s: theirsLoad.load_s, ours_active_bytes: oursWeights, theirs_active_bytes: theirsLoad.active_bytes };
extra.device = { ours: defaultDeviceName(), theirs: theirsLoad.device, mlx_ours: mlxVersion(), mlx_theirs: ready.mlx };
note(
  `loaded: mlx-bun ${oursLoad.toFixed(1)}s (${fmtBytes(oursWeights)} active), mlx-lm ${theirsLoad.load_s.toFixed(1)}s (${fmtBytes(theirsLoad.active_bytes)}); device ${defaultDeviceName()} / ${theirsLoad.device}`,
);

const { tokenizer, template } = engine.loaded;
const chatText = "Hello world! What is the capital of France? Write a short poem about the sea and the sky.";
const chatPrompt = template!.apply(tokenizer, [{ role: "user", content: chatText }], { addGenerationPrompt: true });

// Warm-up: compile/JIT, allocator, both sides.
progress("warm-up");
await oursDecode(engine, chatPrompt, 8);
await twin.call("decode", { prompt: chatPrompt, n: 8 });
memory.resetPeak();
await twin.call("peak", { reset: true });

/** Run one phase; a failure is recorded (and printed) and the run goes on with the next phase. */
const failures: Record<string, string> = {};
async function phase(name: string, f: () => Promise<void>): Promise<void> {
  if (SKIP.has(name)) return;
  try {
    await f();
  } catch (e) {
    const msg = (e as Error)?.stack ?? String(e);
    failures[name] = msg.slice(0, 2000);
    extra.failures = failures;
    note(`phase ${name} FAILED: ${msg.split("\n").slice(0, 6).join(" | ")}`);
    writeJson(false);
  }
}

/** Interleave: rep r runs A then B when r is even, B then A when odd. */
async function interleave(label: string, reps: number, a: (r: number) => Promise<number>, b: (r: number) => Promise<number>): Promise<[number[], number[]]> {
  const xa: number[] = [];
  const xb: number[] = [];
  for (let r = 0; r < reps; r++) {
    progress(label, `rep ${r + 1}/${reps}`);
    if (r % 2 === 0) {
      xa.push(await a(r));
      xb.push(await b(r));
    } else {
      xb.push(await b(r));
      xa.push(await a(r));
    }
  }
  return [xa, xb];
}

// 1. Memory bandwidth, measured by both processes with the same MLX op.
await phase("bandwidth", async () => {
  const [a, b] = await interleave(
    "bandwidth",
    3,
    async () => median(oursBandwidth(O.bwMb, 5)),
    async () => median((await twin.call<{ gbps: number[] }>("bandwidth", { mb: O.bwMb, reps: 5 })).gbps),
  );
  addRow(`memory bandwidth (x + 1 over ${O.bwMb} MiB float32, read + write)`, "GB/s", true, a, b);
  memory.resetPeak();
  await twin.call("peak", { reset: true });
});

// 2. Decode tok/s at batch 1 (greedy, chat prompt; the first token is not counted).
let decodeTokensChecked = false;
await phase("decode", async () => {
  const [a, b] = await interleave(
    `decode batch 1 (${O.decodeTokens} tokens)`,
    O.reps,
    async () => {
      const r = await oursDecode(engine, chatPrompt, O.decodeTokens);
      return (r.tokens.length - 1) / r.decode;
    },
    async () => {
      const r = await twin.call<{ decode_s: number; tokens: number[] }>("decode", { prompt: chatPrompt, n: O.decodeTokens });
      return (r.tokens.length - 1) / r.decode_s;
    },
  );
  const ro = await oursDecode(engine, chatPrompt, 16);
  const rt = await twin.call<{ tokens: number[] }>("decode", { prompt: chatPrompt, n: 16 });
  decodeTokensChecked = JSON.stringify(ro.tokens) === JSON.stringify(rt.tokens);
  addRow("decode, batch 1", "tok/s", true, a, b, decodeTokensChecked ? "greedy tokens identical" : "greedy tokens DIFFER");
  extra.decode_tokens = { ours: ro.tokens, theirs: rt.tokens };
  const theirsPeak = await twin.call<{ peak_bytes: number }>("peak", { reset: true });
  addRow(
    `MLX peak memory, decode phase (${chatPrompt.length}-token prompt + ${O.decodeTokens} tokens)`,
    "bytes",
    false,
    [memory.peak()],
    [theirsPeak.peak_bytes],
    `weights: ${fmtBytes(oursWeights)} / ${fmtBytes(theirsLoad.active_bytes)} active after load`,
  );
  memory.resetPeak();
});

// 3. Prefill tok/s (time to first token of an n-token prompt, chunks of 2048).
await phase("prefill", async () => {
  for (const n of O.prefill) {
    const prompt = syntheticPrompt(n, n);
    const [a, b] = await interleave(
      `prefill ${n}`,
      O.prefillReps,
      async () => n / (await oursPrefill(engine, prompt)),
      async () => n / (await twin.call<{ seconds: number }>("prefill", { prompt })).seconds,
    );
    addRow(`prefill, ${n}-token prompt`, "tok/s", true, a, b);
  }
});

// 4. Peak memory of the prefill phase (weights + the largest prefill's caches and activations).
await phase("peak prefill", async () => {
  const ours = memory.peak();
  const theirs = await twin.call<{ peak_bytes: number }>("peak", { reset: false });
  addRow(`MLX peak memory, prefill phase (up to ${Math.max(...O.prefill)} tokens)`, "bytes", false, [ours], [theirs.peak_bytes]);
});

// 5. Host work: graph-building vs evaluation time per decode step (unpipelined), and FFI crossings.
await phase("host work", async () => {
  const n = Math.min(O.decodeTokens, 32);
  const [a, b] = await interleave(
    "decode step: host graph build vs eval",
    Math.min(O.reps, 3),
    async () => {
      const r = oursSteps(engine, chatPrompt, n);
      (extra.steps_ours ??= [] as unknown[]) && (extra.steps_ours as unknown[]).push(r);
      return r.build * 1000;
    },
    async () => {
      const r = await twin.call<{ build_s: number; eval_s: number }>("steps", { prompt: chatPrompt, n });
      (extra.steps_theirs ??= [] as unknown[]) && (extra.steps_theirs as unknown[]).push(r);
      return r.build_s * 1000;
    },
  );
  addRow("host graph-building time per decode step", "ms", false, a, b);
  const ea = (extra.steps_ours as { eval: number }[]).map((r) => r.eval * 1000);
  const eb = (extra.steps_theirs as { eval_s: number }[]).map((r) => r.eval_s * 1000);
  addRow("evaluation time per decode step (unpipelined)", "ms", false, ea, eb);
  progress("counting FFI crossings");
  const c = await countCrossings(engine, chatPrompt, 16);
  extra.ffi = c;
  note(
    `FFI crossings per decoded token (mlx-bun): ${c.crossings_per_token?.toFixed(0)} (op results ${c.arrays_made_per_token?.toFixed(0)}, core-table calls ${c.core_calls_per_token?.toFixed(0)})`,
  );
});

// 6. Roofline: bytes read per decoded token over the measured bandwidth, against the decode time.
await phase("roofline", async () => {
  const bwRow = rows.find((r) => r.figure.startsWith("memory bandwidth"))!;
  const bw = bwRow.ours!.median * 1e9;
  const bwT = bwRow.theirs!.median * 1e9;
  const ctx = chatPrompt.length + O.decodeTokens / 2;
  const b = bytesPerDecodedToken(engine, ctx);
  const dec = rows.find((r) => r.figure === "decode, batch 1")!;
  const floor = b.total / bw;
  extra.roofline = { ...b, context: ctx, bandwidth_bps: bw, floor_s: floor, ours_s: 1 / dec.ours!.median, theirs_s: 1 / dec.theirs!.median };
  addRow(
    `decode at the bandwidth roofline (${fmt(b.total)}B read per token: weights ${fmt(b.weights)}B + KV ${fmt(b.kv)}B; floor ${(floor * 1000).toFixed(2)} ms)`,
    "% of roofline",
    true,
    [(100 * floor) / (1 / dec.ours!.median)],
    [(100 * (b.total / bwT)) / (1 / dec.theirs!.median)],
  );
});

// 7. HTTP: TTFT, overhead against in-process generation, aggregate throughput under concurrency.
// Requests pass chat_template_kwargs {enable_thinking: false}, so both servers template the
// prompt as the in-process runs do (mlx_lm.server otherwise defaults thinking on).
let servers: Srv[] = [];
if (HTTP) {
  try {
    progress("starting mlx-bun serve and mlx_lm.server");
    servers = await startServers();
    const [ours, theirs] = servers as [Srv, Srv];
    for (const s of servers) await chat(s.url, "warm up", 4);
    const pt: Record<string, number> = {};
    // TTFT, cold: a fresh prompt each time (no prompt-cache hit on either side), 4 tokens.
    const [ta, tb] = await interleave(
      `HTTP TTFT, fresh ${O.ttftWords}-word prompt`,
      O.ttftReps,
      async (i) => {
        const r = await chat(ours.url, `Request ${i}: ${words(O.ttftWords, i)}`, 4);
        pt.ours = r.promptTokens;
        return r.ttft * 1000;
      },
      async (i) => {
        const r = await chat(theirs.url, `Request ${i}: ${words(O.ttftWords, i)}`, 4);
        pt.theirs = r.promptTokens;
        return r.ttft * 1000;
      },
    );
    addRow(`TTFT over HTTP, streamed chat, fresh prompt (${pt.ours}/${pt.theirs} prompt tokens)`, "ms", false, ta, tb);
    // TTFT, shared prefix: the same long document, a different last question each time (a
    // prompt cache can reuse the document's tokens).
    const doc = `Read this document and answer. ${words(O.ttftWords * 2, 99)}`;
    for (const s of servers) await chat(s.url, `${doc}\nQuestion 0?`, 2);
    const [pa, pb] = await interleave(
      `HTTP TTFT, shared ${O.ttftWords * 2}-word prefix`,
      O.ttftReps,
      async (i) => {
        const r = await chat(ours.url, `${doc}\nQuestion ${i + 1}?`, 4);
        pt.oursPrefix = r.promptTokens;
        return r.ttft * 1000;
      },
      async (i) => {
        const r = await chat(theirs.url, `${doc}\nQuestion ${i + 1}?`, 4);
        pt.theirsPrefix = r.promptTokens;
        return r.ttft * 1000;
      },
    );
    addRow(`TTFT over HTTP, same document + new question (${pt.oursPrefix}/${pt.theirsPrefix} prompt tokens)`, "ms", false, pa, pb);
    // HTTP overhead: decode tok/s seen by a streaming client against in-process decode of the
    // same prompt, the four runs interleaved in every repetition.
    const inA: number[] = [];
    const inB: number[] = [];
    const ha: number[] = [];
    const hb: number[] = [];
    const hr = (r: ChatResult) => (r.completionTokens - 1) / ((r.tLast - r.tFirst) / 1000);
    for (let r = 0; r < O.reps; r++) {
      progress(`HTTP vs in-process decode (${O.decodeTokens} tokens)`, `rep ${r + 1}/${O.reps}`);
      const steps: (() => Promise<void>)[] = [
        async () => {
          const x = await oursDecode(engine, chatPrompt, O.decodeTokens);
          inA.push((x.tokens.length - 1) / x.decode);
        },
        async () => void ha.push(hr(await chat(ours.url, chatText, O.decodeTokens))),
        async () => {
          const x = await twin.call<{ decode_s: number; tokens: number[] }>("decode", { prompt: chatPrompt, n: O.decodeTokens });
          inB.push((x.tokens.length - 1) / x.decode_s);
        },
        async () => void hb.push(hr(await chat(theirs.url, chatText, O.decodeTokens))),
      ];
      for (const f of r % 2 ? steps.reverse() : steps) await f();
    }
    addRow("decode over HTTP (streamed, client-side)", "tok/s", true, ha, hb);
    addRow("decode in process, interleaved with the HTTP runs", "tok/s", true, inA, inB);
    const ov = (inp: number[], http: number[]) => inp.map((x, i) => (100 * (x - http[i]!)) / x);
    addRow("HTTP overhead on decode (1 − HTTP / in-process tok/s, per repetition)", "%", false, ov(inA, ha), ov(inB, hb));
    // Aggregate throughput at C concurrent streams (short distinct prompts, greedy).
    for (const C of O.streams) {
      const run = async (s: Srv, r: number) => {
        const t0 = performance.now();
        const rs = await Promise.all(Array.from({ length: C }, (_, i) => chat(s.url, `Stream ${i} of ${C}, run ${r}: ${words(8, i + r)}`, O.streamTokens)));
        const dt = (performance.now() - t0) / 1000;
        return rs.reduce((a, r) => a + r.completionTokens, 0) / dt;
      };
      // One untimed round each first: a new batch size compiles new kernels (CUDA JIT; the PTX cache
      // is shared, so the side that ran first would pay for both).
      await run(ours, -1);
      await run(theirs, -1);
      const [ca, cb] = await interleave(
        `HTTP ${C} concurrent streams × ${O.streamTokens} tokens`,
        O.streamReps,
        (r) => run(ours, r),
        (r) => run(theirs, r),
      );
      addRow(`aggregate tok/s over HTTP, ${C} concurrent stream${C > 1 ? "s" : ""} × ${O.streamTokens} tokens`, "tok/s", true, ca, cb);
    }
    extra.http_prompt_tokens = pt;
    try {
      const h = (await (await fetch(`${ours.url}/health`)).json()) as { memory?: { peak_bytes?: number } };
      if (h.memory?.peak_bytes) extra.serve_peak_bytes = h.memory.peak_bytes;
    } catch {}
  } catch (e) {
    note(`HTTP phase failed: ${(e as Error).message}`);
    for (const [n, l] of serverLogs) note(`${n} stderr tail:\n${l}`);
    extra.http_error = String((e as Error).message);
  } finally {
    for (const s of servers) s.proc.kill("SIGTERM");
    await Promise.all(servers.map((s) => Promise.race([s.proc.exited, Bun.sleep(5000)])));
    for (const s of servers) if (s.proc.exitCode === null) s.proc.kill("SIGKILL");
  }
}

// 8. mlx-bun's Scheduler in process (no HTTP), for reference against the HTTP figures.
await phase("scheduler", async () => {
  const sched = new Scheduler(engine, { maxBatch: 16 });
  for (const C of O.streams) {
    const xs: number[] = [];
    // r = -1: an untimed round (a new batch size compiles new kernels on CUDA).
    for (let r = -1; r < O.streamReps; r++) {
      progress(`Scheduler in process, ${C} streams`, r < 0 ? "warm-up" : `rep ${r + 1}/${O.streamReps}`);
      const t0 = performance.now();
      const res = await Promise.all(
        Array.from(
          { length: C },
          (_, i) =>
            sched.submit({
              promptIds: template!.apply(tokenizer, [{ role: "user", content: `Stream ${i} of ${C}, run ${r}: ${words(8, i + r)}` }], {
                addGenerationPrompt: true,
              }),
              maxTokens: O.streamTokens,
            }).result,
        ),
      );
      if (r >= 0) xs.push(res.reduce((a, x) => a + x.tokens.length, 0) / ((performance.now() - t0) / 1000));
    }
    addRow(`aggregate tok/s in process (mlx-bun Scheduler), ${C} stream${C > 1 ? "s" : ""}`, "tok/s", true, xs, null);
  }
  await sched.close();
});

// 9. KV bytes per token for each --kv mode (last: on CUDA each mode JIT-compiles its kernels). A
// quantized mode leaves the sliding layers bf16 (the engine's default, as --kv does).
await phase("kv", async () => {
  progress("KV bytes per token");
  const prompt = syntheticPrompt(O.kvTokens, 7);
  const theirs = await twin.call<Record<string, { bytes?: number; tokens?: number; error?: string }>>("kv", { n: O.kvTokens, prompt });
  const kv: Record<string, unknown> = {};
  for (const mode of O.kvModes) {
    const e = new Engine(engine.loaded, { kv: mode });
    const caches = e.makeCaches();
    try {
      e.prefill(prompt, caches, 0);
      const held = caches.reduce((s, c) => s + c.nbytes, 0);
      const per = caches.reduce((s, c) => s + c.bytesPerToken(), 0);
      const t = theirs[mode];
      kv[mode] = { ours_bytes_per_token: per, ours_held_bytes: held, theirs_held_bytes: t?.bytes ?? null, theirs_error: t?.error ?? null };
      addRow(
        `KV bytes held after ${O.kvTokens} tokens, --kv ${mode}`,
        "bytes",
        false,
        [held],
        t?.bytes !== undefined ? [t.bytes] : null,
        `${per} B/token over the ${caches.length} owning caches (codec)${t?.error ? `; mlx-lm: ${t.error.split(":")[0]} (${t.error.includes("NYI") ? "RotatingKVCache quantization not implemented" : t.error})` : t ? "" : "; mlx-lm has no such mode"}`,
      );
    } finally {
      for (const c of caches) c.dispose();
      memory.clearCache();
    }
  }
  extra.kv = kv;
});

await phase("final peak", async () => {
  const ours = memory.peak();
  const theirs = await twin.call<{ peak_bytes: number }>("peak", { reset: false });
  addRow(
    "MLX peak memory from the prefill phase to the end (prefill, KV modes, Scheduler)",
    "bytes",
    false,
    [ours],
    [theirs.peak_bytes],
    extra.serve_peak_bytes ? `mlx-bun serve: ${fmtBytes(extra.serve_peak_bytes as number)} (mlx_lm.server reports none)` : undefined,
  );
});
await twin.close();
if (TTY) process.stderr.write("\n");

// ------------------------------------------------------------------------------------------
// Report
// ------------------------------------------------------------------------------------------
writeJson(true);
note(`JSON: ${jsonPath}`);
const mdText = renderMarkdown(JSON.parse(readFileSync(jsonPath, "utf8")) as Report);
console.log(`\n${mdText}`);
if (O.md) writeMarkdown(O.md, mdText);
engine.dispose();
process.exit(0);

interface Report {
  date: string;
  command: string;
  machine: string;
  model: string;
  options: typeof O;
  rows: Row[];
  extra: Record<string, unknown>;
  elapsed_s: number;
  complete: boolean;
  model_config: Record<string, unknown>;
}

function renderMarkdown(d: Report): string {
  const tc = d.model_config;
  const s3 = (s: Stat | null, unit: string) => {
    if (!s) return "—";
    const f = unit === "bytes" ? fmtBytes : fmt;
    return s.n > 1 ? `${f(s.min)} / ${f(s.median)} / ${f(s.max)}` : f(s.median);
  };
  const ratio = (r: Row) => (r.ours && r.theirs ? (r.ours.median / r.theirs.median).toFixed(2) : "—");
  const md: string[] = [];
  md.push(`### ${d.options.label}: ${d.model.split("/").at(-1)} (${d.date.slice(0, 10)})`, "");
  md.push(`\`${d.command}\``, "");
  md.push(
    `${d.date}, ${d.machine}; model \`${d.model.replace(/^.*?(\.native\/)/, "$1")}\` (hidden ${tc.hidden_size}, ${tc.num_hidden_layers} layers, ${tc.num_kv_shared_layers} KV-shared, vocab ${tc.vocab_size}, ${tc.dtype}, 4-bit); ${d.elapsed_s.toFixed(0)} s${d.complete ? "" : " (cut short: the figures measured before the end)"}. Repetitions interleaved; min / median / max; ratio = mlx-bun median / mlx-lm median.`,
    "",
  );
  md.push("| figure | unit | mlx-bun | mlx-lm | ratio | note |", "| --- | --- | --- | --- | --- | --- |");
  for (const r of d.rows) md.push(`| ${r.figure} | ${r.unit} | ${s3(r.ours, r.unit)} | ${s3(r.theirs, r.unit)} | ${ratio(r)} | ${r.note ?? ""} |`);
  const ffi = d.extra.ffi as Record<string, number> | undefined;
  if (ffi)
    md.push(
      "",
      `FFI crossings per decoded token (mlx-bun): ${ffi.crossings_per_token?.toFixed(0)} (${ffi.arrays_made_per_token?.toFixed(0)} op results, ${ffi.core_calls_per_token?.toFixed(0)} core-table calls: ${Object.entries(
        ffi,
      )
        .filter(([k]) => k.startsWith("mlxb_"))
        .map(([k, v]) => `${k.slice(5)} ${v}`)
        .join(", ")}).`,
    );
  const rf = d.extra.roofline as { weights: number; kv: number; table: number; floor_s: number; ours_s: number; theirs_s: number } | undefined;
  if (rf)
    md.push(
      "",
      `Roofline: ${fmtBytes(rf.weights)} of weights (per-layer embedding table ${fmtBytes(rf.table)} not read: one row per token) + ${fmtBytes(rf.kv)} KV per decoded token at the measured bandwidth = ${(rf.floor_s * 1000).toFixed(3)} ms; measured ${(rf.ours_s * 1000).toFixed(3)} ms (mlx-bun), ${(rf.theirs_s * 1000).toFixed(3)} ms (mlx-lm).`,
    );
  const fl = d.extra.failures as Record<string, string> | undefined;
  if (fl)
    md.push(
      "",
      `Failed phases: ${Object.entries(fl)
        .map(([k, v]) => `${k} (${v.split("\n")[0]})`)
        .join("; ")}.`,
    );
  md.push("");
  return md.join("\n");
}

/** Put the table inside the section (before the next "## "), or start the section at the end. */
function writeMarkdown(path: string, mdText: string): void {
  const doc = existsSync(path) ? readFileSync(path, "utf8") : "# Benchmarks\n";
  const heading = `## ${O.section}`;
  const at = doc.indexOf(heading);
  if (at < 0) appendFileSync(path, `${doc.endsWith("\n") ? "" : "\n"}\n${heading}\n\n${mdText}`);
  else {
    const next = doc.indexOf("\n## ", at + heading.length);
    const cut = next < 0 ? doc.length : next + 1;
    const head = doc.slice(0, cut).replace(/\n*$/, "\n\n");
    writeFileSync(path, `${head}${mdText}${next < 0 ? "" : `\n${doc.slice(cut)}`}`);
  }
  note(`table written to ${path}`);
}
