// mlx-bun serve: the OpenAI-compatible HTTP server (a drop-in for mlx_lm.server: its flags, with
// their meanings and defaults).
import { mkdirSync, readdirSync, rmSync } from "node:fs";
import { basename, join } from "node:path";
import { ChatTemplate } from "@mlx-bun/models";
import { type Engine, type PromptCache, removeStaleTempsIn, savePromptCache } from "@mlx-bun/runtime";
import { loadDraft, loadEngine, noteNoOps } from "../load.ts";
import type { DraftOptions, ModelOptions, SamplingOptions } from "../options.ts";
import { UsageError } from "../options.ts";
import { startServer } from "../server/http.ts";
import { imageSupportFor } from "../server/images.ts";
import { loadCacheFile } from "./prompt-cache-file.ts";

export interface ServeOptions extends ModelOptions, SamplingOptions, DraftOptions {
  host: string;
  port: number;
  apiKey?: string;
  /** Ours: requests decoded together (an alias of --decode-concurrency). */
  maxBatch?: number;
  /** mlx_lm.server's --decode-concurrency (default 32) and --prompt-concurrency (default 8). */
  decodeConcurrency?: number;
  promptConcurrency: number;
  memoryBudget?: number;
  /** Prompt-cache entries (0 = off) and byte budget. */
  promptCacheSize: number;
  promptCacheBytes: number;
  /** Load this prompt-cache file (ours, with token ids) into the prompt cache at start. */
  promptCacheFile?: string;
  /** Restore the prompt cache from this directory at start and save it there at shutdown. */
  promptCacheDir?: string;
  maxBodySize: number;
  allowedOrigins: string[];
  /** Host names the DNS-rebinding check accepts besides the loopback names and --host. */
  allowedHosts?: string[];
  /** Connection limits in seconds (server/limits.ts): --idle-timeout, --body-timeout, --write-timeout, --template-timeout. */
  idleTimeout?: number;
  bodyTimeout?: number;
  writeTimeout?: number;
  templateTimeout?: number;
  /** --max-buffered-output: unread streamed bytes a response may hold. */
  maxBufferedOutput?: number;
  chatTemplateArgs?: Record<string, unknown>;
  /** mlx_lm.server's --chat-template (a template string; "" = the model's). */
  chatTemplate?: string;
  useDefaultChatTemplate?: boolean;
  logLevel: string;
  anyModel?: boolean;
  log: boolean;
  /** false (--no-web): no chat page at "/". */
  web?: boolean;
  /** --allow-remote-images: fetch http(s) image_url parts (default: a 400). */
  allowRemoteImages?: boolean;
}

const say = (l: string): void => void process.stderr.write(`mlx-bun serve: ${l}\n`);

export async function runServe(o: ServeOptions): Promise<number> {
  if (o.maxBatch !== undefined && o.decodeConcurrency !== undefined && o.maxBatch !== o.decodeConcurrency) {
    throw new UsageError(`--max-batch ${o.maxBatch} and --decode-concurrency ${o.decodeConcurrency} are the same setting; give one`);
  }
  if (o.promptCacheDir !== undefined && o.promptCacheSize === 0) throw new UsageError("--prompt-cache-dir needs the prompt cache (--prompt-cache-size > 0)");
  if (o.promptCacheFile !== undefined && o.promptCacheSize === 0) throw new UsageError("--prompt-cache-file needs the prompt cache (--prompt-cache-size > 0)");
  // Under `mlx-bun launch`: rank 0 serves, one request at a time through the Engine (docs/distributed.md).
  if (process.env.MLX_BUN_DIST_BACKEND) return serveAcrossRanks(o);
  const { engine, model } = await loadEngine(o);
  noteNoOps(o, say);
  useChatTemplate(engine, o);
  const speculative = await loadDraft(o, engine);
  const { PromptCache, Scheduler } = await import("@mlx-bun/runtime");
  const promptCache = o.promptCacheSize > 0 ? new PromptCache({ maxEntries: o.promptCacheSize, maxBytes: o.promptCacheBytes }) : undefined;
  if (promptCache && o.promptCacheDir !== undefined) await restorePromptCache(o.promptCacheDir, engine, promptCache);
  if (promptCache && o.promptCacheFile !== undefined) {
    const loaded = await loadCacheFile(engine, o.promptCacheFile);
    try {
      if (!loaded.tokens)
        throw new UsageError(
          `--prompt-cache-file ${o.promptCacheFile}: an mlx-lm file holds no token ids, so the server cannot tell which prompts it starts; write it with mlx-bun cache-prompt`,
        );
      promptCache.insert(loaded.tokens, loaded.caches);
    } finally {
      loaded.dispose();
    }
  }
  // As mlx_lm.server: a quantized KV cache (--kv-bits) is not batchable, requests run one at a time.
  const batching = engine.quantizedKv
    ? { maxBatch: 1, prefillBatch: 1 }
    : { maxBatch: o.maxBatch ?? o.decodeConcurrency ?? 32, prefillBatch: o.promptConcurrency };
  if (engine.quantizedKv && (o.maxBatch ?? o.decodeConcurrency ?? 1) > 1)
    say("--kv-bits: requests are served one at a time (as mlx_lm.server), --decode-concurrency does not apply");
  const scheduler = new Scheduler(engine, {
    ...batching,
    ...(o.memoryBudget !== undefined ? { memoryBudgetBytes: o.memoryBudget } : {}),
    ...(promptCache ? { promptCache } : {}),
    ...(speculative ? { speculative } : {}),
  });
  const apiKey = apiKeyOf(o);
  const srv = startServer({
    model: engine.loaded,
    scheduler,
    ...serverSettings(o, model, engine),
    ...(o.draftModel ? { draftModel: o.draftModel } : {}),
    images: imageSupportFor(engine.loaded, { allowRemote: o.allowRemoteImages === true }),
    ...(logsRequests(o) ? { log: (l: string) => process.stderr.write(`${new Date().toISOString()} ${l}\n`) } : {}),
  });
  // One line tests and scripts can wait for (with the real port when --port 0).
  process.stderr.write(
    `mlx-bun serve: ${model.id} (kv ${kvLabel(engine)}) ${speculative ? `, draft ${o.draftModel} (${speculative.numDraftTokens} tokens)` : ""} listening on ${srv.url}${srv.webChat === "on" ? ` (web chat at ${srv.url}/)` : ""}${apiKey ? " (API key required)" : ""}\n`,
  );
  if (srv.webChat === "not built") process.stderr.write("mlx-bun serve: the web chat is not built: run bash tools/setup.sh (the API works without it)\n");
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
  say("shutting down");
  await srv.stop();
  await scheduler.close();
  try {
    if (promptCache && o.promptCacheDir !== undefined) savePromptCacheDir(o.promptCacheDir, engine, promptCache, model);
  } finally {
    promptCache?.dispose();
    speculative?.draft.dispose();
    engine.dispose();
  }
  return 0;
}

/** --chat-template (a template string, as mlx_lm.server) replaces the model's; --use-default-chat-template has nothing to add. */
function useChatTemplate(engine: Engine, o: ServeOptions): void {
  if (o.chatTemplate) {
    engine.loaded.template = new ChatTemplate(o.chatTemplate, Object.fromEntries(engine.loaded.tokenizer.specialTokens), "--chat-template");
  }
  if (o.useDefaultChatTemplate && !engine.loaded.template) {
    say("--use-default-chat-template: transformers has no default template any more; prompts use mlx_lm.server's plain-text fallback (convert_chat)");
  }
}

/** DEBUG and INFO log a line per request (unless --no-log); WARNING and above only errors. */
function logsRequests(o: ServeOptions): boolean {
  return o.log && (o.logLevel === "DEBUG" || o.logLevel === "INFO");
}

function kvLabel(engine: Engine): string {
  const q = engine.quantizedKv;
  return q ? `${engine.kvModeName}, q${q.bits} (group ${q.groupSize}) from token ${q.start} on full-attention layers` : engine.kvModeName;
}

const ENTRY_RE = /^prompt-cache-(\d+)\.safetensors$/;
const entryName = (i: number): string => `prompt-cache-${String(i).padStart(4, "0")}.safetensors`;

/**
 * --prompt-cache-dir at start: every `prompt-cache-<n>.safetensors` there, in order (least recently
 * used first), back into the prompt cache. A file that does not load (another model, another KV
 * mode, corrupt) is named and skipped; the server starts anyway. Temporary files of saves a kill
 * interrupted are removed first.
 */
export async function restorePromptCache(dir: string, engine: Engine, promptCache: PromptCache): Promise<number> {
  mkdirSync(dir, { recursive: true });
  const stale = removeStaleTempsIn(dir, (name) => ENTRY_RE.test(name));
  if (stale.length) say(`--prompt-cache-dir: removed ${stale.length} temporary files of interrupted saves`);
  const files = readdirSync(dir)
    .filter((f) => ENTRY_RE.test(f))
    .sort();
  let restored = 0;
  let tokens = 0;
  for (const f of files) {
    const path = join(dir, f);
    try {
      const loaded = await loadCacheFile(engine, path);
      try {
        if (!loaded.tokens) throw new Error("holds no token ids (an mlx-lm file)");
        if (promptCache.insert(loaded.tokens, loaded.caches)) {
          restored++;
          tokens += loaded.offset;
        }
      } finally {
        loaded.dispose();
      }
    } catch (e) {
      say(`--prompt-cache-dir: skipped ${path}: ${(e as Error).message}`);
    }
  }
  if (files.length) say(`restored ${restored} prompt-cache entries (${tokens} tokens) from ${dir}`);
  return restored;
}

/**
 * --prompt-cache-dir at shutdown: each entry as one file (atomic writes), least recently used
 * first; files of entries no longer cached are removed afterwards.
 */
export function savePromptCacheDir(dir: string, engine: Engine, promptCache: PromptCache, model: { id: string; dir: string }): number {
  mkdirSync(dir, { recursive: true });
  const entries = promptCache.snapshot();
  const written = new Set<string>();
  try {
    entries.forEach((e, i) => {
      const name = entryName(i);
      savePromptCache(join(dir, name), { fingerprint: engine.loaded.fingerprint, caches: e.caches, tokens: e.tokens, model: model.dir });
      written.add(name);
    });
  } finally {
    for (const e of entries) for (const c of e.caches) c.dispose();
  }
  for (const f of readdirSync(dir)) if (ENTRY_RE.test(f) && !written.has(f)) rmSync(join(dir, f), { force: true });
  // Each save cleans its own path's temporaries; these are those of entries no longer written.
  removeStaleTempsIn(dir, (name) => ENTRY_RE.test(name));
  say(`saved ${entries.length} prompt-cache entries to ${dir}`);
  return entries.length;
}

/** Rank 0 of a launched group serves HTTP from a worker; the other ranks follow inside loadEngine and never return. */
async function serveAcrossRanks(o: ServeOptions): Promise<number> {
  if (o.draftModel) throw new UsageError("mlx-bun serve: --draft-model does not run across ranks (speculative decoding is single-process only)");
  if (o.promptCacheDir !== undefined || o.promptCacheFile !== undefined)
    throw new UsageError("mlx-bun serve: --prompt-cache-dir / --prompt-cache-file need the prompt cache, which does not run across ranks");
  const { engine, model } = await loadEngine(o);
  useChatTemplate(engine, o);
  const { serveOnRanks } = await import("../launch/serve-ranks.ts");
  const apiKey = apiKeyOf(o);
  return serveOnRanks({
    engine,
    init: { dir: model.dir, log: logsRequests(o), server: serverSettings(o, model, engine) },
    announce: (url, webChat) => {
      process.stderr.write(
        `mlx-bun serve: ${model.id} (kv ${engine.kvModeName}, tensor-parallel rank 0, one request at a time, no prompt cache) listening on ${url}${webChat === "on" ? ` (web chat at ${url}/)` : ""}${apiKey ? " (API key required)" : ""}\n`,
      );
    },
  });
}

function apiKeyOf(o: ServeOptions): string | undefined {
  return o.apiKey ?? (process.env.MLX_BUN_API_KEY || undefined);
}

/** The server settings a single-process serve and a tensor-parallel rank 0 share. */
function serverSettings(o: ServeOptions, model: { id: string; dir: string }, engine: Engine) {
  const apiKey = apiKeyOf(o);
  return {
    modelId: model.id,
    modelAliases: [...new Set([model.dir, basename(model.dir), engine.modelName].filter((a) => a !== model.id))],
    ...(o.anyModel !== undefined ? { anyModel: o.anyModel } : {}),
    host: o.host,
    port: o.port,
    ...(apiKey ? { apiKey } : {}),
    maxBodyBytes: o.maxBodySize,
    defaults: {
      maxTokens: o.maxTokens,
      temperature: o.temp,
      topP: o.topP,
      topK: o.topK,
      minP: o.minP,
      xtcProbability: o.xtcProbability,
      xtcThreshold: o.xtcThreshold,
    },
    ...(o.chatTemplateArgs ? { chatTemplateArgs: o.chatTemplateArgs } : {}),
    allowedOrigins: o.allowedOrigins,
    ...(o.allowedHosts?.length ? { allowedHosts: o.allowedHosts } : {}),
    limits: {
      ...(o.idleTimeout !== undefined ? { idleTimeoutS: o.idleTimeout } : {}),
      ...(o.bodyTimeout !== undefined ? { bodyTimeoutS: o.bodyTimeout } : {}),
      ...(o.writeTimeout !== undefined ? { writeTimeoutS: o.writeTimeout } : {}),
      ...(o.templateTimeout !== undefined ? { templateTimeoutMs: o.templateTimeout * 1000 } : {}),
      ...(o.maxBufferedOutput !== undefined ? { maxBufferedBytes: o.maxBufferedOutput } : {}),
    },
    kvMode: kvLabel(engine),
    ...(o.web === false ? { webDir: null } : {}),
  };
}
