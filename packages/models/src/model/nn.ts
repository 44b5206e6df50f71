// The mlx.nn modules Gemma 4 uses, over loaded weights: Linear / QuantizedLinear, Embedding /
// QuantizedEmbedding (with as_linear), SwitchLinear / QuantizedSwitchLinear. Same ops as mlx.nn.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { QuantParams } from "../config.ts";
import { WeightsError } from "../errors.ts";

/** Weights of one module: weight (+ scales/biases when quantized, with its parameters). */
export interface ModuleWeights {
  weight: MlxArray;
  scales?: MlxArray;
  biases?: MlxArray;
  quant?: QuantParams;
  /** A LoRA adapter on this linear layer: y + (scale · (x @ a) @ b).astype(x.dtype). */
  lora?: { a: MlxArray; b: MlxArray; scale: number };
  /**
   * Tensor parallel, sharded-to-all (mlx.nn ShardedToAllLinear): this rank holds a slice of the
   * input features, so its output is a partial sum that `reduce` sums over the group.
   */
  reduce?: (partial: MlxArray) => MlxArray;
}

/** The options MLX's quantized ops take for a module's quantization. */
export function qopts(q: QuantParams): { group_size: number; bits: number; mode: QuantParams["mode"] } {
  return { group_size: q.groupSize, bits: q.bits, mode: q.mode };
}

/** nn.Linear without bias (x @ Wᵀ) or nn.QuantizedLinear (quantized_matmul, transpose); plus LoRA (mlx-lm tuner/lora.py). */
export function linear(m: ModuleWeights, x: MlxArray): MlxArray {
  if (!m.reduce) return localLinear(m, x);
  using partial = localLinear(m, x);
  return m.reduce(partial);
}

function localLinear(m: ModuleWeights, x: MlxArray): MlxArray {
  const y = baseLinear(m, x);
  if (!m.lora) return y;
  using base = y;
  using xa = mx.matmul(x, m.lora.a);
  using z = mx.matmul(xa, m.lora.b);
  using sz = mx.multiply(z, m.lora.scale);
  using c = mx.astype(sz, x.dtype);
  return mx.add(base, c);
}

function baseLinear(m: ModuleWeights, x: MlxArray): MlxArray {
  // quantized_linear = mx.quantized_matmul(transpose = true), or on CUDA sm90 (MLX_BUN_FAST_QMV=auto)
  // the exact-order matvec with MLX's bits for large one-row products (docs/custom-kernels.md).
  if (m.quant) return mx.kernels.quantized_linear(x, m.weight, m.scales!, m.biases, qopts(m.quant));
  using wt = mx.transpose(m.weight);
  return mx.matmul(x, wt);
}

/** nn.Embedding: weight[ids]; QuantizedEmbedding: dequantize(weight[ids], scales[ids], biases[ids]). */
export function embed(m: ModuleWeights, ids: MlxArray): MlxArray {
  if (!m.quant) return mx.take(m.weight, ids, 0);
  using w = mx.take(m.weight, ids, 0);
  using s = mx.take(m.scales!, ids, 0);
  using b = m.biases ? mx.take(m.biases, ids, 0) : undefined;
  return mx.dequantize(w, s, b, qopts(m.quant));
}

/** Embedding.as_linear: x @ weightᵀ (tied output head). */
export function embedAsLinear(m: ModuleWeights, x: MlxArray): MlxArray {
  return baseLinear(m, x);
}

/** SwitchLinear (gather_mm with weight.swapaxes(-1, -2)) / QuantizedSwitchLinear (gather_qmm, transpose). */
export function switchLinear(m: ModuleWeights, x: MlxArray, indices: MlxArray, sorted: boolean): MlxArray {
  if (m.quant) {
    return mx.gather_qmm(x, m.weight, m.scales!, m.biases, { ...qopts(m.quant), transpose: true, rhs_indices: indices, sorted_indices: sorted });
  }
  using wt = mx.swapaxes(m.weight, -1, -2);
  return mx.gather_mm(x, wt, { rhs_indices: indices, sorted_indices: sorted });
}

/** Collect a module's tensors from the sanitized weight map. */
export function moduleWeights(tensors: Map<string, MlxArray>, path: string, quant: QuantParams | undefined): ModuleWeights {
  const weight = tensors.get(`${path}.weight`);
  if (!weight) throw new WeightsError(`missing tensor ${path}.weight`);
  if (!quant) return { weight };
  const scales = tensors.get(`${path}.scales`);
  if (!scales) throw new WeightsError(`missing tensor ${path}.scales`);
  const biases = tensors.get(`${path}.biases`);
  return { weight, scales, ...(biases ? { biases } : {}), quant };
}
