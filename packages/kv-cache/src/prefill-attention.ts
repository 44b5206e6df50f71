// Prefill chunks over an affine or TurboQuant cache: fast SDPA over the dequantized planes (the
// default on a GPU), or mlx-lm's quantized-matmul attention (the exact path, mlx-lm's tokens; the
// default on the CPU, where the SDPA path measured no faster).
// docs/kv-prefill.md has the reasoning and the measurements.
import { defaultDevice, type MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { processSetting } from "./setting.ts";
import type { Mask } from "./types.ts";

/**
 * How a quantized view attends a chunk of at least `PREFILL_SDPA_MIN_QUERIES` query tokens:
 * "sdpa" (the default when MLX's default device is a GPU) dequantizes the fetched planes (the past and the chunk, as stored) and runs
 * `fast.scaled_dot_product_attention`, the kernel a bf16 cache uses; "exact" keeps mlx-lm's
 * quantized_matmul attention op for op (the default on the CPU, and the path every parity test
 * runs on).
 */
export type KvPrefillSetting = "sdpa" | "exact";

/**
 * Query tokens from which a chunk takes the SDPA path. Below it (decode steps, speculative
 * verification of a few drafted tokens) the cost of writing a dequantized copy of the whole
 * cache is not repaid by the faster attention, so short chunks stay on the quantized path.
 */
export const PREFILL_SDPA_MIN_QUERIES = 32;

// Unset: SDPA where it pays (a GPU: 0.88-0.92x -> 0.98-0.99x of bf16 prefill for q8 on the H200);
// the CPU keeps mlx-lm's tokens (no measurable gain there, docs/kv-prefill.md).
const setting = processSetting<KvPrefillSetting>("MLX_BUN_KV_PREFILL", "setKvPrefill", ["sdpa", "exact"], () => (defaultDevice() === "gpu" ? "sdpa" : "exact"));

/**
 * Choose the prefill attention of the quantized KV views for this process: "sdpa" or "exact"
 * (see KvPrefillSetting). `undefined` goes back to MLX_BUN_KV_PREFILL (unset: "sdpa" on a GPU, "exact" on the CPU).
 */
export function setKvPrefill(s: KvPrefillSetting | undefined): void {
  setting.set(s);
}

/** The prefill attention in effect now. */
export function kvPrefill(): KvPrefillSetting {
  return setting.get();
}

/** Whether a chunk of `q` [B, Hq, L, D] takes the SDPA path now. */
export function prefillTakesSdpa(q: MlxArray): boolean {
  return q.shape[2]! >= PREFILL_SDPA_MIN_QUERIES && kvPrefill() === "sdpa";
}

/**
 * Most bytes of attention scores [B, Hq, rows, T] one SDPA call of `sdpaOverDecoded` may imply.
 * MLX's fast SDPA has no fused kernel for head dims over 128 on CUDA (cuDNN's limit) and falls
 * back to scores, masked scores and probabilities in full: at 128k tokens a 2,048-token chunk of 16
 * heads is ~26 GB of transients, half the peak memory of the 12B-shaped model on the H200.
 */
// 4 GiB: at 128k on the H200 it kept prefill at 0.91x bf16 with the peak at 0.72x; 1 GiB (8 blocks)
// took the peak to 0.68x but prefill to 0.81x (docs/kv-prefill.md).
const DEFAULT_SCORE_BUDGET = 4 * 2 ** 30;
let scoreBudget = DEFAULT_SCORE_BUDGET;

/** Set the score budget of one SDPA call (bytes; undefined: 4 GiB). For tests and measurements. */
export function setPrefillScoreBudget(bytes: number | undefined): void {
  if (bytes !== undefined && !(Number.isInteger(bytes) && bytes > 0))
    throw new RangeError(`prefill score budget must be a positive integer of bytes, got ${bytes}`);
  scoreBudget = bytes ?? DEFAULT_SCORE_BUDGET;
}

/**
 * softmax(scale · q Kᵀ + mask) V by fast SDPA, with `keys` and `values` the dequantized planes
 * [B, Hkv, T, D] in the queries' dtype (GQA as SDPA does it). The mask is the view's: "causal"
 * (bottom-right), a boolean or additive array, or null. A chunk whose scores would pass the
 * budget attends in blocks of query rows (each row's softmax is its own, so the blocks give the
 * rows of the whole; a causal block attends only the keys up to its last row).
 */
export function sdpaOverDecoded(q: MlxArray, keys: MlxArray, values: MlxArray, scale: number, mask: Mask): MlxArray {
  const [B, HQ, L] = q.shape as [number, number, number];
  const T = keys.shape[2]!;
  const perRow = B * HQ * T * q.itemsize;
  const rows = Math.max(1, Math.floor(scoreBudget / perRow));
  if (rows >= L) return mx.fast.scaled_dot_product_attention(q, keys, values, { scale, mask });
  const outs: MlxArray[] = [];
  try {
    for (let a = 0; a < L; a += rows) {
      const b = Math.min(L, a + rows);
      using qb = mx.slice(q, [0, 0, a, 0], [B, HQ, b, q.shape[3]!]);
      if (mask === "causal") {
        // Bottom-right causal: row i sees keys up to T − L + i, so rows [a, b) need the first T − L + b.
        const t = T - L + b;
        using kb = mx.slice(keys, [0, 0, 0, 0], [keys.shape[0]!, keys.shape[1]!, t, keys.shape[3]!]);
        using vb = mx.slice(values, [0, 0, 0, 0], [values.shape[0]!, values.shape[1]!, t, values.shape[3]!]);
        outs.push(mx.fast.scaled_dot_product_attention(qb, kb, vb, { scale, mask: "causal" }));
      } else if (mask !== null && mask.shape.at(-2) === L && L > 1) {
        const m = mask.shape.map((n, i) => (i === mask.ndim - 2 ? b : n));
        const start = mask.shape.map((_, i) => (i === mask.ndim - 2 ? a : 0));
        using mb = mx.slice(mask, start, m);
        outs.push(mx.fast.scaled_dot_product_attention(qb, keys, values, { scale, mask: mb }));
      } else {
        outs.push(mx.fast.scaled_dot_product_attention(qb, keys, values, { scale, mask }));
      }
    }
    return mx.concatenate(outs, 2);
  } finally {
    for (const o of outs) o.dispose();
  }
}
