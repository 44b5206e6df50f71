// Prompt reuse across chat turns, mlx-bun serve next to mlx_lm.server on the same checkpoint: a
// three-turn chat (each turn's history carries the side's own previous answers, as a client's
// would) and a repeated prompt; usage.prompt_tokens_details.cached_tokens per request.
//
//   .native/bin/bun tools/bench/multi-turn-cache.ts [--model DIR] [--words N] [--max-tokens N]
//
// Without --model it makes the tiny checkpoint (8-token window) and one with Gemma 4's real
// windows (sliding 512, a history of over 2k tokens) and reports both.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { oraclePython, runPython } from "../oracle/oracle.ts";
import { freePort } from "../oracle/ports.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const CLI = join(ROOT, "apps", "mlx-bun", "src", "cli.ts");

export interface TurnFigures {
  label: string;
  promptTokens: number;
  cachedTokens: number;
}

interface Server {
  url: string;
  stop(): Promise<void>;
}

/** Start `mlx-bun serve` or `mlx_lm.server` on `model`, ready to answer. */
export async function startServer(side: "mlx-bun" | "mlx_lm", model: string): Promise<Server> {
  const port = await freePort();
  const cmd =
    side === "mlx-bun"
      ? [process.execPath, CLI, "serve", "--model", model, "--host", "127.0.0.1", "--port", String(port), "--no-log"]
      : [oraclePython(), "-m", "mlx_lm.server", "--model", model, "--host", "127.0.0.1", "--port", String(port), "--log-level", "WARNING"];
  const proc = Bun.spawn(cmd, { stdout: "ignore", stderr: "ignore", env: { ...process.env, PYTHONUNBUFFERED: "1" } });
  const url = `http://127.0.0.1:${port}`;
  const t0 = performance.now();
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`${side} server exited with ${proc.exitCode}`);
    try {
      if ((await fetch(`${url}/health`)).ok) break;
    } catch {
      // not listening yet
    }
    if (performance.now() - t0 > 120_000) throw new Error(`${side} server did not start in 120 s`);
    await Bun.sleep(200);
  }
  return {
    url,
    stop: async () => {
      proc.kill("SIGTERM");
      await Promise.race([proc.exited, Bun.sleep(5000)]);
      if (proc.exitCode === null) proc.kill("SIGKILL");
    },
  };
}

type Message = { role: string; content: string };

async function ask(url: string, messages: Message[], maxTokens: number): Promise<{ content: string; promptTokens: number; cachedTokens: number }> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "default_model", messages, max_tokens: maxTokens, temperature: 0 }),
  });
  if (!r.ok) throw new Error(`${url}: ${r.status} ${await r.text()}`);
  const j = (await r.json()) as {
    choices: { message: { content: string | null } }[];
    usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } };
  };
  return { content: j.choices[0]!.message.content ?? "", promptTokens: j.usage.prompt_tokens, cachedTokens: j.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

function words(n: number, seed: number): string {
  const vocab = ["sea", "light", "stone", "river", "cloud", "wind", "north", "glass", "field", "song", "iron", "paper", "green", "quiet", "ember"];
  return Array.from({ length: n }, (_, i) => vocab[(i * 7 + seed * 3 + ((i * i) % 5)) % vocab.length]).join(" ");
}

/** The three-turn chat and the repeated prompt on one server. */
export async function conversation(url: string, opts: { words: number; maxTokens: number }): Promise<TurnFigures[]> {
  const out: TurnFigures[] = [];
  const messages: Message[] = [{ role: "system", content: `You are terse. ${words(opts.words / 4, 1)}` }];
  for (let turn = 1; turn <= 3; turn++) {
    messages.push({ role: "user", content: `Turn ${turn}: ${words(opts.words, turn + 1)}` });
    const r = await ask(url, messages, opts.maxTokens);
    out.push({ label: `chat turn ${turn}`, promptTokens: r.promptTokens, cachedTokens: r.cachedTokens });
    messages.push({ role: "assistant", content: r.content });
  }
  const repeated: Message[] = [{ role: "user", content: `Repeat: ${words(opts.words, 9)}` }];
  await ask(url, repeated, opts.maxTokens);
  const again = await ask(url, repeated, opts.maxTokens);
  out.push({ label: "repeated prompt, second time", promptTokens: again.promptTokens, cachedTokens: again.cachedTokens });
  return out;
}

/** Both servers on `model`, one after the other; rows of [label, prompt tokens, ours, theirs]. */
export async function compareSides(model: string, opts: { words: number; maxTokens: number }): Promise<{ ours: TurnFigures[]; theirs: TurnFigures[] }> {
  const result: Partial<Record<"ours" | "theirs", TurnFigures[]>> = {};
  for (const [key, side] of [
    ["ours", "mlx-bun"],
    ["theirs", "mlx_lm"],
  ] as const) {
    const s = await startServer(side, model);
    try {
      result[key] = await conversation(s.url, opts);
    } finally {
      await s.stop();
    }
  }
  return result as { ours: TurnFigures[]; theirs: TurnFigures[] };
}

if (import.meta.main) {
  const argv = process.argv.slice(2);
  const val = (f: string) => (argv.includes(`--${f}`) ? argv[argv.indexOf(`--${f}`) + 1] : undefined);
  const maxTokens = Number(val("max-tokens") ?? 24);
  const tmp = mkdtempSync(join(tmpdir(), "mlxb-turns-"));
  try {
    const models: [string, string, number][] = [];
    if (val("model")) models.push([val("model")!, resolve(val("model")!), Number(val("words") ?? 120)]);
    else {
      const maker = join(ROOT, "tools", "make-tiny-model", "make_tiny_model.py");
      runPython([maker, "--variant", "small", "--out", join(tmp, "w8")]);
      runPython([maker, "--variant", "small", "--out", join(tmp, "w512"), "--set", "sliding_window=512", "--set", "max_position_embeddings=8192"]);
      models.push(["tiny, sliding window 8", join(tmp, "w8"), 120], ["tiny, sliding window 512, history > 2k tokens", join(tmp, "w512"), 400]);
    }
    for (const [name, dir, n] of models) {
      console.error(`[multi-turn-cache] ${name}`);
      const { ours, theirs } = await compareSides(dir, { words: n, maxTokens });
      console.log(
        `\n${name} (${maxTokens} tokens per answer)\n\n| request | prompt tokens (mlx-bun / mlx_lm) | cached_tokens mlx-bun | cached_tokens mlx_lm.server |\n| --- | --- | --- | --- |`,
      );
      ours.forEach((o, i) => console.log(`| ${o.label} | ${o.promptTokens} / ${theirs[i]!.promptTokens} | ${o.cachedTokens} | ${theirs[i]!.cachedTokens} |`));
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}
