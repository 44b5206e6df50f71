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
  type QuantTriple,
} from "./affine.ts";
export { TURBO_K_BITS, TURBO_K_GROUP, TURBO_V_BITS, turboQuantCodec, type TurboQuantCodec, type TurboQuantOptions } from "./turboquant.ts";
export { KVCache, makeState } from "./growable.ts";
export { RotatingKVCache } from "./rotating.ts";
export { createCausalMask, linearMask } from "./mask.ts";
export { toAffine, toTurboQuant } from "./convert.ts";
export { BatchKVCache, type PrepareOptions } from "./batch.ts";
export { BatchRotatingKVCache } from "./batch-rotating.ts";
export { PrefillRow, type RowPadding } from "./prefill-row.ts";
export { paddedCausalMask, rollRows } from "./rows.ts";
export { turboValues, turboValuesKernel } from "./kernels/turbo-values.ts";
export { AFFINE_DECODE_BITS, affineDecodeAttention, affineDecodeKernel } from "./kernels/affine-decode.ts";
export { TURBO_DECODE_K_BITS, turboDecodeAttention, turboDecodeKernel } from "./kernels/turbo-decode.ts";
export { combinePartials, decodeCombineKernel } from "./kernels/decode-combine.ts";
export { DECODE_MAX_DIM, DECODE_WARPS, type DecodePlan, decodeMask, decodePlan } from "./kernels/decode-plan.ts";
