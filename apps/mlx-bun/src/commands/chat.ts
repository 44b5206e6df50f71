// mlx-bun chat: an interactive terminal chat with history (mlx_lm.chat's flags). /exit (or q, or
// Ctrl-D) quits, /reset (r) clears the history, /help (h) lists the commands, Ctrl-C stops a
// reply, or quits at the prompt. The conversation's KV caches are reused across turns.
import { createInterface } from "node:readline";
import type { ChatMessage } from "@mlx-bun/models";
import type { KvStoreInfo, PromptCache } from "@mlx-bun/runtime";
import { adapterLayers, loadEngine, noteNoOps } from "../load.ts";
import type { ModelOptions, SamplingOptions } from "../options.ts";
import { samplingFrom } from "../options.ts";
import { chatPromptCheckpoints, chatPromptIds } from "../prompt.ts";
import { timings } from "./generate.ts";
import { mlxLmLoadDraws } from "./mlx-lm-seed.ts";
import { cacheFromFile, kvForCacheFile, loadCacheFile, modelForCacheFile, readCacheFileInfo, renderAfterCachedPrefix } from "./prompt-cache-file.ts";

export interface ChatOptions extends ModelOptions, SamplingOptions {
  systemPrompt?: string;
  chatTemplateConfig?: Record<string, unknown>;
  promptCacheFile?: string;
  verbose?: boolean;
}

const HELP = "Commands: /exit or q (or Ctrl-D) quits, /reset or r clears the history, /help or h shows this. Ctrl-C stops a reply.";

export async function runChat(o: ChatOptions): Promise<number> {
  let info: KvStoreInfo | undefined;
  if (o.promptCacheFile !== undefined) info = await readCacheFileInfo(o.promptCacheFile);
  const resolved = info ? await modelForCacheFile(o, info, true) : undefined;
  const { engine, model } = await loadEngine(o, { ...(info ? { fileKv: kvForCacheFile(info, o) } : {}), ...(resolved ? { model: resolved } : {}) });
  noteNoOps(o);
  const { PromptCache, Scheduler } = await import("@mlx-bun/runtime");
  // The file's caches (the start of the first user message, as mlx_lm.generate reads them), and
  // each turn's caches, reused by the next turn.
  let promptCache: PromptCache;
  let prefix: number[] = [];
  if (info) {
    const c = await cacheFromFile(await loadCacheFile(engine, o.promptCacheFile!), { maxEntries: 4 });
    promptCache = c.promptCache;
    prefix = c.prefix;
  } else promptCache = new PromptCache({ maxBytes: Number.POSITIVE_INFINITY, maxEntries: 4 });
  const scheduler = new Scheduler(engine, { maxBatch: 1, prefillBatch: 1, memoryBudgetBytes: Number.POSITIVE_INFINITY, promptCache });
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
  const kwargs = o.chatTemplateConfig ?? null;
  // mlx_lm.chat seeds MLX's global key stream once (--seed, default 0) before building the model,
  // and every turn draws on from it: one key per sampled token plus one for the step computed
  // ahead of the last (two each with XTC: its coin first).
  let keysUsed = mlxLmLoadDraws(engine.loaded, adapterLayers.get(engine));
  const perDraw = o.xtcProbability > 0 ? 2 : 1;
  const idsFor = (messages: ChatMessage[]): { promptIds: number[]; checkpoints: number[] } => {
    if (!info || !engine.loaded.template) {
      const ids = chatPromptIds(engine.loaded, messages, { kwargs });
      return { promptIds: [...prefix, ...ids], checkpoints: info ? [] : chatPromptCheckpoints(engine.loaded, messages, ids, { kwargs }) };
    }
    const first = messages.findIndex((m) => m.role === "user");
    const text = renderAfterCachedPrefix(engine.loaded, messages, first, { addGenerationPrompt: true, continueFinalMessage: false, kwargs });
    return { promptIds: [...prefix, ...engine.loaded.tokenizer.encode(text, { addSpecialTokens: false })], checkpoints: [] };
  };
  try {
    prompt();
    for await (const raw of rl) {
      const line = raw.trim();
      if (line === "/exit" || line === "/quit" || line === "q") break;
      if (line === "/reset" || line === "r") {
        history = fresh();
        out.write("[history cleared]\n");
        prompt();
        continue;
      }
      if (line === "/help" || line === "h") {
        out.write(`${HELP}\n`);
        prompt();
        continue;
      }
      if (!line) {
        prompt();
        continue;
      }
      history.push({ role: "user", content: raw });
      const { promptIds, checkpoints } = idsFor(history);
      current = new AbortController();
      const stream = scheduler.submit({
        promptIds,
        maxTokens: o.maxTokens,
        sampling: { ...samplingFrom(o), seedSkip: keysUsed },
        // As mlx_lm.chat, which prints the detokenizer's text, special tokens included.
        keepSpecialTokens: true,
        ...(checkpoints.length ? { cacheCheckpoints: checkpoints } : {}),
        signal: current.signal,
      });
      for await (const ev of stream) if (ev.text) out.write(ev.text);
      const r = await stream.result;
      current = null;
      if (o.temp > 0) keysUsed += (r.tokens.length + 1) * perDraw;
      out.write(r.finishReason === "cancelled" ? " [stopped]\n" : "\n");
      // The history keeps the reply without special tokens (the template adds its own markup).
      history.push({ role: "assistant", content: engine.loaded.tokenizer.decode(r.tokens, { skipSpecialTokens: true }) });
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
    await scheduler.close();
    promptCache.dispose();
    engine.dispose();
  }
  if (tty) out.write("\n");
  return 0;
}
