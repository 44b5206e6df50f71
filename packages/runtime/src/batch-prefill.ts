// Batched prefill: several requests' prompts through the model together, as mlx-lm's
// PromptProcessingBatch does (right-padded chunks into batched caches, finalize moves the
// padding to the left), producing the left-padded batch caches a decode batch runs on.
import { evaluate, memory, MlxArray } from "@mlx-bun/mlx-ffi";
import { BatchKVCache, BatchRotatingKVCache, type Cache, KVCache, RotatingKVCache } from "@mlx-bun/kv-cache";
import { RequestError } from "./engine.ts";

/** The forward step and chunk size a batched prefill needs (an Engine provides both). */
export interface PrefillModel {
  readonly prefillStep: number;
  forward(ids: MlxArray, caches: Cache[]): MlxArray;
}

/**
 * One batched cache per layer from each row's single-sequence caches (mlx-lm's _merge_caches):
 * KVCache rows → BatchKVCache.merge, RotatingKVCache rows → BatchRotatingKVCache.merge. Rows of
 * different lengths (prompt-cache hits) are left-padded to the longest. The rows are not changed.
 */
export function mergeRows(rows: readonly (readonly Cache[])[]): Cache[] {
  if (rows.length === 0) throw new RequestError("mergeRows: no rows");
  const layers = rows[0]!.length;
  rows.forEach((r, i) => {
    if (r.length !== layers) throw new RequestError(`mergeRows: row ${i} has ${r.length} caches, row 0 has ${layers}`);
  });
  const out: Cache[] = [];
  try {
    for (let l = 0; l < layers; l++) {
      const col = rows.map((r) => r[l]!);
      if (col.every((c) => c instanceof KVCache)) out.push(BatchKVCache.merge(col));
      else if (col.every((c) => c instanceof RotatingKVCache)) out.push(BatchRotatingKVCache.merge(col));
      else throw new RequestError(`mergeRows: layer ${l} mixes or holds caches that cannot be batched (${col.map((c) => c.signature()).join(", ")})`);
    }
    return out;
  } catch (e) {
    for (const c of out) c.dispose();
    throw e;
  }
}

type Batched = BatchKVCache | BatchRotatingKVCache;

/**
 * Feed `tokens[b]` into row b of the batched `caches`, in chunks of `model.prefillStep` per row
 * (mlx-lm's PromptProcessingBatch.prompt, called once per chunk): see prefillChunk.
 */
export function prefillBatch(model: PrefillModel, caches: readonly Cache[], tokens: readonly (readonly number[])[], onChunk?: (done: number, total: number) => void): void {
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
 * One chunk of a batched prefill: `chunks[b]` goes into row b of the batched `caches`. The
 * shorter rows are right-padded with id 0 and that padding is declared
 * (`prepare({ lengths, rightPadding })`); after the forward step `finalize()` rolls each row's
 * padding to its left, the caches are evaluated and MLX's buffer cache is cleared. Padding is
 * never attended (masks hide it) and never counts against a sliding window
 * (BatchRotatingKVCache keeps valid tokens in the window). A row with an empty chunk takes the
 * whole chunk as padding.
 */
export function prefillChunk(model: PrefillModel, caches: readonly Cache[], chunks: readonly (readonly number[])[]): void {
  const batched = caches.map((c, i) => {
    if (!(c instanceof BatchKVCache || c instanceof BatchRotatingKVCache)) throw new RequestError(`prefillChunk: cache ${i} (${c.signature()}) is not a batched cache`);
    if (c.batchSize !== chunks.length) throw new RequestError(`prefillChunk: cache ${i} has ${c.batchSize} rows for ${chunks.length} prompts`);
    return c as Batched;
  });
  const B = chunks.length;
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
  // Evaluate the caches, not the logits (mlx-lm evaluates c.state).
  const states = batched.map((c) => c.state());
  try {
    evaluate(...states.flatMap((s) => s.tensors));
  } finally {
    for (const s of states) s[Symbol.dispose]();
  }
  memory.clearCache();
}

/**
 * Rows `rows` of batched `caches` as a batch of their own (each row extracted compact, then
 * merged: left-padded to the longest); `caches` are not changed.
 */
export function takeBatchRows(caches: readonly Cache[], rows: readonly number[]): Cache[] {
  const extracted: Cache[][] = rows.map(() => []);
  try {
    for (const c of caches) {
      if (!(c instanceof BatchKVCache || c instanceof BatchRotatingKVCache)) throw new RequestError(`takeBatchRows: ${c.signature()} is not a batched cache`);
      rows.forEach((r, i) => extracted[i]!.push(c.extract(r)));
    }
    return mergeRows(extracted);
  } finally {
    for (const e of extracted) for (const c of e) c.dispose();
  }
}
