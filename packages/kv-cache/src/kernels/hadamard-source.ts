// The orthonormal Walsh-Hadamard transform of a row in CUDA source, rounded where MLX's CUDA
// hadamard_transform rounds, so a kernel that runs it writes the bits of mx.hadamard_transform:
// the TurboQuant value encode (turbo-encode.ts) and the un-rotation of attention outputs
// (turbo-unrotate.ts). docs/turboquant.md, "The encode kernel", has how this was matched.

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
