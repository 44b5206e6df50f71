// --prompt-cache-file (generate, chat, serve) and mlx-bun cache-prompt: the file format is mlx-lm's
// save_prompt_cache (packages/runtime/src/kv-store.ts), so files go both ways between mlx-bun and
// mlx_lm.cache_prompt / mlx_lm.generate.
import { resolve } from "node:path";
import type { ChatMessage, KvMode } from "@mlx-bun/models";
import type { Engine, EngineOptions, KvStoreInfo, LoadedPromptCache, PromptCache } from "@mlx-bun/runtime";
import { isRepoId } from "../hub.ts";
import { type ResolvedModel, resolveModel } from "../model-path.ts";
import { type ModelOptions, UsageError } from "../options.ts";
import { type PromptModel, templateKwargs } from "../prompt.ts";

/** Read a cache file's header (a clear error for a missing, foreign or corrupt file). */
export async function readCacheFileInfo(path: string): Promise<KvStoreInfo> {
  const { readPromptCacheInfo } = await import("@mlx-bun/runtime");
  return readPromptCacheInfo(path);
}

/**
 * The model to load: --model, else the one the file names (as mlx_lm.generate). For a file mlx-lm
 * wrote, a different --model is an error, as in mlx_lm ("Providing a different model ... is an
 * error"); our files carry the model fingerprint, checked when the caches load.
 */
export async function modelForCacheFile(o: ModelOptions, info: KvStoreInfo, progress: boolean): Promise<ResolvedModel> {
  if (o.model === undefined || o.model === "") {
    if (info.model) return resolveModel(info.model, { progress });
    return resolveModel(undefined, { progress });
  }
  const model = await resolveModel(o.model, { progress });
  if (info.format === "mlx-lm" && info.model && !sameModel(info.model, o.model, model)) {
    throw new UsageError(
      `--model ${o.model}: the prompt cache ${info.path} was made with model ${info.model}; providing a different model is an error (as in mlx_lm)`,
    );
  }
  return model;
}

function sameModel(fileModel: string, given: string, resolved: ResolvedModel): boolean {
  if (fileModel === given) return true;
  if (isRepoId(fileModel) && !isRepoId(given)) return false;
  return resolve(fileModel) === resolve(resolved.dir) || resolve(fileModel) === resolve(given);
}

/**
 * The KV layout the file's caches need when the flags do not say: our files name it in their
 * signatures; mlx-lm's QuantizedKVCache layers mean --kv-bits with their bits and group size.
 * Flags that contradict the file are errors, as mlx_lm's (--kv-bits / --kv-group-size mismatch).
 */
export function kvForCacheFile(info: KvStoreInfo, o: ModelOptions): { kv?: KvMode; kvSliding?: KvMode; quantizedKv?: EngineOptions["quantizedKv"] } {
  const start = o.quantizedKvStart ?? 5000;
  if (info.format === "mlx-lm") {
    const q = info.layers.find((l) => l.class === "QuantizedKVCache");
    if (!q) return {};
    const bits = q.meta.bits!;
    const groupSize = q.meta.groupSize!;
    if (o.kvBits !== undefined && o.kvBits !== bits)
      throw new UsageError(`--kv-bits ${o.kvBits} does not match the KV cache loaded from --prompt-cache-file (${bits} bits)`);
    if (o.kvGroupSize !== undefined && o.kvGroupSize !== groupSize && o.kvBits !== undefined) {
      throw new UsageError(`--kv-group-size ${o.kvGroupSize} does not match the KV cache loaded from --prompt-cache-file (group size ${groupSize})`);
    }
    return { quantizedKv: { bits, groupSize, start } };
  }
  // Ours: the first non-rotating layer's signature names the mode.
  const sig = info.layers.map((l) => l.signature ?? "").find((s) => !s.startsWith("rotating:")) ?? info.layers[0]?.signature ?? "";
  // The rotating (sliding-window) layers are plain unless --kv-sliding quantized them (or a file
  // from before that default): their one quantized codec is the sliding mode the file needs.
  const rotating = new Set(info.layers.map((l) => /^rotating:\d+:\d+:(.*)$/.exec(l.signature ?? "")?.[1]).filter((c) => c !== undefined));
  const slidingCodec = rotating.size === 1 && !rotating.has("kv:plain") ? [...rotating][0]! : undefined;
  const kvSliding = slidingCodec ? codecMode(slidingCodec) : undefined;
  let m: RegExpExecArray | null;
  if ((m = /^kv:plain>quant:(\d+):(\d+)@(\d+)$/.exec(sig))) {
    const bits = Number(m[1]);
    const groupSize = Number(m[2]);
    const fileStart = Number(m[3]);
    if (o.kvBits !== undefined && (o.kvBits !== bits || (o.kvGroupSize ?? 64) !== groupSize || (o.quantizedKvStart ?? 5000) !== fileStart)) {
      throw new UsageError(
        `--kv-bits ${o.kvBits} --kv-group-size ${o.kvGroupSize ?? 64} --quantized-kv-start ${o.quantizedKvStart ?? 5000} do not match the prompt cache file (bits ${bits}, group size ${groupSize}, start ${fileStart})`,
      );
    }
    return { quantizedKv: { bits, groupSize, start: fileStart } };
  }
  const kv = codecMode(sig);
  return { ...(kv ? { kv } : {}), ...(kvSliding && o.kvSliding === undefined ? { kvSliding } : {}) };
}

/** The KV mode of a codec named in a signature (kv:quant:<bits>:<group>, kv:turboquant:<k>:<v>). */
function codecMode(sig: string): KvMode | undefined {
  let m: RegExpExecArray | null;
  if ((m = /kv:quant:(\d+):(\d+)$/.exec(sig))) return { kind: "affine", bits: Number(m[1]), groupSize: Number(m[2]) };
  if ((m = /kv:turboquant:(\d+):(\d+)/.exec(sig))) return { kind: "turbo", kBits: Number(m[1]), vBits: Number(m[2]) };
  return undefined;
}

/** Map the file's caches into caches of `engine` (fingerprint, signatures and shapes checked). */
export async function loadCacheFile(engine: Engine, path: string): Promise<LoadedPromptCache> {
  const { loadPromptCache } = await import("@mlx-bun/runtime");
  const model = engine.loaded.model;
  return loadPromptCache(path, {
    fingerprint: engine.loaded.fingerprint,
    makeCaches: () => engine.makeCaches(),
    layerShapes: model.specs.slice(0, model.firstShared).map((s) => ({ kvHeads: s.numKvHeads, headDim: s.headDim })),
  });
}

/**
 * A prompt cache whose one entry is the file's caches, and the token ids a prompt must start with
 * to continue from them: ours stores its ids; mlx-lm's stores none, so the entry is keyed by
 * placeholder ids (the pad token) that only this run's prompts start with. The loaded caches are
 * consumed (the entry shares their arrays).
 */
export async function cacheFromFile(
  loaded: LoadedPromptCache,
  opts: { maxBytes?: number; maxEntries?: number } = {},
): Promise<{ promptCache: PromptCache; prefix: number[] }> {
  const { PromptCache } = await import("@mlx-bun/runtime");
  const promptCache = new PromptCache({ maxBytes: opts.maxBytes ?? Number.POSITIVE_INFINITY, maxEntries: opts.maxEntries ?? 4 });
  const prefix = loaded.tokens ?? new Array<number>(loaded.offset).fill(0);
  try {
    promptCache.insert(prefix, loaded.caches);
  } finally {
    loaded.dispose();
  }
  return { promptCache, prefix };
}

const QUERY = "<query>";

/**
 * mlx_lm.generate's prompt with --prompt-cache-file: the cached tokens hold the start of the first
 * user message, so the prompt is the rendered chat from where that message's content begins (found
 * by rendering it with "<query>" in its place, without the template config, exactly as mlx_lm).
 */
export function renderAfterCachedPrefix(
  m: PromptModel,
  messages: ChatMessage[],
  at: number,
  opts: { addGenerationPrompt: boolean; continueFinalMessage: boolean; kwargs: Record<string, unknown> | null },
): string {
  const t = m.template!;
  const full = t.render(messages, {
    addGenerationPrompt: opts.addGenerationPrompt,
    continueFinalMessage: opts.continueFinalMessage,
    kwargs: templateKwargs(m.tokenizer, opts.kwargs),
  });
  const probe = messages.map((x, i) => (i === at ? { ...x, content: QUERY } : x));
  const test = t.render(probe, {
    addGenerationPrompt: opts.addGenerationPrompt,
    continueFinalMessage: opts.continueFinalMessage,
    kwargs: templateKwargs(m.tokenizer, null),
  });
  const i = test.indexOf(QUERY);
  if (i < 0) throw new UsageError("--prompt-cache-file: the chat template does not render the message content (cannot find where the cached prompt ends)");
  return full.slice(i);
}
