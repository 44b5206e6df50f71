// What the row-wise Hadamard kernels share — the TurboQuant value encode (turbo-encode.ts) and the
// un-rotation of attention outputs (turbo-unrotate.ts): the transform in CUDA source, rounded where
// MLX's CUDA hadamard_transform rounds (so a kernel that runs it writes the bits of
// mx.hadamard_transform; docs/turboquant.md, "The encode kernel", has how this was matched), the
// check of their rows-and-signs inputs and their launch of one threadgroup of D threads per row.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

/**
 * The row length D of `x` (rows along its last axis, one sign per element), or why the kernels
 * cannot take it; `what` names x in the message.
 */
export function hadamardRows(x: MlxArray, signs: MlxArray, what: string): number | string {
  const sizes = mx.turboquant.FWHT_SIZES;
  if (x.ndim < 1) return `${what} need at least one dimension`;
  if (!["bfloat16", "float16", "float32"].includes(x.dtype)) return `${what} must be floating, got ${x.dtype}`;
  const d = x.shape.at(-1)!;
  if (!sizes.includes(d)) return `head dim ${d} is not one of ${sizes.join(", ")}`;
  if (signs.ndim !== 1 || signs.shape[0] !== d || signs.dtype !== x.dtype) return `signs must be [${d}] ${x.dtype}, got ${signs.describe()}`;
  return d;
}

/** Grid, threadgroup and the templates cudaHadamard reads (T, D, LOGD): one threadgroup of D threads per row of `x`. */
export function hadamardLaunch(x: MlxArray, d: number) {
  return {
    grid: [x.size, 1, 1] as [number, number, number],
    threadgroup: [d, 1, 1] as [number, number, number],
    template: [
      ["T", x.dtype],
      ["D", d],
      ["LOGD", Math.log2(d)],
    ] as [string, number | MlxArray["dtype"]][],
  };
}

/**
 * CUDA text for one threadgroup of D threads per row (templates T, D, LOGD), thread i holding the
 * row's element i as the float `input`; it needs `__shared__ float buf[D]` and declares the float
 * `output`: element i of the transform, rounded to T. As MLX's hadamard_n<T, D, 16>: radix-2
 * butterflies over ascending index bits in float32 (lower element a + b, upper a − b), rounded to
 * T after every 4 bits and after the last bit, then × 1/√D (float) and rounded to T.
 */
export function cudaHadamard(input: string, output: string): string {
  return `  buf[i] = ${input};
#pragma unroll
  for (int b = 0; b < LOGD; ++b) {
    __syncthreads();
    const float a = buf[i];
    const float o = buf[i ^ (1 << b)];
    float y = (i & (1 << b)) ? __fsub_rn(o, a) : __fadd_rn(a, o);
    if ((b & 3) == 3 || b == LOGD - 1) y = static_cast<float>(static_cast<T>(y));
    __syncthreads();
    buf[i] = y;
  }
  const float ${output} = static_cast<float>(static_cast<T>(__fmul_rn(buf[i], (float)(1.0 / sqrt((double)D)))));`;
}
