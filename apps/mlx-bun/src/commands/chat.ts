// mlx-bun chat: an interactive terminal chat with history (like mlx_lm.chat). /exit (or Ctrl-D)
// quits, /reset clears the history, Ctrl-C stops a reply, or quits at the prompt.
import { createInterface } from "node:readline";
import type { ChatMessage } from "@mlx-bun/models";
import { loadEngine } from "../load.ts";
import type { ModelOptions, SamplingOptions } from "../options.ts";
import { samplingFrom } from "../options.ts";
import { chatPromptIds } from "../prompt.ts";
import { timings } from "./generate.ts";

export interface ChatOptions extends ModelOptions, SamplingOptions {
  systemPrompt?: string;
  chatTemplateConfig?: Record<string, unknown>;
  verbose?: boolean;
}

const HELP = "Commands: /exit (or Ctrl-D) quits, /reset clears the history, /help shows this. Ctrl-C stops a reply.";

export async function runChat(o: ChatOptions): Promise<number> {
  const { engine, model } = await loadEngine(o);
  const out = process.stdout;
  const tty = Boolean(process.stdin.isTTY);
  const rl = createInterface({ input: process.stdin, output: out, terminal: tty, prompt: ">> " });
  const fresh = (): ChatMessage[] => (o.systemPrompt !== undefined ? [{ role: "system", content: o.systemPrompt }] : []);
  let history = fresh();
  let current: AbortController | null = null;
  let closed = false;
  rl.on("close", () => {
    closed = true;
  });
  // The ">> " prompt only on a terminal (piped input gets just the replies).
  const prompt = () => {
    if (tty && !closed) rl.prompt();
  };
  const onInterrupt = () => {
    if (current) current.abort();
    else rl.close();
  };
  rl.on("SIGINT", onInterrupt); // terminal: readline turns Ctrl-C into this
  process.on("SIGINT", onInterrupt); // piped input: the signal itself
  out.write(`[mlx-bun chat] ${model.id} (kv ${engine.kvModeName}). ${HELP}\n`);
  try {
    prompt();
    for await (const raw of rl) {
      const line = raw.trim();
      if (line === "/exit" || line === "/quit") break;
      if (line === "/reset") {
        history = fresh();
        out.write("[history cleared]\n");
        prompt();
        continue;
      }
      if (line === "/help") {
        out.write(`${HELP}\n`);
        prompt();
        continue;
      }
      if (!line) {
        prompt();
        continue;
      }
      history.push({ role: "user", content: raw });
      const promptIds = chatPromptIds(engine.loaded, history, { kwargs: o.chatTemplateConfig ?? null });
      current = new AbortController();
      const stream = engine.generate({ promptIds, maxTokens: o.maxTokens, sampling: samplingFrom(o), signal: current.signal });
      for await (const ev of stream) if (ev.text) out.write(ev.text);
      const r = await stream.result;
      current = null;
      out.write(r.finishReason === "cancelled" ? " [stopped]\n" : "\n");
      history.push({ role: "assistant", content: r.text });
      if (o.verbose) {
        const t = timings(r, 0);
        process.stderr.write(
          `[prompt ${t.prompt_tokens} tokens (${t.cached_tokens} cached), ${t.prompt_tps.toFixed(1)} tok/s; generated ${t.generation_tokens} tokens, ${t.generation_tps.toFixed(1)} tok/s; ${r.finishReason}]\n`,
        );
      }
      prompt();
    }
  } finally {
    process.off("SIGINT", onInterrupt);
    rl.close();
    engine.dispose();
  }
  if (tty) out.write("\n");
  return 0;
}
