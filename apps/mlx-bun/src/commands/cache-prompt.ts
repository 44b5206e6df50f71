// mlx-bun cache-prompt: mlx_lm.cache_prompt. Runs a prompt through the model and saves its KV
// caches in mlx-lm's save_prompt_cache format (with our extras), for --prompt-cache-file of
// generate, chat and serve, and of mlx_lm.generate.
import { readFileSync } from "node:fs";
import { memory, MlxArray } from "@mlx-bun/mlx-ffi";
import { savePromptCache } from "@mlx-bun/runtime";
import { loadEngine, noteNoOps } from "../load.ts";
import type { ModelOptions } from "../options.ts";
import { templateKwargs } from "../prompt.ts";
import { eosTokenId } from "./generate.ts";

export interface CachePromptOptions extends ModelOptions {
  prompt: string;
  promptCacheFile: string;
  eosToken?: string;
}

export async function runCachePrompt(o: CachePromptOptions): Promise<number> {
  const { engine, model } = await loadEngine(o);
  try {
    noteNoOps(o);
    const tok = engine.loaded.tokenizer;
    if (o.eosToken !== undefined) eosTokenId(tok, o.eosToken, "--eos-token");
    const text = o.prompt === "-" ? readFileSync(0, "utf8") : o.prompt;
    // As mlx_lm.cache_prompt: the user message left open (continue_final_message), else the raw text with <bos>.
    const t = engine.loaded.template;
    const ids = t
      ? t.apply(tok, [{ role: "user", content: text }], { addGenerationPrompt: false, continueFinalMessage: true, kwargs: templateKwargs(tok, null) })
      : tok.encode(text, { addSpecialTokens: true });
    if (!ids.length) throw new Error("--prompt: nothing to cache (the prompt has no tokens)");
    const caches = engine.makeCaches();
    try {
      const start = performance.now();
      let width = 0;
      const progress = (done: number): void => {
        const speed = done / Math.max((performance.now() - start) / 1000, 1e-9);
        const msg = `\rProcessed ${String(done).padStart(6)} tokens (${speed.toFixed(2).padStart(6)} tok/s)`;
        width = Math.max(width, msg.length);
        process.stdout.write(msg.padEnd(width));
      };
      // mlx_lm runs generate_step with max_tokens=0: all but the last token in prefill chunks, then the last one.
      const rest = engine.prefill(ids, caches, 1, progress);
      using last = MlxArray.fromNumbers(rest, [1, rest.length], "int32");
      engine.forward(last, caches).dispose();
      progress(ids.length);
      process.stdout.write(`\nPeak memory: ${(memory.peak() / 1e9).toFixed(3)} GB\nSaving...\n`);
      const saved = savePromptCache(o.promptCacheFile, {
        fingerprint: engine.loaded.fingerprint,
        caches,
        tokens: ids,
        // mlx_lm.generate loads this model when no --model is given (the path as given, or the bundled model's directory).
        model: model.source === "bundled" ? model.dir : model.id,
        tokenizerConfig: { trust_remote_code: Boolean(o.trustRemoteCode), ...(o.eosToken !== undefined ? { eos_token: o.eosToken } : {}) },
      });
      process.stdout.write(
        `Saved ${saved.offset} tokens to ${o.promptCacheFile} (${saved.bytes} bytes${saved.mlxLmReadable ? "" : "; KV mode without an mlx-lm class: readable by mlx-bun only"})\n`,
      );
    } finally {
      for (const c of caches) c.dispose();
    }
    return 0;
  } finally {
    engine.dispose();
  }
}
