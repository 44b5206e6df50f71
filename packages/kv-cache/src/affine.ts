// Affine-quantized codec (mlx-lm's QuantizedKVCache storage) and its unfused attention.
import { itemSize, type MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { checkKv, type KvCodec, PlanesView } from "./codec.ts";
import { affineDecodeAttention } from "./kernels/affine-decode.ts";
import { prefillTakesSdpa, sdpaOverDecoded } from "./prefill-attention.ts";
import type { QuantTriple } from "./quant-triple.ts";
import { type Mask, fail } from "./types.ts";

/** Queries per tile in the tiled prefill path: bounds the [L, T] score matrix. */
export const DEFAULT_QUERY_TILE = 512;

const FINFO_MIN: Record<string, number> = {
  bfloat16: -3.3895313892515355e38,
  float16: -65504,
  float32: -3.4028234663852886e38,
};

/**
 * mlx-lm's quantized_scaled_dot_product_attention (models/base.py), op for
 * op: q·scale, grouped-query reshape, quantized_matmul for scores, the mask
 * (a string becomes the bottom-right causal matrix), precise softmax,
 * quantized_matmul with the values.
 */
export function quantizedAttention(q: MlxArray, k: QuantTriple, v: QuantTriple, scale: number, mask: Mask, groupSize: number, bits: number): MlxArray {
  return quantizedKeyAttention(q, k, scale, mask, groupSize, bits, (probs, nRep) => {
    const vv = expandTriple(v, nRep);
    try {
      return mx.quantized_matmul(probs, vv[0], vv[1], vv[2], { group_size: groupSize, bits, transpose: false });
    } finally {
      for (const a of vv) a.dispose();
    }
  });
}

function expandTriple(t: QuantTriple, nRep: number): [MlxArray, MlxArray, MlxArray] {
  return nRep > 1
    ? [mx.expand_dims(t.w, -3), mx.expand_dims(t.scales, -3), mx.expand_dims(t.biases, -3)]
    : [t.w.retain(), t.scales.retain(), t.biases.retain()];
}

/**
 * The shared part: scores against affine-quantized keys, mask, precise
 * softmax; `values(probs, nRep)` forms the probability-weighted values
 * (probs is [B, Hkv, nRep, L, T] when nRep > 1, else [B, H, L, T]).
 */
export function quantizedKeyAttention(
  q: MlxArray,
  k: QuantTriple,
  scale: number,
  mask: Mask,
  groupSize: number,
  bits: number,
  values: (probs: MlxArray, nRep: number) => MlxArray,
): MlxArray {
  const [B, nQ, L, D] = q.shape as [number, number, number, number];
  const nKv = k.w.shape[1]!;
  const nRep = nQ / nKv;
  const qopts = { group_size: groupSize, bits };
  using qs = mx.multiply(q, scale);
  using queries = nRep > 1 ? mx.reshape(qs, [B, nKv, nRep, L, D]) : qs.retain();
  const [kw, ks, kb] = expandTriple(k, nRep);
  try {
    let scores = mx.quantized_matmul(queries, kw, ks, kb, { ...qopts, transpose: true });
    if (mask !== null) {
      let m: MlxArray;
      if (mask === "causal") {
        const qL = scores.shape[scores.ndim - 2]!;
        const kL = scores.shape[scores.ndim - 1]!;
        using qi = mx.arange(kL - qL, kL);
        using ki = mx.arange(kL);
        using qc = mx.expand_dims(qi, 1);
        using kr = mx.expand_dims(ki, 0);
        m = mx.greater_equal(qc, kr);
      } else m = mask.retain();
      if (nRep > 1 && m.ndim > 3) {
        const e = mx.expand_dims(m, -3);
        m.dispose();
        m = e;
      }
      const prev = scores;
      if (m.dtype === "bool") scores = mx.where(m, prev, FINFO_MIN[prev.dtype] ?? FINFO_MIN.float32!);
      else scores = mx.add(prev, m);
      prev.dispose();
      m.dispose();
    }
    using probs = mx.softmax(scores, -1, { precise: true });
    scores.dispose();
    const out = values(probs, nRep);
    if (nRep === 1) return out;
    using o = out;
    return mx.reshape(o, [B, nQ, L, o.shape[o.ndim - 1]!]);
  } finally {
    for (const a of [kw, ks, kb]) a.dispose();
  }
}

/** Rows [start, stop) of a mask for query rows of a chunk; "causal" is materialized for the chunk. */
function maskRows(mask: Mask, start: number, stop: number, L: number, kL: number): Mask {
  if (mask === null) return null;
  if (mask === "causal") {
    using qi = mx.arange(kL - L + start, kL - L + stop);
    using ki = mx.arange(kL);
    using qc = mx.expand_dims(qi, 1);
    using kr = mx.expand_dims(ki, 0);
    return mx.greater_equal(qc, kr);
  }
  if (mask.shape[mask.ndim - 2] === 1) return mask.retain(); // broadcast over rows
  const s = new Array<number>(mask.ndim).fill(0);
  const e = [...mask.shape];
  s[mask.ndim - 2] = start;
  e[mask.ndim - 2] = stop;
  return mx.slice(mask, s, e);
}

/**
 * The same attention over query tiles of `tile` rows, so a long prefill never
 * holds the full [L, T] score matrix. Rows are independent, so each tile's
 * result is that of the untiled computation.
 */
export function tiledAttention(q: MlxArray, kL: number, mask: Mask, tile: number, attend: (q: MlxArray, mask: Mask) => MlxArray): MlxArray {
  const L = q.shape[2]!;
  if (L <= tile) return attend(q, mask);
  const outs: MlxArray[] = [];
  try {
    for (let start = 0; start < L; start += tile) {
      const stop = Math.min(L, start + tile);
      using qt = mx.slice(q, [0, 0, start, 0], [q.shape[0]!, q.shape[1]!, stop, q.shape[3]!]);
      const m = maskRows(mask, start, stop, L, kL);
      try {
        outs.push(attend(qt, m));
      } finally {
        if (m !== null && m !== "causal") m.dispose();
      }
    }
    return mx.concatenate(outs, 2);
  } finally {
    for (const o of outs) o.dispose();
  }
}

export const AFFINE_BITS: readonly number[] = [2, 3, 4, 5, 6, 8];
export const AFFINE_GROUPS: readonly number[] = [32, 64, 128];

/** Affine codec: each of K and V stored as (packed uint32, scales, biases), mlx-lm's QuantizedKVCache layout. */
export function affineCodec(bits = 8, groupSize = 64, queryTile = DEFAULT_QUERY_TILE): KvCodec {
  if (!AFFINE_BITS.includes(bits)) fail(`affine KV codec: bits must be one of ${AFFINE_BITS.join(", ")}, got ${bits}`);
  if (!AFFINE_GROUPS.includes(groupSize)) fail(`affine KV codec: group size must be one of ${AFFINE_GROUPS.join(", ")}, got ${groupSize}`);
  const opts = { group_size: groupSize, bits };
  return {
    name: `kv:quant:${bits}:${groupSize}`,
    kPlanes: 3,
    vPlanes: 3,
    check(k, v) {
      checkKv("QuantizedKVCache.updateAndFetch", k, v);
      for (const [n, t] of [
        ["keys", k],
        ["values", v],
      ] as const) {
        if (t.shape[3]! % groupSize !== 0) {
          fail(`QuantizedKVCache: ${n} head dim ${t.shape[3]} is not a multiple of the group size ${groupSize} (${t.describe()})`);
        }
      }
    },
    encode(k, v) {
      const [kw, ks, kb] = mx.quantize(k, opts);
      const [vw, vs, vb] = mx.quantize(v, opts);
      return [kw, ks, kb!, vw, vs, vb!];
    },
    view: (planes, length) =>
      new PlanesView(planes, length, ([kw, ks, kb, vw, vs, vb], q, scale, mask, sinks) => {
        if (sinks) fail("quantized attention does not support attention sinks");
        const k = { w: kw!, scales: ks!, biases: kb! };
        const v = { w: vw!, scales: vs!, biases: vb! };
        // Decode steps take the fused kernels where a GPU backend is live (null elsewhere).
        const fused = affineDecodeAttention(q, k, v, scale, mask, bits);
        if (fused) return fused;
        // Prefill chunks: fast SDPA over the dequantized planes (docs/kv-prefill.md), unless exact.
        if (prefillTakesSdpa(q)) {
          using keys = mx.dequantize(kw!, ks!, kb!, opts);
          using values = mx.dequantize(vw!, vs!, vb!, opts);
          return sdpaOverDecoded(q, keys, values, scale, mask);
        }
        return tiledAttention(q, kw!.shape[2]!, mask, queryTile, (qt, m) => quantizedAttention(qt, k, v, scale, m, groupSize, bits));
      }),
    bytesPerToken: (s) => {
      const per = (d: number): number => (d * bits) / 8 + 2 * (d / groupSize) * itemSize(s.dtype);
      return s.batch * s.kvHeads * (per(s.kHeadDim) + per(s.vHeadDim));
    },
  };
}
