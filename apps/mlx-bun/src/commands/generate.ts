// mlx-bun generate: one prompt, like mlx_lm.generate. Text streams to stdout, stats to stderr;
// --json prints one JSON line for scripts instead.
import { readFileSync } from "node:fs";
import { memory } from "@mlx-bun/mlx-ffi";
import type { GenerationResult } from "@mlx-bun/runtime";
import { loadDraft, loadEngine } from "../load.ts";
import type { DraftOptions, ModelOptions, SamplingOptions } from "../options.ts";
import { samplingFrom } from "../options.ts";
import { expandEscapes, generatePromptIds } from "../prompt.ts";

export interface GenerateOptions extends ModelOptions, SamplingOptions, DraftOptions {
  prompt: string;
  ignoreChatTemplate?: boolean;
  systemPrompt?: string;
  chatTemplateConfig?: Record<string, unknown>;
  extraEosToken?: string[];
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
    ...(r.speculative ? { speculative: { drafted_tokens: r.speculative.drafted, accepted_tokens: r.speculative.accepted, acceptance_rate: r.speculative.drafted ? r.speculative.accepted / r.speculative.drafted : 0 } } : {}),
  };
}

export async function runGenerate(o: GenerateOptions): Promise<number> {
  const { engine, model } = await loadEngine(o, { progress: !o.json });
  let spec: Awaited<ReturnType<typeof loadDraft>>;
  try {
    spec = await loadDraft(o, engine, { progress: !o.json });
    const tok = engine.loaded.tokenizer;
    const text = o.prompt === "-" ? readFileSync(0, "utf8") : expandEscapes(o.prompt);
    const promptIds = generatePromptIds(engine.loaded, text, {
      ignoreChatTemplate: o.ignoreChatTemplate,
      ...(o.systemPrompt !== undefined ? { systemPrompt: o.systemPrompt } : {}),
      kwargs: o.chatTemplateConfig ?? null,
    });
    const stopTokenIds: number[] = [];
    for (const t of o.extraEosToken ?? []) {
      const id = tok.tokenToId(t);
      if (id === undefined) throw new Error(`--extra-eos-token ${JSON.stringify(t)} is not a token of this tokenizer`);
      stopTokenIds.push(id);
    }
    const abort = new AbortController();
    const onSigint = () => abort.abort();
    process.once("SIGINT", onSigint);
    const t0 = performance.now();
    const stream = (spec ?? engine).generate({
      promptIds,
      maxTokens: o.maxTokens,
      sampling: samplingFrom(o),
      ...(stopTokenIds.length ? { stopTokenIds } : {}),
      signal: abort.signal,
    });
    if (!o.json && o.verbose) process.stderr.write("==========\n");
    for await (const ev of stream) if (!o.json && ev.text) process.stdout.write(ev.text);
    const r = await stream.result;
    process.off("SIGINT", onSigint);
    const t = timings(r, (performance.now() - t0) / 1000);
    if (o.json) {
      const out = { model: model.id, prompt: text, prompt_ids: promptIds, generated_ids: r.tokens, text: r.text, finish_reason: r.finishReason, timings: t };
      process.stdout.write(`${JSON.stringify(out)}\n`);
    } else {
      process.stdout.write("\n");
      if (o.verbose) {
        process.stderr.write("==========\n");
        if (!r.text.length) process.stderr.write("No text generated for this prompt\n");
        process.stderr.write(`Prompt: ${t.prompt_tokens} tokens, ${t.prompt_tps.toFixed(3)} tokens-per-sec\n`);
        process.stderr.write(`Generation: ${t.generation_tokens} tokens, ${t.generation_tps.toFixed(3)} tokens-per-sec\n`);
        if (t.speculative) process.stderr.write(`Speculative: ${t.speculative.accepted_tokens} of ${t.speculative.drafted_tokens} draft tokens accepted (${(100 * t.speculative.acceptance_rate).toFixed(1)}%)\n`);
        process.stderr.write(`Peak memory: ${t.peak_memory_gb.toFixed(3)} GB\n`);
      }
    }
    return r.finishReason === "cancelled" ? 130 : 0;
  } finally {
    spec?.draft.dispose();
    engine.dispose();
  }
}
