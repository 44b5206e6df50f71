// mlx-bun generate: one prompt, like mlx_lm.generate (same flags, same prompt, same tokens). Text
// streams to stdout, stats to stderr; --json prints one JSON line for scripts instead.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { memory } from "@mlx-bun/mlx-ffi";
import type { ChatMessage } from "@mlx-bun/models";
import type { Engine, GenerateRequest, GenerationResult, GenerationStream, KvStoreInfo, PromptCache, Scheduler } from "@mlx-bun/runtime";
import { adapterLayers, loadDraft, loadEngine, noteNoOps } from "../load.ts";
import type { DraftOptions, ModelOptions, SamplingOptions } from "../options.ts";
import { samplingFrom, UsageError } from "../options.ts";
import { expandEscapes, type PromptModel, rawPromptIds, templateKwargs } from "../prompt.ts";
import { ApiError } from "../server/errors.ts";
import { expandPromptImages, imageSupportFor, loadRequestImages } from "../server/images.ts";
import { mlxLmLoadDraws } from "./mlx-lm-seed.ts";
import { cacheFromFile, kvForCacheFile, loadCacheFile, modelForCacheFile, readCacheFileInfo, renderAfterCachedPrefix } from "./prompt-cache-file.ts";

export interface GenerateOptions extends ModelOptions, SamplingOptions, DraftOptions {
  prompt: string;
  image?: string[];
  prefillResponse?: string;
  ignoreChatTemplate?: boolean;
  useDefaultChatTemplate?: boolean;
  systemPrompt?: string;
  chatTemplateConfig?: Record<string, unknown>;
  extraEosToken?: string[];
  promptCacheFile?: string;
  quantizeActivations?: boolean;
  json?: boolean;
  verbose: boolean;
}

/** Timings in the shape of mlx-lm's GenerationResponse (prompt_tps, generation_tps) plus ours. */
export function timings(r: GenerationResult, totalSeconds: number) {
  const n = r.tokens.length;
  const prefilled = r.promptTokens - r.cachedTokens;
  return {
    prompt_tokens: r.promptTokens,
    cached_tokens: r.cachedTokens,
    generation_tokens: n,
    // mlx-lm: prompt tokens over the time to the first token; generated tokens over the time after it.
    prompt_tps: r.ttft > 0 ? prefilled / r.ttft : 0,
    generation_tps: r.decodeSeconds > 0 ? n / r.decodeSeconds : 0,
    ttft_s: r.ttft,
    decode_s: r.decodeSeconds,
    total_s: totalSeconds,
    peak_memory_gb: memory.peak() / 1e9,
    ...(r.speculative
      ? {
          speculative: {
            drafted_tokens: r.speculative.drafted,
            accepted_tokens: r.speculative.accepted,
            acceptance_rate: r.speculative.drafted ? r.speculative.accepted / r.speculative.drafted : 0,
          },
        }
      : {}),
  };
}

/**
 * mlx_lm.generate's prompt ids: the chat template (system prompt, user message, and with
 * --prefill-response an assistant message to continue) unless ignored or absent, tokenized without
 * a second <bos>; else the raw text with <bos>. With a prompt cache, only the part after the
 * cached start of the message (renderAfterCachedPrefix).
 */
export function generatePrompt(
  m: PromptModel,
  text: string,
  o: Pick<GenerateOptions, "ignoreChatTemplate" | "systemPrompt" | "chatTemplateConfig" | "prefillResponse">,
  cached: boolean,
  imageCount = 0,
): number[] {
  if (o.ignoreChatTemplate || !m.template) {
    if (imageCount) throw new UsageError("--image needs the chat template (it places the image placeholders): drop --ignore-chat-template");
    return rawPromptIds(m, text);
  }
  const messages: ChatMessage[] = [];
  if (o.systemPrompt !== undefined) messages.push({ role: "system", content: o.systemPrompt });
  // As mlx_vlm.generate for Gemma 4 (prompt_utils LIST_WITH_IMAGE_TYPE_TEXT): the images, then the text.
  const images = Array.from({ length: imageCount }, () => ({ type: "image" }));
  messages.push({ role: "user", content: imageCount ? [...images, { type: "text", text }] : text });
  const prefill = o.prefillResponse !== undefined;
  if (prefill) messages.push({ role: "assistant", content: o.prefillResponse! });
  const flags = { addGenerationPrompt: !prefill, continueFinalMessage: prefill, kwargs: o.chatTemplateConfig ?? null };
  const rendered = cached
    ? renderAfterCachedPrefix(m, messages, messages.length - 1, flags)
    : m.template.render(messages, {
        addGenerationPrompt: flags.addGenerationPrompt,
        continueFinalMessage: flags.continueFinalMessage,
        kwargs: templateKwargs(m.tokenizer, flags.kwargs),
      });
  return m.tokenizer.encode(rendered, { addSpecialTokens: false });
}

/** mlx_lm's add_eos_token: a token id (an integer) or a token of the vocabulary. */
export function eosTokenId(tok: { tokenToId(t: string): number | undefined; vocabSize: number }, t: string, flag: string): number {
  if (/^\d+$/.test(t)) {
    const id = Number(t);
    if (id >= tok.vocabSize) throw new UsageError(`${flag} ${t}: token id outside the vocabulary (0..${tok.vocabSize - 1})`);
    return id;
  }
  const id = tok.tokenToId(t);
  if (id === undefined) throw new UsageError(`${flag} ${JSON.stringify(t)} is not a token of this tokenizer`);
  return id;
}

/** --quantize-activations: as mlx_lm, nothing to do without quantized layers; an error for the others. */
export function checkQuantizeActivations(quant: { mode: string; overrides: Map<string, { mode: string } | false> } | null): void {
  if (!quant) return; // no QuantizedLinear: mlx_lm changes nothing either
  const modes = new Set([quant.mode, ...[...quant.overrides.values()].flatMap((q) => (q ? [q.mode] : []))]);
  const other = [...modes].filter((m) => m !== "nvfp4" && m !== "mxfp8");
  if (other.length)
    throw new UsageError(
      `--quantize-activations: this checkpoint's layers are ${other.join(", ")}-quantized; only nvfp4 and mxfp8 layers support activation quantization (mlx_lm refuses them too)`,
    );
  throw new UsageError("--quantize-activations: activation quantization of nvfp4/mxfp8 layers (mlx's QQLinear, mx.qqmm) is not implemented in mlx-bun");
}

export async function runGenerate(o: GenerateOptions): Promise<number> {
  if (o.image?.length && o.promptCacheFile !== undefined) throw new UsageError("--image with --prompt-cache-file: image prompts do not use the prompt cache");
  if (o.image?.length && o.draftModel) throw new UsageError("--image with --draft-model: image prompts are not decoded speculatively");
  let info: KvStoreInfo | undefined;
  if (o.promptCacheFile !== undefined) {
    if (o.draftModel) throw new UsageError("--prompt-cache-file with --draft-model: the file holds no draft-model caches");
    info = await readCacheFileInfo(o.promptCacheFile);
  }
  const progress = !o.json;
  const model = info ? await modelForCacheFile(o, info, progress) : undefined;
  const { engine, model: resolved } = await loadEngine(o, { progress, ...(info ? { fileKv: kvForCacheFile(info, o) } : {}), ...(model ? { model } : {}) });
  let spec: Awaited<ReturnType<typeof loadDraft>>;
  let scheduler: Scheduler | undefined;
  let promptCache: PromptCache | undefined;
  try {
    noteNoOps(o);
    if (o.quantizeActivations) checkQuantizeActivations(engine.loaded.config.quantization);
    spec = await loadDraft(o, engine, { progress });
    const tok = engine.loaded.tokenizer;
    // As mlx_lm: escapes expanded first, then "-" means stdin.
    const expanded = expandEscapes(o.prompt);
    const text = expanded === "-" ? readFileSync(0, "utf8") : expanded;
    const images = o.image?.length ? await cliImages(engine, resolved.id, o.image) : null;
    const rendered = generatePrompt(engine.loaded, text, o, info !== undefined, images?.images.length ?? 0);
    const ids = images ? expandPromptImages(rendered, images.images, images.tokens) : rendered;
    const stopTokenIds = (o.extraEosToken ?? []).map((t) => eosTokenId(tok, t, "--extra-eos-token"));
    // mlx_lm.generate builds the tokenizer with the file's tokenizer_config (cache_prompt --eos-token).
    const fileEos = info?.tokenizerConfig?.eos_token;
    if (typeof fileEos === "string") stopTokenIds.push(eosTokenId(tok, fileEos, `${o.promptCacheFile}: tokenizer_config.eos_token`));
    let promptIds = ids;
    if (info) {
      const loaded = await loadCacheFile(engine, o.promptCacheFile!);
      const c = await cacheFromFile(loaded);
      promptCache = c.promptCache;
      promptIds = [...c.prefix, ...ids];
      const { Scheduler } = await import("@mlx-bun/runtime");
      scheduler = new Scheduler(engine, { maxBatch: 1, prefillBatch: 1, memoryBudgetBytes: Number.POSITIVE_INFINITY, promptCache });
    }
    const abort = new AbortController();
    const onSigint = () => abort.abort();
    process.once("SIGINT", onSigint);
    const t0 = performance.now();
    const req: GenerateRequest = {
      promptIds,
      maxTokens: o.maxTokens,
      // With --seed, the draws mlx_lm.generate makes: its model constructors took keys first (target, then draft).
      sampling: {
        ...samplingFrom(o),
        ...(o.seed !== undefined
          ? { seedSkip: mlxLmLoadDraws(engine.loaded, adapterLayers.get(engine)) + (spec?.draftEngine ? mlxLmLoadDraws(spec.draftEngine.loaded) : 0) }
          : {}),
      },
      // mlx_lm prints the detokenizer's text, special tokens included.
      keepSpecialTokens: true,
      ...(images ? { images: images.images } : {}),
      ...(stopTokenIds.length ? { stopTokenIds } : {}),
      signal: abort.signal,
    };
    const stream: GenerationStream = scheduler ? scheduler.submit(req) : (spec ?? engine).generate(req);
    if (!o.json && o.verbose) process.stderr.write("==========\n");
    for await (const ev of stream) if (!o.json && ev.text) process.stdout.write(ev.text);
    const r = await stream.result;
    process.off("SIGINT", onSigint);
    const t = timings(r, (performance.now() - t0) / 1000);
    if (o.json) {
      const out = { model: resolved.id, prompt: text, prompt_ids: ids, generated_ids: r.tokens, text: r.text, finish_reason: r.finishReason, timings: t };
      process.stdout.write(`${JSON.stringify(out)}\n`);
    } else {
      process.stdout.write("\n");
      if (o.verbose) {
        process.stderr.write("==========\n");
        if (!r.text.length) process.stderr.write("No text generated for this prompt\n");
        process.stderr.write(`Prompt: ${t.prompt_tokens - t.cached_tokens} tokens, ${t.prompt_tps.toFixed(3)} tokens-per-sec\n`);
        process.stderr.write(`Generation: ${t.generation_tokens} tokens, ${t.generation_tps.toFixed(3)} tokens-per-sec\n`);
        if (t.speculative)
          process.stderr.write(
            `Speculative: ${t.speculative.accepted_tokens} of ${t.speculative.drafted_tokens} draft tokens accepted (${(100 * t.speculative.acceptance_rate).toFixed(1)}%)\n`,
          );
        process.stderr.write(`Peak memory: ${t.peak_memory_gb.toFixed(3)} GB\n`);
      }
    }
    return r.finishReason === "cancelled" ? 130 : 0;
  } finally {
    await scheduler?.close();
    promptCache?.dispose();
    spec?.draft.dispose();
    engine.dispose();
  }
}

/**
 * --image files or URLs (as mlx_vlm.generate's --image: local paths, file:, data: and http(s)
 * URLs), read, decoded and preprocessed as the server's image_url parts are (server/images.ts).
 */
async function cliImages(engine: Engine, modelId: string, files: readonly string[]) {
  const support = imageSupportFor(engine.loaded, { allowRemote: true });
  if (!support) throw new UsageError(`--image: the model '${modelId}' has no vision tower: it does not take images`);
  const items = files.map((f) => ({ type: "image", url: /^[a-z][a-z0-9+.-]*:/i.test(f) ? f : resolve(f), param: `--image ${f}` }));
  try {
    const images = await loadRequestImages([{ role: "user", content: items }], support, modelId);
    return { images, tokens: support.tokens };
  } catch (e) {
    if (e instanceof ApiError) throw new UsageError(e.message);
    throw e;
  }
}
