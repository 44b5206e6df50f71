// TurboQuant codec: keys affine per 32-group; values rotated (randomized FWHT) then Lloyd-Max coded,
// bit-packed at rest; attention keeps values rotated and un-rotates the output once (deferred V).
import { itemSize, type MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { quantizedKeyAttention, tiledAttention, DEFAULT_QUERY_TILE } from "./affine.ts";
import { checkKv, type KvCodec, PlanesView } from "./codec.ts";
import { turboDecodeAttention } from "./kernels/turbo-decode.ts";
import { turboEncodeKernel } from "./kernels/turbo-encode.ts";
import { turboUnrotateKernel } from "./kernels/turbo-unrotate.ts";
import { turboValues } from "./kernels/turbo-values.ts";
import { prefillTakesSdpa, sdpaOverDecoded } from "./prefill-attention.ts";
import { processSetting } from "./setting.ts";
import type { QuantTriple } from "./quant-triple.ts";
import { type Mask, fail } from "./types.ts";

const tq = mx.turboquant;

export const TURBO_K_BITS: readonly number[] = [2, 3, 4, 8];
/** Lloyd-Max codebooks exist for 1-4 bits; 1 bit loses too much for values (docs/turboquant.md). */
export const TURBO_V_BITS: readonly number[] = [2, 3, 4];
/** Keys are quantized per group of 32 along head_dim. */
export const TURBO_K_GROUP = 32;

export interface TurboQuantOptions {
  kBits: number;
  vBits: number;
  /** Seed of the random-sign vector of the value rotation. */
  seed?: number;
  /** Keep values rotated through attention and un-rotate the output (default true). */
  deferredV?: boolean;
  queryTile?: number;
  /** How this codec encodes and un-rotates; default: the process setting (setTurboEncode). */
  encoding?: TurboEncodeSetting;
}

/**
 * How TurboQuant caches encode values and un-rotate attention outputs: "kernel" runs
 * mlxb_turbo_encode_values and mlxb_turbo_unrotate where their sources run (CUDA; the
 * compositions elsewhere), "composition" the ops one by one. Both write the same bytes on CUDA
 * (docs/turboquant.md, "The encode kernel"). Default: kernel.
 */
export type TurboEncodeSetting = "kernel" | "composition";
const encodeSetting = processSetting<TurboEncodeSetting>("MLX_BUN_TURBO_ENCODE", "setTurboEncode", ["kernel", "composition"], () => "kernel");

/** Choose how TurboQuant caches encode for this process; undefined: MLX_BUN_TURBO_ENCODE, else the default. */
export function setTurboEncode(s: TurboEncodeSetting | undefined): void {
  encodeSetting.set(s);
}

/** Per-dtype state a codec builds once: signs and codebook on the device. */
interface Tables {
  signs: MlxArray;
  centroids: MlxArray;
  boundaries: MlxArray;
}

/**
 * Planes per token: K (packed uint32 [.., Dk·kBits/32], scales, biases [.., Dk/32]),
 * V (codes packed uint8 [.., Dv·vBits/8], scale [.., 1]). The value scale is the
 * RMS of the rotated vector, so the coded coordinates are ≈ N(0, 1).
 */
export function turboQuantCodec(opts: TurboQuantOptions): KvCodec & {
  readonly kBits: number;
  readonly vBits: number;
  readonly seed: number;
  /** The output of attention over rotated values → the real output. */
  unrotate(out: MlxArray, headDim: number, dtype: MlxArray["dtype"]): MlxArray;
  /** Free the sign vectors and codebooks this codec made. */
  dispose(): void;
} {
  const { kBits, vBits, seed = 0, deferredV = true, queryTile = DEFAULT_QUERY_TILE } = opts;
  if (!TURBO_K_BITS.includes(kBits)) fail(`TurboQuant: kBits must be one of ${TURBO_K_BITS.join(", ")}, got ${kBits}`);
  if (!TURBO_V_BITS.includes(vBits)) fail(`TurboQuant: vBits must be one of ${TURBO_V_BITS.join(", ")}, got ${vBits}`);
  const tables = new Map<string, Tables>();
  const tablesFor = (d: number, dtype: MlxArray["dtype"]): Tables => {
    const key = `${d}:${dtype}`;
    let t = tables.get(key);
    if (!t) {
      const book = tq.lloyd_max_codebook(vBits, { dtype: "float32" });
      t = { signs: tq.random_signs(d, seed, dtype), centroids: book.centroids, boundaries: book.boundaries };
      tables.set(key, t);
    }
    return t;
  };
  const kq = { group_size: TURBO_K_GROUP, bits: kBits };
  // The rotation kernels (value encode, output un-rotation) where their source runs, else the compositions.
  const rotationPath = (): "auto" | "reference" => ((opts.encoding ?? encodeSetting.get()) === "kernel" ? "auto" : "reference");
  const unrotate = (out: MlxArray, d: number, dtype: MlxArray["dtype"]): MlxArray => {
    const inputs = [out, tablesFor(d, dtype).signs];
    return turboUnrotateKernel.runKeyed(inputs, mx.kernels.inputsKey(inputs), { path: rotationPath() })[0]!;
  };

  /** Rotated values [B, H, T, D] (in the scale dtype) from the value planes: one kernel on a GPU. */
  const rotatedValues = (packed: MlxArray, vscale: MlxArray, d: number): MlxArray => turboValues(packed, vscale, tablesFor(d, vscale.dtype).centroids);

  const sdpaOverKeys = (q: MlxArray, k: QuantTriple, values: MlxArray, scale: number, mask: Mask): MlxArray => {
    using keys = mx.dequantize(k.w, k.scales, k.biases, kq);
    using v = mx.astype(values, keys.dtype);
    return sdpaOverDecoded(q, keys, v, scale, mask);
  };

  return {
    // The seed decides the value rotation, so it is part of the signature (left out at 0).
    name: `kv:turboquant:${kBits}:${vBits}${seed ? `:s${seed}` : ""}`,
    kBits,
    vBits,
    seed,
    kPlanes: 3,
    vPlanes: 2,
    unrotate,
    dispose() {
      for (const t of tables.values()) for (const a of [t.signs, t.centroids, t.boundaries]) a.dispose();
      tables.clear();
    },
    check(k, v) {
      checkKv("TurboQuant.updateAndFetch", k, v);
      const dv = v.shape[3]!;
      const dk = k.shape[3]!;
      if (!tq.FWHT_SIZES.includes(dv) || !tq.FWHT_SIZES.includes(dk)) {
        fail(`TurboQuant: unsupported head dim (keys ${dk}, values ${dv}); supported: ${tq.FWHT_SIZES.join(", ")}`);
      }
    },
    encode(k, v) {
      const [kw, ks, kb] = mx.quantize(k, kq);
      const t = tablesFor(v.shape[3]!, v.dtype);
      // The encode kernel where its source runs; its reference is the composition of ops.
      // Keyed launch (every decode step encodes): the boundaries' size carries the bits.
      const inputs = [v, t.signs, t.boundaries];
      const [packed, vscale] = turboEncodeKernel.runKeyed(inputs, mx.kernels.inputsKey(inputs), { path: rotationPath() });
      return [kw, ks, kb!, packed!, vscale!];
    },
    view: (planes, length) =>
      new PlanesView(planes, length, ([kw, ks, kb, packed, vscale], q, scale, mask, sinks) => {
        if (sinks) fail("TurboQuant attention does not support attention sinks");
        const dv = (packed!.shape[3]! * 8) / vBits;
        const k = { w: kw!, scales: ks!, biases: kb! };
        if (deferredV) {
          // Decode steps take the fused kernels where a GPU backend is live (null elsewhere).
          const fused = turboDecodeAttention(q, k, packed!, vscale!, tablesFor(dv, vscale!.dtype).centroids, scale, mask, kBits);
          if (fused) {
            using o = fused;
            return unrotate(o, dv, o.dtype);
          }
        }
        using vr = rotatedValues(packed!, vscale!, dv);
        using values = deferredV ? vr.retain() : unrotate(vr, dv, vr.dtype);
        // Prefill chunks: fast SDPA over the dequantized keys and the decoded values (still
        // rotated when deferred: attention is linear in V), unless exact (docs/kv-prefill.md).
        const out = prefillTakesSdpa(q)
          ? sdpaOverKeys(q, k, values, scale, mask)
          : tiledAttention(q, kw!.shape[2]!, mask, queryTile, (qt, m) =>
              quantizedKeyAttention(qt, k, scale, m, TURBO_K_GROUP, kBits, (probs, nRep) => {
                using vv = nRep > 1 ? mx.expand_dims(values, -3) : values.retain();
                using pv = mx.astype(probs, vv.dtype);
                return mx.matmul(pv, vv);
              }),
            );
        if (!deferredV) return out;
        using o = out;
        return unrotate(o, dv, o.dtype);
      }),
    bytesPerToken: (s) => {
      const k = (s.kHeadDim * kBits) / 8 + 2 * (s.kHeadDim / TURBO_K_GROUP) * itemSize(s.dtype);
      const v = Math.ceil((s.vHeadDim * vBits) / 8) + itemSize(s.dtype);
      return s.batch * s.kvHeads * (k + v);
    },
  };
}

export type TurboQuantCodec = ReturnType<typeof turboQuantCodec>;
