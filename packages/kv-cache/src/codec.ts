// The codec interface (how K/V become stored planes and how attention reads them) and the plain codec.
import { type Dtype, itemSize, type MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { denseDecodeAttention } from "./kernels/dense-decode.ts";
import { disposeAll } from "./planes.ts";
import { type KvView, type Mask, fail } from "./types.ts";

/** Shapes a codec needs to size a token (for memory budgets before any update). */
export interface KvShape {
  batch: number;
  kvHeads: number;
  kHeadDim: number;
  vHeadDim: number;
  dtype: Dtype;
}

/**
 * A codec turns K/V chunks into planes [B, H, L, x] (K planes first) and reads
 * fetched planes back in attention. Layouts move planes around without
 * knowing what they hold, so every layout works with every codec.
 */
export interface KvCodec {
  /** Signature part, e.g. "kv:plain", "kv:quant:8:64". */
  readonly name: string;
  readonly kPlanes: number;
  readonly vPlanes: number;
  /** Encode k [B, H, L, Dk] and v [B, H, L, Dv]; the caller owns the planes. */
  encode(k: MlxArray, v: MlxArray): MlxArray[];
  /** A view over fetched planes (takes ownership of them). */
  view(planes: MlxArray[], length: number): KvView;
  /** Exact stored bytes per token for these shapes. */
  bytesPerToken(shape: KvShape): number;
  /** Check a head dim (and other shape facts) this codec supports; throws a clear error otherwise. */
  check(k: MlxArray, v: MlxArray): void;
}

/** A view that owns its planes and attends with `fn`. */
export class PlanesView implements KvView {
  #planes: MlxArray[] | null;
  constructor(
    planes: MlxArray[],
    readonly length: number,
    private readonly fn: (planes: readonly MlxArray[], q: MlxArray, scale: number, mask: Mask, sinks?: MlxArray) => MlxArray,
  ) {
    this.#planes = planes;
  }
  get planes(): readonly MlxArray[] {
    if (!this.#planes) fail("KvView used after dispose()");
    return this.#planes;
  }
  attend(q: MlxArray, scale: number, mask: Mask, sinks?: MlxArray): MlxArray {
    return this.fn(this.planes, q, scale, mask, sinks);
  }
  dispose(): void {
    disposeAll(this.#planes);
    this.#planes = null;
  }
  [Symbol.dispose](): void {
    this.dispose();
  }
}

export function checkKv(op: string, k: MlxArray, v: MlxArray): void {
  if (k.ndim !== 4 || v.ndim !== 4) fail(`${op}: keys and values must be [B, H, L, D], got ${k.describe()} and ${v.describe()}`);
  for (let i = 0; i < 3; i++) {
    if (k.shape[i] !== v.shape[i]) fail(`${op}: keys ${k.describe()} and values ${v.describe()} differ in B, H or L`);
  }
}

/** Stores K/V as they come (bf16/fp16/fp32); attention is fast SDPA (or, opted in, the split-K decode kernel). */
export const plainCodec: KvCodec = {
  name: "kv:plain",
  kPlanes: 1,
  vPlanes: 1,
  encode: (k, v) => [k.retain(), v.retain()],
  view: (planes, length) =>
    new PlanesView(
      planes,
      length,
      ([k, v], q, scale, mask, sinks) =>
        (sinks ? null : denseDecodeAttention(q, k!, v!, scale, mask)) ??
        // On CUDA (MLX_BUN_SDPA_DECODE), one decode token's attention at MLX's rounding points in two launches.
        (!sinks && mask === null ? mx.kernels.sdpa_decode(q, k!, v!, scale) : null) ??
        // With the exact launch reductions on (MLX_BUN_EXACT_NORMS), MLX's composition less its ×1.
        (!sinks && mask === null && mx.kernels.exact_norms_enabled() ? mx.kernels.sdpa_unit_scale(q, k!, v!, scale) : null) ??
        mx.fast.scaled_dot_product_attention(q, k!, v!, { scale, mask, ...(sinks ? { sinks } : {}) }),
    ),
  bytesPerToken: (s) => s.batch * s.kvHeads * (s.kHeadDim + s.vHeadDim) * itemSize(s.dtype),
  check: (k, v) => checkKv("KVCache.updateAndFetch", k, v),
};
