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
 * softmax(scale · q Kᵀ + mask) V by fast SDPA, with `keys` and `values` the dequantized planes
 * [B, Hkv, T, D] in the queries' dtype (GQA as SDPA does it). The mask is the view's: "causal"
 * (bottom-right), a boolean or additive array, or null.
 */
export function sdpaOverDecoded(q: MlxArray, keys: MlxArray, values: MlxArray, scale: number, mask: Mask): MlxArray {
  return mx.fast.scaled_dot_product_attention(q, keys, values, { scale, mask });
}
