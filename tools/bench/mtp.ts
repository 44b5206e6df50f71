// Speculative decoding with a Gemma 4 MTP drafter vs plain decoding, in one run (issue 21): per
// repetition the runs are interleaved (plain, random drafter, echo drafter; order rotated). Greedy,
// so every run must emit the plain tokens (checked). Figures are min / median / max over the
// repetitions: decode tok/s, its ratio to plain (same repetition), tokens per target step
// (generated tokens / verify passes), acceptance, and the round cost per drafted token:
// (decode time − target steps × plain time per token) / drafted tokens — what each drafted token
// costs beyond the target steps (drafter steps plus the extra verify rows), so the speed-up at
// another acceptance rate can be read off. Random weights: acceptance means little; the "echo"
// drafter (its drafts are the target's own previous prediction; tools/make-tiny-model/
// make_tiny_drafter.py --echo) accepts when the target repeats.
//
//   .native/bin/bun tools/bench/mtp.ts [--target DIR] [--reps N] [--decode-tokens N] [--prompt-tokens N] [--k 3]
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { loadAssistant } from "@mlx-bun/models";
import { Engine, SpeculativeDecoder } from "@mlx-bun/runtime";
import { runPython } from "../oracle/oracle.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const argv = process.argv.slice(2);
const val = (f: string): string | undefined => {
  const i = argv.indexOf(`--${f}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const target = resolve(val("target") ?? join(ROOT, ".native", "bench-models", "gemma4-mini-4bit"));
const reps = Number(val("reps") ?? 5);
const decodeTokens = Number(val("decode-tokens") ?? 64);
const promptTokens = Number(val("prompt-tokens") ?? 64);
const k = Number(val("k") ?? 3);
const drafters = { random: `${target}-mtp`, echo: `${target}-mtp-echo` };
const maker = join(ROOT, "tools", "make-tiny-model", "make_tiny_drafter.py");
if (!existsSync(drafters.random)) runPython([maker, "--target", target, "--out", drafters.random, "--hidden", "128", "--heads", "4", "--layers", "4"]);
if (!existsSync(drafters.echo)) runPython([maker, "--target", target, "--out", drafters.echo, "--echo", "--layers", "4", "--heads", "4"]);

using engine = Engine.load(target);
using aRandom = loadAssistant(drafters.random);
using aEcho = loadAssistant(drafters.echo);
const prompt = Array.from({ length: promptTokens }, (_, i) => 10 + ((i * 97) % 480));
const req = { promptIds: prompt, maxTokens: decodeTokens };
type Run = { name: string; go: () => Promise<{ tokens: number[]; decodeS: number; steps: number; drafted: number; accepted: number }> };
const spec = (name: string, a: typeof aEcho): Run => {
  let steps = 0;
  const sd = new SpeculativeDecoder(engine, a, { numDraftTokens: k, onRound: () => steps++ });
  return {
    name,
    go: async () => {
      steps = 0;
      const r = await sd.generate(req).result;
      return { tokens: r.tokens, decodeS: r.decodeSeconds, steps, drafted: r.speculative!.drafted, accepted: r.speculative!.accepted };
    },
  };
};
const runs: Run[] = [
  {
    name: "plain",
    go: async () => {
      const r = await engine.generate(req).result;
      return { tokens: r.tokens, decodeS: r.decodeSeconds, steps: r.tokens.length, drafted: 0, accepted: 0 };
    },
  },
  spec("mtp random", aRandom),
  spec("mtp echo", aEcho),
];
for (const r of runs) await r.go(); // warm-up
const res = new Map<string, { tps: number[]; ratio: number[]; perStep: number[]; acc: number[]; cost: number[] }>();
for (let rep = 0; rep < reps; rep++) {
  const order = runs.map((_, i) => runs[(i + rep) % runs.length]!);
  const out = new Map<string, Awaited<ReturnType<Run["go"]>>>();
  for (const r of order) out.set(r.name, await r.go());
  const plain = out.get("plain")!;
  for (const [name, o] of out) {
    if (o.tokens.join() !== plain.tokens.join()) throw new Error(`${name}: tokens differ from plain greedy`);
    const e = res.get(name) ?? { tps: [], ratio: [], perStep: [], acc: [], cost: [] };
    const n = o.tokens.length - 1;
    e.tps.push(n / o.decodeS);
    e.ratio.push(n / o.decodeS / ((plain.tokens.length - 1) / plain.decodeS));
    e.perStep.push(o.tokens.length / o.steps);
    if (o.drafted) {
      e.acc.push(o.accepted / o.drafted);
      const perTok = plain.decodeS / (plain.tokens.length - 1);
      e.cost.push(((o.decodeS - (o.steps - 1) * perTok) / o.drafted) * 1000);
    }
    res.set(name, e);
  }
}
const mmm = (a: number[], d = 2): string => {
  if (!a.length) return "–";
  const s = [...a].sort((x, y) => x - y);
  return `${s[0]!.toFixed(d)} / ${s[Math.floor(s.length / 2)]!.toFixed(d)} / ${s[s.length - 1]!.toFixed(d)}`;
};
console.log(`target ${target}, k ${k}, prompt ${promptTokens}, decode ${decodeTokens}, reps ${reps} (min / median / max)`);
console.log("| run | decode tok/s | vs plain | tokens per target step | acceptance | round cost per drafted token (ms) |");
console.log("| --- | --- | --- | --- | --- | --- |");
for (const [name, e] of res) console.log(`| ${name} | ${mmm(e.tps, 1)} | ${mmm(e.ratio)} | ${mmm(e.perStep)} | ${mmm(e.acc)} | ${mmm(e.cost)} |`);
