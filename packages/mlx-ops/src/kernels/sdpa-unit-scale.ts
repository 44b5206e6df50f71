// MLX's scaled_dot_product_attention where MLX composes it from ops, less its multiply by a scale of
// 1. Where no fused kernel takes the call (the CPU; CUDA for head dims over 128, as Gemma 4's 256
// and 512), MLX 0.32's fast.cpp runs `q·scale`, [GQA: unflatten q, expand k and v], q @ kᵀ, mask,
// precise softmax, @ v, flatten. Gemma 4 attends at scale 1: that multiply is a launch a layer
// that copies q (x·1 = x in every floating type, with q's strides), so issuing the rest on q itself
// gives the same bits (docs/custom-kernels.md, "Attention at scale 1").
import type { MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { matmul } from "../linalg.ts";
import { softmax } from "../reduce.ts";
import { expand_dims, flatten, reshape, swapaxes, unflatten } from "../shape.ts";
import { KernelSwitch, kernel_environment } from "./kernel.ts";

// p·v of a grouped decode row as one strided batch on CUDA (see composed_attention); off by default.
const pvFoldSwitch = new KernelSwitch("MLX_BUN_PV_FOLD");

/** Fold a grouped decode row's p·v into one strided batch on CUDA; undefined goes back to MLX_BUN_PV_FOLD (default off). */
export function set_pv_fold(on: boolean | undefined): void {
  pvFoldSwitch.set(on);
}

function onCudaGpu(stream?: Stream): boolean {
  const env = kernel_environment(stream);
  return env.gpu_backend === "cuda" && env.device === "gpu";
}

/** The widest head CUDA's SDPA kernels take (cuDNN and sdpa_vector): past it MLX composes. */
const CUDA_SDPA_MAX_HEAD_DIM = 128;

/** Whether MLX 0.32 runs its composition of ops for these inputs on `stream` (not a fused kernel). */
function mlxComposes(q: MlxArray, v: MlxArray, stream?: Stream): boolean {
  const env = kernel_environment(stream);
  if (env.device === "cpu") return true;
  return env.gpu_backend === "cuda" && Math.max(q.shape[3]!, v.shape[3]!) > CUDA_SDPA_MAX_HEAD_DIM;
}

/**
 * softmax(q kᵀ) v with no mask, no sinks and scale 1 for q [B, Hq, L, D], k/v [B, Hkv, T, D] of
 * one dtype, as MLX's fallback composes it less the multiply by 1; null where MLX would not compose
 * (Metal, CUDA heads of ≤ 128) or the call is anything else: the caller then runs MLX's op.
 */
export function sdpa_unit_scale(q: MlxArray, k: MlxArray, v: MlxArray, scale: number, stream?: Stream): MlxArray | null {
  if (scale !== 1 || q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) return null;
  if (k.dtype !== q.dtype || v.dtype !== q.dtype || !["bfloat16", "float16", "float32"].includes(q.dtype)) return null;
  const hq = q.shape[1]!;
  const hkv = k.shape[1]!;
  if (hkv < 1 || hq % hkv !== 0 || v.shape[1] !== hkv || k.shape[3] !== q.shape[3] || !mlxComposes(q, v, stream)) return null;
  using scores = composed_scores(q, k, stream);
  return composed_attention(scores, v, stream);
}

/**
 * q @ kᵀ as MLX's fallback issues it (scale 1): [B, Hq, L, T], or for grouped queries (unflatten q,
 * expand_dims k) [B, Hkv, Hq / Hkv, L, T]. Shared with sdpa-decode.ts's reference.
 */
export function composed_scores(q: MlxArray, k: MlxArray, stream?: Stream): MlxArray {
  const hkv = k.shape[1]!;
  const rep = q.shape[1]! / hkv;
  if (rep === 1) {
    using kt = swapaxes(k, -1, -2, stream);
    return matmul(q, kt, stream);
  }
  using qg = unflatten(q, 1, [hkv, rep], stream);
  using ke = expand_dims(k, 2, stream);
  using kt = swapaxes(ke, -1, -2, stream);
  return matmul(qg, kt, stream);
}

/**
 * The rest of the fallback on `composed_scores`' output: precise softmax, @ v, and for grouped queries
 * the flatten back to [B, Hq, L, D]. With MLX_BUN_PV_FOLD on CUDA a grouped decode row's p·v runs as
 * [B, Hkv, repeats, T] @ [B, Hkv, T, D]: a strided batch instead of MLX's pointer-array batch over the
 * broadcast values, one launch (set_mm_device_pointers) fewer; not MLX's bits everywhere (on an H100,
 * tools/bench/device/pv-fold-check.py found 2 of 96 cases differing), so off unless asked for.
 */
export function composed_attention(scores: MlxArray, v: MlxArray, stream?: Stream): MlxArray {
  using p = softmax(scores, [-1], { precise: true, stream });
  if (scores.ndim === 4) return matmul(p, v, stream);
  const [b, hkv, rep, l, t] = scores.shape as [number, number, number, number, number];
  if (l === 1 && pvFoldSwitch.get() && onCudaGpu(stream)) {
    using rows = reshape(p, [b, hkv, rep, t], stream);
    using out = matmul(rows, v, stream);
    return reshape(out, [b, hkv * rep, 1, v.shape[3]!], stream);
  }
  using ve = expand_dims(v, 2, stream);
  using out = matmul(p, ve, stream);
  return flatten(out, 1, 2, stream);
}
