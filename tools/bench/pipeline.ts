// The decode pipeline against another checkout of mlx-bun (e.g. the commit before a change), in
// one run: each repetition starts one process per side (order alternating A B, B A, ...) that
// loads the model and measures in-process decode through Engine.generate and through a Scheduler
// with 1, 4 and 16 concurrent requests. Reports min / median / max per side and the ratio of the
// medians (this checkout / the other).
//
//   .native/bin/bun tools/bench/pipeline.ts --other /tmp/old-checkout [--model DIR] [--reps 5]
//        [--tokens 128] [--streams 1,4,16] [--stream-tokens 64]
//   .native/bin/bun tools/bench/pipeline.ts --once [...]     # one side's measurement, JSON on stdout
//
// The other checkout must be set up (its own node_modules and native library) and hold this
// script at the same path (copy it there).
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Engine, type GenerationStream, Scheduler } from "@mlx-bun/runtime";
import { spread } from "./stats.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const argv = process.argv.slice(2);
const val = (f: string): string | undefined => {
  const i = argv.indexOf(`--${f}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const num = (f: string, d: number): number => (val(f) !== undefined ? Number(val(f)) : d);
const O = {
  model: resolve(val("model") ?? join(ROOT, ".native", "bench-models", "gemma4-mini-4bit")),
  reps: num("reps", 5),
  tokens: num("tokens", 128),
  streams: (val("streams") ?? "1,4,16").split(",").map(Number),
  streamTokens: num("stream-tokens", 64),
};

type Figures = Record<string, number>;

let vocab = 512;
function prompt(i: number, n = 24): number[] {
  return Array.from({ length: n }, (_, j) => 10 + ((i * 131 + j * 53) % (vocab - 10)));
}

/** Decode tok/s of one stream: tokens after the first over the time after the first. */
async function decodeRate(s: GenerationStream): Promise<number> {
  let tFirst = 0;
  let n = 0;
  for await (const _ of s) {
    if (!tFirst) tFirst = performance.now();
    n++;
  }
  const t = performance.now();
  await s.result;
  return (n - 1) / ((t - tFirst) / 1000);
}

async function once(): Promise<Figures> {
  const engine = Engine.load(O.model);
  vocab = engine.loaded.tokenizer.vocabSize;
  const out: Figures = {};
  const sched = new Scheduler(engine, { maxBatch: 16 });
  // Warm up both paths (first calls compile and allocate).
  await decodeRate(engine.generate({ promptIds: prompt(99), maxTokens: 16 }));
  await decodeRate(sched.submit({ promptIds: prompt(98), maxTokens: 16 }));
  out["Engine.generate decode tok/s"] = await decodeRate(engine.generate({ promptIds: prompt(1), maxTokens: O.tokens }));
  for (const C of O.streams) {
    const t0 = performance.now();
    const rs = await Promise.all(
      Array.from({ length: C }, async (_, i) => {
        const s = sched.submit({ promptIds: prompt(10 + i), maxTokens: C === 1 ? O.tokens : O.streamTokens });
        if (C === 1) return { rate: await decodeRate(s), n: O.tokens };
        for await (const _ of s) {
        }
        return { rate: 0, n: (await s.result).tokens.length };
      }),
    );
    const dt = (performance.now() - t0) / 1000;
    if (C === 1) out["Scheduler, 1 request, decode tok/s"] = rs[0]!.rate;
    else out[`Scheduler, ${C} concurrent, aggregate tok/s`] = rs.reduce((a, r) => a + r.n, 0) / dt;
  }
  await sched.close();
  engine.dispose();
  return out;
}

async function side(root: string): Promise<Figures> {
  const args = [
    "tools/bench/pipeline.ts",
    "--once",
    "--model",
    O.model,
    "--tokens",
    String(O.tokens),
    "--streams",
    O.streams.join(","),
    "--stream-tokens",
    String(O.streamTokens),
  ];
  const p = Bun.spawn([process.execPath, ...args], { cwd: root, stdout: "pipe", stderr: "inherit" });
  const text = await new Response(p.stdout).text();
  if ((await p.exited) !== 0) throw new Error(`pipeline bench in ${root} failed`);
  return JSON.parse(text.trim().split("\n").at(-1)!) as Figures;
}

if (argv.includes("--once")) {
  console.log(JSON.stringify(await once()));
} else {
  const other = val("other");
  if (!other || !existsSync(join(other, "tools", "bench", "pipeline.ts"))) {
    console.error("pipeline bench: --other DIR must be a set-up checkout holding tools/bench/pipeline.ts");
    process.exit(2);
  }
  const a: Figures[] = [];
  const b: Figures[] = [];
  for (let r = 0; r < O.reps; r++) {
    console.error(`[pipeline] repetition ${r + 1}/${O.reps}`);
    if (r % 2 === 0) {
      a.push(await side(ROOT));
      b.push(await side(resolve(other)));
    } else {
      b.push(await side(resolve(other)));
      a.push(await side(ROOT));
    }
  }
  const f = (x: number) => x.toFixed(1);
  console.log(`model ${O.model}, ${O.reps} repetitions (min / median / max)\n`);
  console.log("| figure | this checkout | other | ratio (medians) |\n| --- | --- | --- | --- |");
  for (const k of Object.keys(a[0]!)) {
    const sa = spread(a.map((x) => x[k]!));
    const sb = spread(b.map((x) => x[k]!));
    console.log(
      `| ${k} | ${f(sa.min)} / ${f(sa.median)} / ${f(sa.max)} | ${f(sb.min)} / ${f(sb.median)} / ${f(sb.max)} | ${(sa.median / sb.median).toFixed(3)} |`,
    );
  }
}
