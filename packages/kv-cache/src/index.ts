/**
 * @mlx-bun/kv-cache: KV caches for mlx-bun. Layouts (growable KVCache, RotatingKVCache)
 * are separate from codecs (plain, affine, TurboQuant); attention goes through the view
 * `updateAndFetch` returns, so a model never switches on the cache class.
 */
export { type Cache, type CacheMeta, type CacheState, type KvView, type Mask, KvCacheError } from "./types.ts";
export { type KvCodec, type KvShape, PlanesView, plainCodec } from "./codec.ts";
export {
  AFFINE_BITS,
  AFFINE_GROUPS,
  DEFAULT_QUERY_TILE,
  affineCodec,
  quantizedAttention,
  quantizedKeyAttention,
  tiledAttention,
} from "./affine.ts";
export { type KvPrefillSetting, PREFILL_SDPA_MIN_QUERIES, kvPrefill, setKvPrefill, setPrefillScoreBudget } from "./prefill-attention.ts";
export { type DenseDecodeSetting, denseDecode, setDenseDecode } from "./kernels/dense-decode.ts";
export type { QuantTriple } from "./quant-triple.ts";
export {
  setTurboEncode,
  TURBO_K_BITS,
  TURBO_K_GROUP,
  TURBO_V_BITS,
  type TurboEncodeSetting,
  turboQuantCodec,
  type TurboQuantCodec,
  type TurboQuantOptions,
} from "./turboquant.ts";
export { KVCache, makeState } from "./growable.ts";
export { RotatingKVCache } from "./rotating.ts";
export { createCausalMask, linearMask } from "./mask.ts";
export { toAffine, toTurboQuant } from "./convert.ts";
export { QuantizeAfterKVCache } from "./quantize-after.ts";
export { asBatchCache, type BatchCache, isBatchCache, type PrepareOptions } from "./batch-cache.ts";
export { BatchKVCache } from "./batch.ts";
export { mergeBatch, mergeRows, takeBatchRows } from "./batch-merge.ts";
export { BatchRotatingKVCache } from "./batch-rotating.ts";
export { PrefillRow, type RowPadding } from "./prefill-row.ts";
export { paddedCausalMask, rollRows } from "./rows.ts";
