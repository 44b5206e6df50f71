// Prefill: prompts through the model in chunks. Several requests go together as mlx-lm's
// PromptProcessingBatch does (right-padded chunks into batched caches, finalize moves the padding
// to the left); one request on single-sequence caches as mlx-lm's generate_step prefill.
import { evaluate, memory, MlxArray } from "@mlx-bun/mlx-ffi";
import { asBatchCache, type Cache, isBatchCache } from "@mlx-bun/kv-cache";
import { RequestError } from "./request.ts";

/** The forward step and chunk size a batched prefill needs (an Engine provides both). */
export interface PrefillModel {
  readonly prefillStep: number;
  forward(ids: MlxArray, caches: Cache[]): MlxArray;
}

/**
 * Feed `tokens[b]` into row b of the batched `caches`, in chunks of `model.prefillStep` per row
 * (mlx-lm's PromptProcessingBatch.prompt, called once per chunk): see prefillChunk.
 */
export function prefillBatch(
  model: PrefillModel,
  caches: readonly Cache[],
  tokens: readonly (readonly number[])[],
  onChunk?: (done: number, total: number) => void,
): void {
  const step = model.prefillStep;
  const longest = Math.max(0, ...tokens.map((t) => t.length));
  for (let start = 0; start < longest; start += step) {
    prefillChunk(
      model,
      caches,
      tokens.map((t) => t.slice(start, start + step)),
    );
    onChunk?.(Math.min(start + step, longest), longest);
  }
}

/**
 * One chunk of a prefill: `chunks[b]` goes into row b of `caches` (batched caches, or
 * single-sequence caches for one chunk). The shorter rows are right-padded with id 0 and that
 * padding is declared (`prepare({ lengths, rightPadding })`); after the forward step
 * `finalize()` rolls each row's padding to its left, the caches are evaluated (mlx-lm evaluates
 * c.state) and MLX's buffer cache is cleared. Padding is never attended (masks hide it) and never
 * counts against a sliding window (BatchRotatingKVCache keeps valid tokens in the window). A row
 * with an empty chunk takes the whole chunk as padding.
 */
export function prefillChunk(model: PrefillModel, caches: readonly Cache[], chunks: readonly (readonly number[])[]): void {
  const B = chunks.length;
  const solo = B === 1 && !caches.some(isBatchCache);
  const batched = solo
    ? []
    : caches.map((c, i) => {
        const b = asBatchCache(`prefillChunk (cache ${i})`, c);
        if (b.batchSize !== B) throw new RequestError(`prefillChunk: cache ${i} has ${b.batchSize} rows for ${B} prompts`);
        return b;
      });
  const lengths = chunks.map((c) => c.length);
  const n = Math.max(0, ...lengths);
  if (n === 0) return;
  const padding = lengths.map((l) => n - l);
  const padded = Math.max(...padding) > 0;
  const ids = new Array<number>(B * n).fill(0);
  chunks.forEach((c, b) => c.forEach((t, j) => (ids[b * n + j] = t)));
  if (padded) for (const c of batched) c.prepare({ lengths, rightPadding: padding });
  {
    using x = MlxArray.fromNumbers(ids, [B, n], "int32");
    using logits = model.forward(x, caches as Cache[]);
    void logits;
  }
  if (padded) for (const c of batched) c.finalize();
  const states = caches.map((c) => c.state());
  try {
    evaluate(...states.flatMap((s) => s.tensors));
  } finally {
    for (const s of states) s[Symbol.dispose]();
  }
  memory.clearCache();
}
