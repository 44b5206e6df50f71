// The cache contract every layout implements, and the attention view it hands to models.
import { MlxError, type MlxArray } from "@mlx-bun/mlx-ffi";

/** An attention mask: none, the string "causal" (bottom-right aligned), or a boolean/additive array. */
export type Mask = "causal" | MlxArray | null;

/** Error for misuse of a cache (bad shapes, trim past offset, wrong restore state, missing capability). */
export class KvCacheError extends MlxError {
  override name = "KvCacheError";
}

/**
 * What `updateAndFetch` returns: the cache's fetched K/V for attention, owned
 * by the view (it stays valid when the cache grows or is disposed). KV-sharing
 * layers attend through their donor's view. Query and mask are borrowed; the
 * output is owned by the caller.
 */
export interface KvView extends Disposable {
  /** Tokens the view covers (valid positions, padding excluded). */
  readonly length: number;
  /** softmax(scale · q Kᵀ + mask) V, with q [B, Hq, L, D]; returns [B, Hq, L, Dv]. */
  attend(q: MlxArray, scale: number, mask: Mask, sinks?: MlxArray): MlxArray;
  /** The fetched planes as stored (K planes then V planes), borrowed from the view. */
  readonly planes: readonly MlxArray[];
  dispose(): void;
}

/** Scalars a cache's persisted state needs besides its tensors. */
export type CacheMeta = Record<string, number>;

/** A snapshot: tensors (owned by the snapshot) plus scalars. Slot order is documented per kind. */
export interface CacheState extends Disposable {
  readonly signature: string;
  readonly tensors: MlxArray[];
  readonly meta: CacheMeta;
}

/** The contract of every KV cache (see docs/kv-cache.md). */
export interface Cache extends Disposable {
  /** Tokens seen (the position of the next token). */
  readonly offset: number;
  /**
   * Batched caches: the RoPE position of the next token of each row (rows are left-padded, so
   * positions differ from `offset`); the model makes the int32 [B] array, once a step for every
   * layer at the same positions. Single-sequence caches leave it out and the position is `offset`.
   */
  positions?(): readonly number[];
  /** Prefixes shorter than this cannot be reused by trimming (an irreversible conversion happened). */
  minimumReusableOffset: number;
  /** Append k/v [B, H, L, D] and return the attention view over everything cached. */
  updateAndFetch(k: MlxArray, v: MlxArray): KvView;
  /** The mask for the next `n` query tokens, for a layer with sliding window `window` (null = none). */
  makeMask(n: number, window: number | null): Mask;
  /** A snapshot of the state (compact tensors + scalars); the caller owns it. */
  state(): CacheState;
  /** Adopt a snapshot (takes ownership of its tensors); checks kind, slot count and dtypes. */
  restoreState(state: CacheState): void;
  isTrimmable(): boolean;
  /** Whether `trim(n)` is exact now (a rotating window can trim after a wrap only in some states); absent = isTrimmable(). */
  canTrim?(n: number): boolean;
  /** Drop the last `n` tokens; returns how many were dropped. */
  trim(n: number): number;
  /** e.g. "kv:plain", "kv:quant:8:64", "kv:turboquant:4:3", "rotating:512:kv:plain". */
  signature(): string;
  /** Bytes one more token costs once shapes are known (0 before the first update). */
  bytesPerToken(): number;
  /** Bytes held now. */
  readonly nbytes: number;
  dispose(): void;
}

export function fail(msg: string): never {
  throw new KvCacheError(msg);
}

/** The checks every cache's trim makes: a count in [0, held], and no trim past a wrapped window. */
export function checkTrim(op: string, n: number, held: number, wrapped = false): void {
  if (!Number.isInteger(n) || n < 0) fail(`${op}: n must be a non-negative integer, got ${n}`);
  if (n > held) fail(`${op}: cannot trim ${n} tokens from a ${op.startsWith("Batch") ? "batch" : "cache"} holding ${held}`);
  if (wrapped && n > 0) fail(`${op}: the window has wrapped (offset ${held}); older tokens are gone`);
}
