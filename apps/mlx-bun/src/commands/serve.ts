// mlx-bun serve: the OpenAI-compatible HTTP server (a drop-in for mlx_lm.server).
import { basename } from "node:path";
import { loadDraft, loadEngine } from "../load.ts";
import type { DraftOptions, ModelOptions, SamplingOptions } from "../options.ts";
import { startServer } from "../server/http.ts";

export interface ServeOptions extends ModelOptions, SamplingOptions, DraftOptions {
  host: string;
  port: number;
  apiKey?: string;
  maxBatch?: number;
  memoryBudget?: number;
  /** Prompt-cache entries (0 = off) and byte budget. */
  promptCacheSize: number;
  promptCacheBytes: number;
  maxBodySize: number;
  allowedOrigins: string[];
  chatTemplateArgs?: Record<string, unknown>;
  anyModel?: boolean;
  log: boolean;
  /** false (--no-web): no chat page at "/". */
  web?: boolean;
}

export async function runServe(o: ServeOptions): Promise<number> {
  // Under `mlx-bun launch`: rank 0 serves, one request at a time through the Engine (docs/distributed.md).
  if (process.env.MLX_BUN_DIST_BACKEND) return serveAcrossRanks(o);
  const { engine, model } = await loadEngine(o);
  const speculative = await loadDraft(o, engine);
  const { PromptCache, Scheduler } = await import("@mlx-bun/runtime");
  const promptCache = o.promptCacheSize > 0 ? new PromptCache({ maxEntries: o.promptCacheSize, maxBytes: o.promptCacheBytes }) : undefined;
  const scheduler = new Scheduler(engine, {
    ...(o.maxBatch !== undefined ? { maxBatch: o.maxBatch } : {}),
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
    ...(o.log ? { log: (l: string) => process.stderr.write(`${new Date().toISOString()} ${l}\n`) } : {}),
  });
  // One line tests and scripts can wait for (with the real port when --port 0).
  process.stderr.write(`mlx-bun serve: ${model.id} (kv ${engine.kvModeName}) ${speculative ? `, draft ${o.draftModel} (${speculative.numDraftTokens} tokens)` : ""} listening on ${srv.url}${srv.webChat === "on" ? ` (web chat at ${srv.url}/)` : ""}${apiKey ? " (API key required)" : ""}\n`);
  if (srv.webChat === "not built") process.stderr.write("mlx-bun serve: the web chat is not built: run bash tools/setup.sh (the API works without it)\n");
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
  process.stderr.write("mlx-bun serve: shutting down\n");
  await srv.stop();
  await scheduler.close();
  promptCache?.dispose();
  speculative?.draft.dispose();
  engine.dispose();
  return 0;
}

/** Rank 0 of a launched group serves HTTP from a worker; the other ranks follow inside loadEngine and never return. */
async function serveAcrossRanks(o: ServeOptions): Promise<number> {
  if (o.draftModel) throw new Error("mlx-bun serve: --draft-model does not run across ranks (speculative decoding is single-process only)");
  const { engine, model } = await loadEngine(o);
  const { serveOnRanks } = await import("../launch/serve-ranks.ts");
  const apiKey = apiKeyOf(o);
  return serveOnRanks({
    engine,
    init: { dir: model.dir, log: o.log, server: serverSettings(o, model, engine) },
    announce: (url, webChat) => {
      process.stderr.write(`mlx-bun serve: ${model.id} (kv ${engine.kvModeName}, tensor-parallel rank 0, one request at a time, no prompt cache) listening on ${url}${webChat === "on" ? ` (web chat at ${url}/)` : ""}${apiKey ? " (API key required)" : ""}\n`);
    },
  });
}

function apiKeyOf(o: ServeOptions): string | undefined {
  return o.apiKey ?? (process.env.MLX_BUN_API_KEY || undefined);
}

/** The server settings a single-process serve and a tensor-parallel rank 0 share. */
function serverSettings(o: ServeOptions, model: { id: string; dir: string }, engine: { modelName: string; kvModeName: string }) {
  const apiKey = apiKeyOf(o);
  return {
    modelId: model.id,
    modelAliases: [...new Set([model.dir, basename(model.dir), engine.modelName].filter((a) => a !== model.id))],
    ...(o.anyModel !== undefined ? { anyModel: o.anyModel } : {}),
    host: o.host,
    port: o.port,
    ...(apiKey ? { apiKey } : {}),
    maxBodyBytes: o.maxBodySize,
    defaults: { maxTokens: o.maxTokens, temperature: o.temp, topP: o.topP, topK: o.topK, minP: o.minP, xtcProbability: o.xtcProbability, xtcThreshold: o.xtcThreshold },
    ...(o.chatTemplateArgs ? { chatTemplateArgs: o.chatTemplateArgs } : {}),
    allowedOrigins: o.allowedOrigins,
    kvMode: engine.kvModeName,
    ...(o.web === false ? { webDir: null } : {}),
  };
}
