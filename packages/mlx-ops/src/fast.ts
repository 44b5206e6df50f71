// mx.fast: fused normalization, rotary embedding and attention.
import { FFIType } from "bun:ffi";
import { MlxArray, MlxError, type Stream } from "@mlx-bun/mlx-ffi";
import { bindOps, result, sh } from "./native.ts";

const { ptr, i32, f64 } = FFIType;
const lib = bindOps({
  mlxb_fast_rms_norm: { args: [ptr, ptr, f64, ptr], returns: ptr },
  mlxb_fast_layer_norm: { args: [ptr, ptr, ptr, f64, ptr], returns: ptr },
  mlxb_fast_rope: { args: [ptr, i32, i32, i32, f64, f64, i32, ptr, ptr], returns: ptr },
  mlxb_fast_rope_offsets: { args: [ptr, i32, i32, i32, f64, f64, ptr, ptr, ptr], returns: ptr },
  mlxb_fast_sdpa: { args: [ptr, ptr, ptr, f64, i32, ptr, ptr, ptr], returns: ptr },
});

/** mx.fast.rms_norm over the last axis; `weight` (shape [D]) is optional. */
function rms_norm(x: MlxArray, weight: MlxArray | null | undefined, eps: number, s?: Stream): MlxArray {
  return result("fast.rms_norm", lib().mlxb_fast_rms_norm(x.handle, weight?.handle ?? null, eps, sh(s)), [x, weight ?? "weight=None", () => `eps=${eps}`]);
}

/** mx.fast.layer_norm over the last axis; weight and bias (shape [D]) are optional. */
function layer_norm(x: MlxArray, weight: MlxArray | null | undefined, bias: MlxArray | null | undefined, eps: number, s?: Stream): MlxArray {
  return result("fast.layer_norm", lib().mlxb_fast_layer_norm(x.handle, weight?.handle ?? null, bias?.handle ?? null, eps, sh(s)), [
    x,
    weight ?? "weight=None",
    bias ?? "bias=None",
    () => `eps=${eps}`,
  ]);
}

export interface RopeOptions {
  /** Rotate consecutive pairs (GPT-J style) instead of the two halves. */
  traditional: boolean;
  /** Frequency base; give exactly one of `base` and `freqs`. */
  base?: number;
  /** Custom inverse frequencies, shape [dims / 2] (e.g. Llama-3 / proportional RoPE). */
  freqs?: MlxArray;
  /** Position scale (default 1). */
  scale?: number;
  /** Position of the first row: a number, or an array (a scalar, or one offset per batch row). */
  offset?: number | MlxArray;
  stream?: Stream;
}

/** mx.fast.rope on input (B, *, T, D); the first `dims` features are rotated. */
function rope(x: MlxArray, dims: number, opts: RopeOptions): MlxArray {
  const { traditional, base, freqs, scale = 1, offset = 0 } = opts;
  if ((base === undefined) === (freqs === undefined)) {
    throw new MlxError(`fast.rope(${x.describe()}, dims=${dims}): give exactly one of base and freqs`);
  }
  if (!Number.isInteger(dims)) throw new MlxError(`fast.rope(${x.describe()}): dims must be an integer, got ${dims}`);
  const desc = [x, () => `dims=${dims}`, () => `traditional=${traditional}`, base === undefined ? freqs! : () => `base=${base}`, () => `scale=${scale}`];
  const hasBase = base === undefined ? 0 : 1;
  const l = lib();
  if (offset instanceof MlxArray) {
    return result(
      "fast.rope",
      l.mlxb_fast_rope_offsets(x.handle, dims, traditional ? 1 : 0, hasBase, base ?? 0, scale, offset.handle, freqs?.handle ?? null, sh(opts.stream)),
      [...desc, offset],
    );
  }
  if (!Number.isInteger(offset)) throw new MlxError(`fast.rope(${x.describe()}): offset must be an integer, got ${offset}`);
  return result("fast.rope", l.mlxb_fast_rope(x.handle, dims, traditional ? 1 : 0, hasBase, base ?? 0, scale, offset, freqs?.handle ?? null, sh(opts.stream)), [
    ...desc,
    () => `offset=${offset}`,
  ]);
}

/** The attention mask: none, "causal" (lower-right aligned), or a boolean / additive array. */
export type AttentionMask = "causal" | MlxArray | null | undefined;

export interface SdpaOptions {
  scale: number;
  mask?: AttentionMask;
  /** Attention sinks, one logit per query head. */
  sinks?: MlxArray;
  stream?: Stream;
}

/**
 * mx.fast.scaled_dot_product_attention: softmax(scale · Q Kᵀ + mask) V over q [B, Nq, Tq, D],
 * k/v [B, Nkv, Tkv, D] (grouped-query when Nq is a multiple of Nkv).
 */
function scaled_dot_product_attention(q: MlxArray, k: MlxArray, v: MlxArray, opts: SdpaOptions): MlxArray {
  const { scale, mask, sinks } = opts;
  let mode = 0;
  if (mask === "causal") mode = 1;
  else if (mask instanceof MlxArray) mode = 2;
  else if (mask !== undefined && mask !== null)
    throw new MlxError(`fast.scaled_dot_product_attention: mask must be "causal", an array or null, got ${String(mask)}`);
  return result(
    "fast.scaled_dot_product_attention",
    lib().mlxb_fast_sdpa(q.handle, k.handle, v.handle, scale, mode, mask instanceof MlxArray ? mask.handle : null, sinks?.handle ?? null, sh(opts.stream)),
    [q, k, v, () => `scale=${scale}`, mask instanceof MlxArray ? mask : () => `mask=${mask ?? "None"}`, ...(sinks ? [sinks] : [])],
  );
}

/** mx.fast */
export const fast = {
  rms_norm,
  layer_norm,
  rope,
  scaled_dot_product_attention,
} as const;
