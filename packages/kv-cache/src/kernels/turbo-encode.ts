// TurboQuant's value encode as one kernel: sign flip, orthonormal Walsh-Hadamard transform, RMS,
// Lloyd-Max codes and bit packing of each row. The composition is about twenty kernels per
// chunk, on every full-attention layer of every decode step. The CUDA source repeats the
// arithmetic of MLX's CUDA kernels for each op of the composition (docs/turboquant.md, "The
// encode kernel"), so on CUDA it writes the composition's bytes. No Metal source: MLX's Metal
// hadamard_transform rounds elsewhere, so Metal keeps the composition.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { cudaHadamard, hadamardLaunch, hadamardRows } from "./hadamard-source.ts";

const tq = mx.turboquant;

// One threadgroup of D threads per row; thread i owns element i.
// 1. x = v·sign in T (exact: the signs are ±1).
// 2. The transform as MLX's CUDA hadamard_n<T, D, 16> (hadamard-source.ts).
// 3. Σ rot² as MLX's row_reduce_simple over D float32s with 32 threads: lane l adds elements
//    128·r + 4·l + j in order (r, then j), then the lanes meet in a tree over offsets 16..1
//    (cooperative_groups::reduce); × 1/D; sqrt; max(·, 1e-30); rot / rms (IEEE, no contraction).
// 4. code = #boundaries below; bits packed little-endian (mlx-ops pack_bits); the RMS in T.
const CUDA = `
  const int i = (int)threadIdx.x;
  const long long row = (long long)blockIdx.x;
  __shared__ float buf[D];
  __shared__ float total;
  __shared__ unsigned char codes[D];
  const float x = static_cast<float>(static_cast<T>(static_cast<float>(v[row * D + i]) * static_cast<float>(signs[i])));
${cudaHadamard("x", "rot")}
  __syncthreads();
  buf[i] = rot;
  __syncthreads();
  if (i < 32) {
    float acc = 0.0f;
    for (int r = 0; r * 128 < D; ++r) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = r * 128 + 4 * i + j;
        acc = __fadd_rn(acc, e < D ? __fmul_rn(buf[e], buf[e]) : 0.0f);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    if (i == 0) total = acc;
  }
  __syncthreads();
  const float rms = __fsqrt_rn(__fmul_rn(total, 1.0f / (float)D));
  const float unit = __fdiv_rn(rot, fmaxf(rms, 1e-30f));
  int code = 0;
#pragma unroll
  for (int j = 0; j < NBD; ++j) code += unit > boundaries[j] ? 1 : 0;
  codes[i] = (unsigned char)code;
  __syncthreads();
  if (i < D * VB / 8) {
    const int lo = 8 * i;
    unsigned int byte = 0;
    for (int e = lo / VB; e * VB < lo + 8; ++e) {
      const int off = e * VB - lo;
      const unsigned int c = (unsigned int)codes[e] & ((1u << VB) - 1u);
      byte |= off >= 0 ? (c << off) : (c >> (-off));
    }
    packed[row * (D * VB / 8) + i] = (uint8_t)(byte & 0xffu);
  }
  if (i == 0) vscale[row] = static_cast<T>(rms);
`;

function shapesOf([v, signs, boundaries]: readonly MlxArray[]): { d: number; bits: number } | string {
  const d = hadamardRows(v!, signs!, "values");
  if (typeof d === "string") return d;
  if (boundaries!.dtype !== "float32" || boundaries!.ndim !== 1) return "boundaries must be a float32 vector";
  const bits = Math.log2(boundaries!.size + 1);
  if (![1, 2, 3, 4].includes(bits)) return `boundaries must number 2^bits − 1 for 1-4 bits, got ${boundaries!.size}`;
  return { d, bits };
}

export const turboEncodeKernel = mx.kernels.custom_kernel({
  name: "mlxb_turbo_encode_values",
  input_names: ["v", "signs", "boundaries"],
  output_names: ["packed", "vscale"],
  cuda: { source: CUDA },
  validate: (inputs) => {
    const s = shapesOf(inputs);
    return typeof s === "string" ? s : null;
  },
  reference: ([v, signs, boundaries], s) => {
    const { bits } = shapesOf([v!, signs!, boundaries!]) as { bits: number };
    using rot = tq.fwht(v!, signs!, s);
    using rot32 = mx.astype(rot, "float32", s);
    using sq = mx.square(rot32, s);
    using ms = mx.mean(sq, -1, { keepdims: true, stream: s });
    using rms32 = mx.sqrt(ms, s);
    // A zero vector codes as zeros with scale 0; avoid 0/0.
    using safe = mx.maximum(rms32, 1e-30, s);
    using unit = mx.divide(rot32, safe, s);
    using codes = tq.codebook_quantize(unit, boundaries!, s);
    return [tq.pack_bits(codes, bits, s), mx.astype(rms32, v!.dtype, s)];
  },
  launch: (inputs) => {
    const { d, bits } = shapesOf(inputs) as { d: number; bits: number };
    const v = inputs[0]!;
    const lead = v.shape.slice(0, -1);
    const rows = hadamardLaunch(v, d);
    return {
      output_shapes: [
        [...lead, (d * bits) / 8],
        [...lead, 1],
      ],
      output_dtypes: ["uint8", v.dtype],
      ...rows,
      template: [...rows.template, ["VB", bits], ["NBD", (1 << bits) - 1]],
    };
  },
});
