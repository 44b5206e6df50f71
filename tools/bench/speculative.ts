// Speculative decoding, mlx-bun vs mlx-lm on the same target/draft pair, in one run: decode tok/s
// without and with speculation on both sides (mlx-lm's speculative_generate_step through the
// Python twin, tools/bench/mlx_lm_bench.py --serve), the speed-up of each, and the acceptance
// rate. The four runs of a repetition are interleaved, their order rotated every repetition;
// each figure is min / median / max, ratio = mlx-bun median / mlx-lm median. Greedy throughout,
// so all four runs must emit the same tokens (checked).
//
//   .native/bin/bun tools/bench/speculative.ts [--target DIR] [--draft DIR] [--draft-layers 5]
//        [--num-draft-tokens 3[,2,4]] [--reps N] [--decode-tokens N] [--prompt-tokens N]
//        [--label CPU] [--json FILE] [--md docs/benchmarks.md | --no-md] [--python PY]
//
// Default pair: the bench mini model (bash tools/bench/make-bench-model.sh mini) as the target
// and, as the draft, its first --draft-layers layers (tools/bench/make_draft_model.py; made next
// to the target when missing). On the device machine: --target .native/bench-models/gemma4-1b-4bit.
import { Twin } from "./twin.ts";
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { defaultDevice, mlxVersion } from "@mlx-bun/mlx-ffi";
import { Engine, type GenerationStream, SpeculativeDecoder } from "@mlx-bun/runtime";
import { spread, type Spread } from "./stats.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const argv = process.argv.slice(2);
const val = (f: string): string | undefined => {
  const i = argv.indexOf(`--${f}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const num = (f: string, d: number): number => {
  const v = val(f);
  if (v === undefined) return d;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new Error(`speculative bench: --${f} must be a positive integer, got ${v}`);
  return n;
};
const device = (() => {
  try {
    return defaultDevice() === "gpu" ? "GPU" : "CPU";
  } catch {
    return "CPU";
  }
})();
const target = resolve(val("target") ?? join(ROOT, ".native", "bench-models", device === "GPU" ? "gemma4-1b-4bit" : "gemma4-mini-4bit"));
const draftLayers = num("draft-layers", 5);
const O = {
  target,
  draft: resolve(val("draft") ?? `${target}-draft${draftLayers}`),
  ks: (val("num-draft-tokens") ?? "3").split(",").map((s) => {
    const k = Number(s);
    if (!Number.isInteger(k) || k < 1) throw new Error(`speculative bench: --num-draft-tokens takes positive integers, got ${s}`);
    return k;
  }),
  reps: num("reps", 5),
  decodeTokens: num("decode-tokens", 128),
  promptTokens: num("prompt-tokens", 64),
  label: val("label") ?? device,
  python: val("python") ?? process.env.MLX_BUN_PYTHON ?? join(ROOT, ".native", "venv", "bin", "python"),
  md: argv.includes("--no-md") ? null : resolve(val("md") ?? join(ROOT, "docs", "benchmarks.md")),
};
const SECTION = "Speculative decoding: mlx-bun vs mlx-lm (issue 10)";
const jsonPath = resolve(val("json") ?? join(ROOT, "docs", "bench-results", `speculative-${O.label.toLowerCase().replace(/[^a-z0-9]+/g, "-")}.json`));

if (!existsSync(join(O.target, "config.json"))) {
  console.error(`speculative bench: no target model at ${O.target}; make one with bash tools/bench/make-bench-model.sh mini`);
  process.exit(2);
}
if (!existsSync(join(O.draft, "config.json"))) {
  if (val("draft")) {
    console.error(`speculative bench: no draft model at ${O.draft}`);
    process.exit(2);
  }
  const p = Bun.spawnSync(
    [O.python, join(ROOT, "tools", "bench", "make_draft_model.py"), "--target", O.target, "--layers", String(draftLayers), "--out", O.draft],
    { stderr: "inherit" },
  );
  if (p.exitCode !== 0) process.exit(2);
}

// ---- progress and stats ------------------------------------------------------------------
const T0 = performance.now();
const clock = () => {
  const s = Math.round((performance.now() - T0) / 1000);
  return `${String(Math.floor(s / 60)).padStart(2, "0")}:${String(s % 60).padStart(2, "0")}`;
};
const TTY = process.stderr.isTTY;
function progress(s: string): void {
  process.stderr.write(TTY ? `\r\x1b[2K[speculative ${clock()}] ${s}` : `[speculative ${clock()}] ${s}\n`);
}
function note(s: string): void {
  process.stderr.write(`${TTY ? "\r\x1b[2K" : ""}[speculative ${clock()}] ${s}\n`);
}
type Stat = Spread;
const stat = (xs: number[]): Stat | null => (xs.length ? spread(xs) : null);

// ---- one measured run ----------------------------------------------------------------------
interface Run {
  tokens: number[];
  /** (tokens - 1) / seconds from the first token to the last. */
  decodeTps: number;
  /** tokens / seconds from the request to the last token (prefill included). */
  e2eTps: number;
  /** Emitted tokens that were drafted and kept. */
  fromDraft: number;
  drafted?: number;
}
async function ours(gen: { generate(r: { promptIds: number[]; maxTokens: number }): GenerationStream }, prompt: number[], n: number): Promise<Run> {
  const t0 = performance.now();
  const s = gen.generate({ promptIds: prompt, maxTokens: n });
  let tFirst = 0;
  const tokens: number[] = [];
  for await (const ev of s) {
    if (!tFirst) tFirst = performance.now();
    tokens.push(ev.token);
  }
  const tEnd = performance.now();
  const r = await s.result;
  return {
    tokens,
    decodeTps: (tokens.length - 1) / ((tEnd - tFirst) / 1000),
    e2eTps: tokens.length / ((tEnd - t0) / 1000),
    fromDraft: r.speculative?.accepted ?? 0,
    ...(r.speculative ? { drafted: r.speculative.drafted } : {}),
  };
}
async function theirs(twin: Twin, prompt: number[], n: number, k: number): Promise<Run> {
  const r = await twin.call<{ ttft_s: number; decode_s: number; tokens: number[]; from_draft?: boolean[] }>(
    k ? "spec_decode" : "decode",
    k ? { prompt, n, k } : { prompt, n },
  );
  return {
    tokens: r.tokens,
    decodeTps: (r.tokens.length - 1) / r.decode_s,
    e2eTps: r.tokens.length / (r.ttft_s + r.decode_s),
    fromDraft: r.from_draft?.filter(Boolean).length ?? 0,
  };
}

// ---- the run -------------------------------------------------------------------------------
// The same prompt ids on both sides: text tokens of the bench tokenizer (make_bench_model.py).
const prompt = [2];
for (let i = 1, x = 12345; i < O.promptTokens; i++) {
  x = (Math.imul(x, 1103515245) + 12345) >>> 0;
  prompt.push(280 + (x % 232));
}
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? "?"}), ${(totalmem() / 2 ** 30).toFixed(0)} GiB, MLX ${mlxVersion()} ${device} backend`;
const command = `.native/bin/bun tools/bench/speculative.ts ${argv.map((a) => (/[\s(),;&|]/.test(a) ? JSON.stringify(a) : a)).join(" ")}`.trim();

const twin = new Twin(O.python, ROOT);
await twin.line();
using tEngine = Engine.load(O.target, { kv: "bf16" });
using dEngine = Engine.load(O.draft, { kv: "bf16" });
await twin.call("load", { model: O.target });
await twin.call("load_draft", { model: O.draft });
note(`target ${O.target}, draft ${O.draft} (${draftLayersOf(O.draft)} layers); ${machine}`);

type Side = "ours" | "theirs";
type Key = `${Side}:${number}`; // k = 0: plain decoding
const runs = new Map<Key, Run[]>();
const configs: Array<[Side, number]> = [];
for (const k of [0, ...O.ks]) for (const side of ["ours", "theirs"] as const) configs.push([side, k]);
const decoders = new Map(O.ks.map((k) => [k, new SpeculativeDecoder(tEngine, dEngine, { numDraftTokens: k })]));
const once = (side: Side, k: number, n: number): Promise<Run> =>
  side === "theirs" ? theirs(twin, prompt, n, k) : ours(k ? decoders.get(k)! : tEngine, prompt, n);

// Warm-up: every configuration once, a few tokens.
for (const [side, k] of configs) await once(side, k, 8);
for (let r = 0; r < O.reps; r++) {
  for (let i = 0; i < configs.length; i++) {
    const [side, k] = configs[(i + r) % configs.length]!;
    progress(`rep ${r + 1}/${O.reps}: ${side === "ours" ? "mlx-bun" : "mlx-lm"} ${k ? `speculative k=${k}` : "plain"}`);
    const key: Key = `${side}:${k}`;
    runs.set(key, [...(runs.get(key) ?? []), await once(side, k, O.decodeTokens)]);
  }
}
await twin.close();
if (TTY) process.stderr.write("\n");

// ---- figures -------------------------------------------------------------------------------
const plainTokens = runs.get("ours:0")![0]!.tokens;
const same = [...runs.values()].every((rs) => rs.every((x) => JSON.stringify(x.tokens) === JSON.stringify(plainTokens)));
interface Row {
  figure: string;
  unit: string;
  ours: Stat | null;
  theirs: Stat | null;
}
const rows: Row[] = [];
const get = (side: Side, k: number) => runs.get(`${side}:${k}`)!;
const add = (figure: string, unit: string, f: (side: Side) => number[]) => rows.push({ figure, unit, ours: stat(f("ours")), theirs: stat(f("theirs")) });
add("decode, plain", "tok/s", (s) => get(s, 0).map((x) => x.decodeTps));
for (const k of O.ks) {
  add(`decode, speculative k=${k}`, "tok/s", (s) => get(s, k).map((x) => x.decodeTps));
  // Per repetition: speculative over plain of the same repetition (adjacent in time).
  add(`speed-up, speculative k=${k} / plain`, "×", (s) => get(s, k).map((x, i) => x.decodeTps / get(s, 0)[i]!.decodeTps));
  add(`end to end (prompt + ${O.decodeTokens} tokens), speculative k=${k} / plain`, "×", (s) => get(s, k).map((x, i) => x.e2eTps / get(s, 0)[i]!.e2eTps));
  add(`emitted tokens taken from the draft, k=${k}`, "%", (s) => get(s, k).map((x) => (100 * x.fromDraft) / x.tokens.length));
  rows.push({
    figure: `acceptance rate (accepted / drafted), k=${k}`,
    unit: "%",
    ours: stat(get("ours", k).map((x) => (100 * x.fromDraft) / x.drafted!)),
    theirs: null,
  });
}
const report = {
  date: new Date().toISOString(),
  machine,
  command,
  options: O,
  prompt_tokens: prompt.length,
  greedy_tokens_identical: same,
  rows,
  elapsed_s: (performance.now() - T0) / 1000,
};
mkdirSync(dirname(jsonPath), { recursive: true });
writeFileSync(`${jsonPath}.tmp`, `${JSON.stringify(report, null, 2)}\n`);
renameSync(`${jsonPath}.tmp`, jsonPath);

const fmt = (x: number) => (Math.abs(x) >= 100 ? x.toFixed(1) : Math.abs(x) >= 1 ? x.toFixed(2) : x.toPrecision(3));
const s3 = (s: Stat | null) => (s ? `${fmt(s.median)} (${fmt(s.min)}–${fmt(s.max)})` : "—");
const lines = [
  `\`${command}\` (${report.date.slice(0, 10)}; ${machine}; target ${O.target.split("/").pop()}, draft ${O.draft.split("/").pop()}; ${prompt.length}-token prompt, ${O.decodeTokens} tokens, ${O.reps} interleaved repetitions; greedy tokens of all runs ${same ? "identical" : "DIFFER"}; JSON: ${relative(ROOT, jsonPath)})`,
  "",
  "| figure | mlx-bun median (min–max) | mlx-lm median (min–max) | mlx-bun / mlx-lm |",
  "| --- | --- | --- | --- |",
  ...rows.map(
    (r) =>
      `| ${r.figure} | ${s3(r.ours)} ${r.unit} | ${s3(r.theirs)}${r.theirs ? ` ${r.unit}` : ""} | ${r.ours && r.theirs ? `×${(r.ours.median / r.theirs.median).toFixed(2)}` : "—"} |`,
  ),
  "",
];
const md = lines.join("\n");
console.log(md);
if (O.md) {
  // Each label's run replaces its own block (marked by the label) in the section, others stay.
  const doc = existsSync(O.md) ? readFileSync(O.md, "utf8") : "# Benchmarks\n";
  const heading = `## ${SECTION}`;
  const begin = `<!-- speculative.ts: ${O.label} -->`;
  const end = `<!-- /speculative.ts: ${O.label} -->`;
  const block = `${begin}\n${md}${end}\n`;
  let out: string;
  if (doc.includes(begin) && doc.includes(end)) out = doc.slice(0, doc.indexOf(begin)) + block + doc.slice(doc.indexOf(end) + end.length + 1);
  else if (doc.includes(heading)) {
    const at = doc.indexOf(heading) + heading.length;
    const next = doc.indexOf("\n## ", at);
    const cut = next < 0 ? doc.length : next + 1;
    out = `${doc.slice(0, cut).replace(/\n*$/, "\n\n")}${block}${next < 0 ? "" : `\n${doc.slice(cut)}`}`;
  } else out = `${doc.replace(/\n*$/, "\n")}\n${heading}\n\n${block}`;
  writeFileSync(`${O.md}.tmp`, out);
  renameSync(`${O.md}.tmp`, O.md);
  note(`table written to ${O.md}`);
}

function draftLayersOf(dir: string): number | string {
  const c = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as { num_hidden_layers?: number; text_config?: { num_hidden_layers?: number } };
  return c.text_config?.num_hidden_layers ?? c.num_hidden_layers ?? "?";
}
