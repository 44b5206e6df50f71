// Batches from single-sequence caches and back: one batched cache per layer (mlx-lm's
// _merge_caches), the batch of some rows of a batch, and the solo caches of a batch of one.
import { BatchKVCache } from "./batch.ts";
import { BatchRotatingKVCache } from "./batch-rotating.ts";
import { asBatchCache, type BatchCache } from "./batch-cache.ts";
import { KVCache } from "./growable.ts";
import { PrefillRow } from "./prefill-row.ts";
import { RotatingKVCache } from "./rotating.ts";
import { type Cache, fail } from "./types.ts";

/** One batch from the caches of one layer, one per row: KVCache (or PrefillRow) rows → BatchKVCache, RotatingKVCache rows → BatchRotatingKVCache. */
export function mergeBatch(rows: readonly Cache[]): BatchCache {
  if (rows.length === 0) fail("mergeBatch: no rows");
  if (rows.every((c) => c instanceof KVCache || c instanceof PrefillRow)) return BatchKVCache.merge(rows);
  if (rows.every((c) => c instanceof RotatingKVCache)) return BatchRotatingKVCache.merge(rows);
  return fail(`mergeBatch: the rows mix or hold caches that cannot be batched (${rows.map((c) => c.signature()).join(", ")})`);
}

/**
 * One batched cache per layer from each row's per-layer caches, left-padded to the longest
 * row. The rows are not changed.
 */
export function mergeRows(rows: readonly (readonly Cache[])[]): BatchCache[] {
  if (rows.length === 0) fail("mergeRows: no rows");
  const layers = rows[0]!.length;
  rows.forEach((r, i) => {
    if (r.length !== layers) fail(`mergeRows: row ${i} has ${r.length} caches, row 0 has ${layers}`);
  });
  const out: BatchCache[] = [];
  try {
    for (let l = 0; l < layers; l++) {
      try {
        out.push(mergeBatch(rows.map((r) => r[l]!)));
      } catch (e) {
        if (e instanceof Error) e.message = `layer ${l}: ${e.message}`;
        throw e;
      }
    }
    return out;
  } catch (e) {
    for (const c of out) c.dispose();
    throw e;
  }
}

/** Rows `rows` of batched `caches` as a batch of their own (each row extracted compact, then merged); `caches` are not changed. */
export function takeBatchRows(caches: readonly Cache[], rows: readonly number[]): BatchCache[] {
  const extracted: Cache[][] = rows.map(() => []);
  try {
    for (const c of caches) {
      const b = asBatchCache("takeBatchRows", c);
      rows.forEach((r, i) => extracted[i]!.push(b.extract(r)));
    }
    return mergeRows(extracted);
  } finally {
    for (const e of extracted) for (const c of e) c.dispose();
  }
}
