// Affine-quantized matrix-vector product for decode: y = x @ dequantize(w, scales, biases)ᵀ for a
// few rows of x (built for M = 1..16, any M is correct), MLX's affine layout (the weight
// packed along K in uint32 words, one scale and bias per group of `group_size` values), 4 or 8
// bits, groups of 32/64/128: what mx.quantized_matmul(x, w, scales, biases, transpose=true)
// computes, and its reference composition is exactly that call.
//
// At batch 1 a decode step reads every weight once, so the product is a stream over the weights.
// The kernel is built for that stream (docs/custom-kernels.md, "qmv"):
// - every lane loads 16-byte chunks of weights (32 four-bit or 16 eight-bit values) through the
//   read-only path, RPW rows at once (RPW independent loads in flight per lane);
// - a warp owns RPW output rows and strides K in chunks; SPLIT warps of a block share the same
//   rows and split K (then sum through shared memory), so small-N shapes still fill the SMs;
// - a 4-bit nibble becomes a float with one byte permute and one subtraction (0x4B0000qq is
//   2^23 + qq), no integer-to-float conversion; per group Σ(s·q + b)·x = s·Σq·x + b·Σx, so the
//   activations are read and summed once per chunk for all RPW rows;
// - float32 accumulation, one rounding to the output dtype. MLX's CUDA qmv dequantizes and
//   accumulates per lane in the activation dtype, so the two differ by about one ulp of the
//   output; through a 48-layer model that is a KL of ~3e-3 per token (docs/benchmarks.md), which
//   is why the model keeps MLX's op unless MLX_BUN_FAST_QMV=1.
import { isFloating, type MlxArray, MlxError, type Stream } from "@mlx-bun/mlx-ffi";
import { quantized_matmul, type QuantMode } from "../quantized.ts";
import { reshape } from "../shape.ts";
import { on_exact_arch } from "./cuda-arch.ts";
import { custom_kernel, inputsKey, KernelSwitch, type KernelRunOptions, kernel_environment, select_kernel_path } from "./kernel.ts";
import { qmv_exact_geglu_kernel, qmv_exact_kernel, qmv_exact_staged } from "./qmv-exact.ts";

/** Bit widths and group sizes the kernel reads. */
export const QMV_BITS: readonly number[] = [4, 8];
export const QMV_GROUP_SIZES: readonly number[] = [32, 64, 128];
/** Warps per block (threads 128): GROUPS = WPB / SPLIT row groups of RPW rows each. */
const WPB = 4;

const HEADER_CUDA = `
template <int BITS>
__device__ __forceinline__ void mlxb_qmv_unpack(uint32_t w, float* q) {
  // 0x4B0000qq as a float is 2^23 + qq: one byte permute and one subtraction per value.
  if constexpr (BITS == 4) {
    const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      q[2 * b] = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7440u | b)) - 8388608.0f;
      q[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7440u | b)) - 8388608.0f;
    }
  } else {
#pragma unroll
    for (int b = 0; b < 4; ++b) q[b] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | b)) - 8388608.0f;
  }
}
template <typename T, int E>
__device__ __forceinline__ void mlxb_qmv_load_x(const T* p, float* v) {
  constexpr int BYTES = E * (int)sizeof(T);
  if constexpr (BYTES == 8) {
    uint2 r = *reinterpret_cast<const uint2*>(p);
    const T* t = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] = static_cast<float>(t[i]);
  } else {
    constexpr int NV = BYTES / 16;
    uint4 r[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) r[i] = reinterpret_cast<const uint4*>(p)[i];
    const T* t = reinterpret_cast<const T*>(r);
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] = static_cast<float>(t[i]);
  }
}
__device__ __forceinline__ uint32_t mlxb_qmv_word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
`;

// Template args: T (x dtype), BITS, GS, K, N, MB (rows of x per block), RPW (weight rows per
// warp), SPLIT (warps per row group splitting K). M comes from x's shape (a new batch size
// compiles nothing new). Rows past N or M are clamped for the loads and never written, so every
// warp reaches the barrier.
const CUDA = `
  constexpr int WPB = ${WPB};
  constexpr int GROUPS = WPB / SPLIT;
  constexpr int EPW = 32 / BITS;  // values per uint32 word
  constexpr int VPC = 4 * EPW;    // values per 16-byte chunk
  constexpr int NC = K / VPC;     // chunks per row
  constexpr int G = K / GS;       // groups per row
  int M = 1;
  for (int i = 0; i < x_ndim - 1; ++i) M *= x_shape[i];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int grp = warp / SPLIT;
  const int part = warp % SPLIT;
  const int row0 = (blockIdx.x * GROUPS + grp) * RPW;
  const int m0 = blockIdx.y * MB;
  const uint4* wr[RPW];
  const auto* sr = scales;
  const auto* br = biases;
  size_t sg[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const size_t n = row0 + r < N ? row0 + r : N - 1;
    wr[r] = reinterpret_cast<const uint4*>(w + n * (K / EPW));
    sg[r] = n * G;
  }
  const T* xr[MB];
#pragma unroll
  for (int m = 0; m < MB; ++m) xr[m] = x + (size_t)(m0 + m < M ? m0 + m : M - 1) * K;
  float acc[RPW][MB];
#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int m = 0; m < MB; ++m) acc[r][m] = 0.0f;
#pragma unroll 2
  for (int c = part * 32 + lane; c < NC; c += SPLIT * 32) {
    uint4 wv[RPW];
    float s[RPW], b[RPW];
    const int g = (c * VPC) / GS;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      wv[r] = __ldg(wr[r] + c);
      s[r] = static_cast<float>(sr[sg[r] + g]);
      b[r] = static_cast<float>(br[sg[r] + g]);
    }
    float sx[MB];
#pragma unroll
    for (int m = 0; m < MB; ++m) sx[m] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float q[RPW][EPW];
#pragma unroll
      for (int r = 0; r < RPW; ++r) mlxb_qmv_unpack<BITS>(mlxb_qmv_word(wv[r], j), q[r]);
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        float xv[EPW];
        mlxb_qmv_load_x<T, EPW>(xr[m] + c * VPC + j * EPW, xv);
#pragma unroll
        for (int i = 0; i < EPW; ++i) sx[m] += xv[i];
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          float t = 0.0f;
#pragma unroll
          for (int i = 0; i < EPW; ++i) t = fmaf(q[r][i], xv[i], t);
          acc[r][m] = fmaf(s[r], t, acc[r][m]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int m = 0; m < MB; ++m) acc[r][m] = fmaf(b[r], sx[m], acc[r][m]);
  }
#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int off = 16; off > 0; off /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
  if constexpr (SPLIT == 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < RPW; ++r)
#pragma unroll
        for (int m = 0; m < MB; ++m)
          if (row0 + r < N && m0 + m < M) out[(size_t)(m0 + m) * N + row0 + r] = static_cast<T>(acc[r][m]);
    }
  } else {
    __shared__ float red[WPB][RPW * MB];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < RPW; ++r)
#pragma unroll
        for (int m = 0; m < MB; ++m) red[warp][r * MB + m] = acc[r][m];
    }
    __syncthreads();
    if (part == 0) {
      for (int i = lane; i < RPW * MB; i += 32) {
        const int r = i / MB, m = i % MB;
        float v = 0.0f;
#pragma unroll
        for (int p = 0; p < SPLIT; ++p) v += red[grp * SPLIT + p][i];
        if (row0 + r < N && m0 + m < M) out[(size_t)(m0 + m) * N + row0 + r] = static_cast<T>(v);
      }
    }
  }
`;

// The same kernel for Metal (simdgroups of 32, simd_sum, threadgroup memory for SPLIT); the
// nibbles are shifted out (Metal has no byte permute). Not run: no Apple machine here.
const METAL = `
  constexpr int WPB = ${WPB};
  constexpr int GROUPS = WPB / SPLIT;
  constexpr int EPW = 32 / BITS;
  constexpr int VPC = 4 * EPW;
  constexpr int NC = K / VPC;
  constexpr int G = K / GS;
  constexpr uint MASK = (1u << BITS) - 1u;
  int M = 1;
  for (int i = 0; i < x_ndim - 1; ++i) M *= x_shape[i];
  const int warp = simdgroup_index_in_threadgroup;
  const int lane = thread_index_in_simdgroup;
  const int grp = warp / SPLIT;
  const int part = warp % SPLIT;
  const int row0 = (threadgroup_position_in_grid.x * GROUPS + grp) * RPW;
  const int m0 = threadgroup_position_in_grid.y * MB;
  size_t wo[RPW], sg[RPW];
  for (int r = 0; r < RPW; ++r) {
    const size_t n = row0 + r < N ? row0 + r : N - 1;
    wo[r] = n * (K / EPW);
    sg[r] = n * G;
  }
  size_t xo[MB];
  for (int m = 0; m < MB; ++m) xo[m] = (size_t)(m0 + m < M ? m0 + m : M - 1) * K;
  float acc[RPW][MB];
  for (int r = 0; r < RPW; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = 0.0f;
  for (int c = part * 32 + lane; c < NC; c += SPLIT * 32) {
    uint4 wv[RPW];
    float s[RPW], b[RPW];
    const int g = (c * VPC) / GS;
    for (int r = 0; r < RPW; ++r) {
      wv[r] = reinterpret_cast<const device uint4*>(w + wo[r])[c];
      s[r] = static_cast<float>(scales[sg[r] + g]);
      b[r] = static_cast<float>(biases[sg[r] + g]);
    }
    float sx[MB];
    for (int m = 0; m < MB; ++m) sx[m] = 0.0f;
    for (int j = 0; j < 4; ++j) {
      float q[RPW][EPW];
      for (int r = 0; r < RPW; ++r)
        for (int i = 0; i < EPW; ++i) q[r][i] = static_cast<float>((wv[r][j] >> (BITS * i)) & MASK);
      for (int m = 0; m < MB; ++m) {
        float xv[EPW];
        for (int i = 0; i < EPW; ++i) {
          xv[i] = static_cast<float>(x[xo[m] + c * VPC + j * EPW + i]);
          sx[m] += xv[i];
        }
        for (int r = 0; r < RPW; ++r) {
          float t = 0.0f;
          for (int i = 0; i < EPW; ++i) t = fma(q[r][i], xv[i], t);
          acc[r][m] = fma(s[r], t, acc[r][m]);
        }
      }
    }
    for (int r = 0; r < RPW; ++r)
      for (int m = 0; m < MB; ++m) acc[r][m] = fma(b[r], sx[m], acc[r][m]);
  }
  for (int r = 0; r < RPW; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = simd_sum(acc[r][m]);
  threadgroup float red[WPB][RPW * MB];
  if (SPLIT == 1) {
    if (lane == 0) {
      for (int r = 0; r < RPW; ++r)
        for (int m = 0; m < MB; ++m)
          if (row0 + r < N && m0 + m < M) out[(size_t)(m0 + m) * N + row0 + r] = static_cast<T>(acc[r][m]);
    }
  } else {
    if (lane == 0) {
      for (int r = 0; r < RPW; ++r)
        for (int m = 0; m < MB; ++m) red[warp][r * MB + m] = acc[r][m];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (part == 0) {
      for (int i = lane; i < RPW * MB; i += 32) {
        const int r = i / MB, m = i % MB;
        float v = 0.0f;
        for (int p = 0; p < SPLIT; ++p) v += red[grp * SPLIT + p][i];
        if (row0 + r < N && m0 + m < M) out[(size_t)(m0 + m) * N + row0 + r] = static_cast<T>(v);
      }
    }
  }
`;

/** The shape of a product: rows of x (M), output features (N), input features (K), bits, group size. */
export interface QmvShape {
  M: number;
  N: number;
  K: number;
  bits: number;
  group_size: number;
}

/** Launch parameters: x rows per block (MB), weight rows per warp (RPW), warps splitting K (SPLIT). */
export interface QmvConfig {
  MB: number;
  RPW: number;
  SPLIT: number;
}

/** Why the kernel cannot take these inputs, or their shape. */
export function qmv_shape([x, w, scales, biases]: readonly (MlxArray | undefined)[]): QmvShape | string {
  if (!x || !w || !scales || !biases) return "needs x, w, scales and biases (affine)";
  if (!isFloating(x.dtype)) return `x must be floating point, got ${x.dtype}`;
  if (x.ndim < 1) return "x must have at least one dimension";
  if (w.dtype !== "uint32" || w.ndim !== 2) return `w must be a 2-D uint32 array, got ${w.describe()}`;
  if (scales.ndim !== 2 || biases.ndim !== 2) return "scales and biases must be 2-D";
  if (!isFloating(scales.dtype) || !isFloating(biases.dtype)) return "scales and biases must be floating point";
  const K = x.shape[x.ndim - 1]!;
  const [N, words] = w.shape as [number, number];
  if (scales.shape[0] !== N || biases.shape[0] !== N || scales.shape[1] !== biases.shape[1]) {
    return `scales ${scales.describe()} / biases ${biases.describe()} do not match w ${w.describe()}`;
  }
  if (K <= 0 || N <= 0) return "empty product";
  const bits = (words * 32) / K;
  if (!QMV_BITS.includes(bits)) return `w ${w.describe()} holds ${+bits.toFixed(2)} bits per value for K = ${K}; the kernel reads ${QMV_BITS.join(", ")}`;
  const group_size = K / scales.shape[1]!;
  if (!QMV_GROUP_SIZES.includes(group_size)) return `group size ${group_size} not one of ${QMV_GROUP_SIZES.join(", ")}`;
  let M = 1;
  for (let i = 0; i < x.ndim - 1; i++) M *= x.shape[i]!;
  if (M === 0) return "x has no rows";
  return { M, N, K, bits, group_size };
}

/**
 * The launch heuristic, from a sweep on the H200 (docs/benchmarks.md): as many warps as the
 * shape allows. Four warps split K wherever a lane still gets most of a chunk (K/VPC ≥ 96), two
 * from 48 chunks; four weight rows per warp up to 4 rows of x, two beyond (registers).
 */
export function qmv_config({ M, K, bits }: QmvShape): QmvConfig {
  const MB = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16;
  const RPW = MB <= 4 ? 4 : 2;
  const chunks = K / (128 / bits);
  const SPLIT = chunks >= 96 ? 4 : chunks >= 48 ? 2 : 1;
  return { MB, RPW, SPLIT };
}

/** Grid, threadgroup and template arguments for a shape and config (exported for the benches). */
export function qmv_launch_of(sh: QmvShape, dtype: MlxArray["dtype"], c: QmvConfig) {
  const groups = WPB / c.SPLIT;
  const blocks = Math.ceil(sh.N / (c.RPW * groups));
  return {
    grid: [blocks * WPB * 32, Math.ceil(sh.M / c.MB), 1] as [number, number, number],
    threadgroup: [WPB * 32, 1, 1] as [number, number, number],
    template: [
      ["T", dtype],
      ["BITS", sh.bits],
      ["GS", sh.group_size],
      ["K", sh.K],
      ["N", sh.N],
      ["MB", c.MB],
      ["RPW", c.RPW],
      ["SPLIT", c.SPLIT],
    ] as [string, number | MlxArray["dtype"]][],
  };
}

/**
 * Sources without indentation and comment lines: MLX builds the whole source string at every call
 * and hashes it at every launch (mlx/backend/cuda/custom_kernel.cpp), so its length is host time.
 */
const compact = (src: string): string =>
  src
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith("//"))
    .join("\n");

export const qmv_kernel = custom_kernel({
  name: "mlxb_qmv",
  input_names: ["x", "w", "scales", "biases"],
  output_names: ["out"],
  metal: { source: compact(METAL) },
  cuda: { source: compact(CUDA), header: compact(HEADER_CUDA) },
  validate: (inputs) => {
    const s = qmv_shape(inputs);
    return typeof s === "string" ? s : null;
  },
  reference: ([x, w, scales, biases], s) => {
    const sh = qmv_shape([x, w, scales, biases]) as QmvShape;
    return [quantized_matmul(x!, w!, scales!, biases!, { group_size: sh.group_size, bits: sh.bits, transpose: true, stream: s })];
  },
  launch: (inputs) => {
    const [x] = inputs;
    const sh = qmv_shape(inputs) as QmvShape;
    return {
      output_shapes: [[...x!.shape.slice(0, -1), sh.N]],
      output_dtypes: [x!.dtype],
      ...qmv_launch_of(sh, x!.dtype, qmv_config(sh)),
    };
  },
});

/**
 * x @ dequantize(w, scales, biases)ᵀ (affine, 4/8 bits, groups 32/64/128; bits and group size
 * follow from the shapes): the kernel on a live GPU backend, mx.quantized_matmul elsewhere.
 */
export function qmv(
  x: MlxArray,
  w: MlxArray,
  scales: MlxArray,
  biases: MlxArray,
  opts: KernelRunOptions & { bits?: number; group_size?: number } = {},
): MlxArray {
  // Bits and group size follow from the shapes; a caller that knows them is checked against them
  // (an x of another width can make the same arrays read as another bit width).
  if (opts.bits !== undefined || opts.group_size !== undefined) {
    const sh = qmv_shape([x, w, scales, biases]);
    if (typeof sh !== "string") {
      const bad =
        opts.bits !== undefined && sh.bits !== opts.bits
          ? `holds ${sh.bits} bits per value, not ${opts.bits}`
          : opts.group_size !== undefined && sh.group_size !== opts.group_size
            ? `has group size ${sh.group_size}, not ${opts.group_size}`
            : null;
      if (bad) throw new MlxError(`kernel mlxb_qmv: w ${w.describe()} with x ${x.describe()} ${bad}`);
    }
  }
  return qmv_kernel.run([x, w, scales, biases], opts)[0]!;
}

// ------------------------------------------------------------------------------------------
// The decode setting: where a quantized linear layer uses the kernel instead of MLX's op.
// ------------------------------------------------------------------------------------------

/**
 * "auto" (the default): on CUDA sm90 (H100/H200), where the exact-order kernel was read from and
 * checked against MLX's SASS, "exact" for 4-bit matrices of at least QMV_EXACT_AUTO_MIN_ELEMENTS
 * weights (where it is the faster kernel: the 12B's large projections, every lm_head), for 8-bit ones
 * of as many weights at 2-7 rows of x (MLX runs its 8-bit qmv once a row there) and the batched
 * rows' fold below; MLX's op elsewhere. "off": MLX's op. "on": the float32-accumulating kernel
 * wherever a GPU source runs (at most QMV_MAX_ROWS rows of x): not a default anywhere, since on the
 * H200 it measured KL 3.3e-3 per token against MLX's op and 0.80× decode tok/s (docs/benchmarks.md).
 * "exact": mlxb_qmv_exact (qmv-exact.ts, MLX's own CUDA arithmetic with wider loads) wherever MLX's
 * CUDA op would run its qmv on sm90 — fewer than 8 rows of bf16 x, 4-bit or 8-bit affine, group
 * size < K (MLX 0.32.4 takes its qmm_sm90 only for group size ≥ K), any size — and MLX's op
 * elsewhere (other architectures may dispatch those shapes to other kernels, so the bits are
 * MLX's there only where MLX also runs its qmv; off sm90 "exact" keeps to one row, N, K ≤ 16384).
 * Bit for bit with MLX's op on an H100 (tools/kernels/check_cuda_kernels.py, KL 0 end to end).
 * On sm90 "auto" and "exact" also give MLX's op batched decode's rows ([B, 1, K], from 8) as one
 * [B, K] matrix: MLX's qmm_sm80 with the same tile and the same bits
 * (tools/bench/device/qmm-fold-check.py), the weights read once instead of B times.
 */
export type FastQmvSetting = "auto" | "on" | "off" | "exact";
/**
 * N and K up to which MLX 0.32's CUDA quantized_matmul runs its qmv for one row on sm90 where its
 * qmm_sm90 applies (group size ≥ K); with group size < K it runs its qmv for any N and K.
 */
const MLX_QMV_MAX_DIM = 16384;
/** Rows (M·B) from which MLX 0.32's CUDA quantized_matmul leaves its qmv for a tiled GEMM. */
const MLX_QMV_ROWS = 8;
/**
 * Rows of x up to which `quantized_linear` takes the kernel: on the H200 it beats MLX's op at
 * M = 1, 2, 4 (MLX launches its matvec once per row) and loses from M = 8, where MLX switches to
 * its tensor-core qmm (docs/benchmarks.md). The kernel itself is correct for any M.
 */
export const QMV_MAX_ROWS = 4;

/**
 * Weight elements (N·K) from which "auto" takes the exact-order kernel: on an H100 its deeper loads
 * win on the 12B's 15-59 M-element matrices (1.2-1.6× on gate/up, down, q; o within 3%) and the
 * 1B's 19 M wide MLPs (1.05×), and lose on the 8-9 M ones (12B k/v 0.83×, 1B gate/up 0.90×), where
 * a block's ramp-up dominates (docs/benchmarks.md, "The exact-order matvec on a GPU").
 */
export const QMV_EXACT_AUTO_MIN_ELEMENTS = 12 * 2 ** 20;

let setting: FastQmvSetting | undefined;
/**
 * on: the float32 kernel; exact: the setting routes calls to the exact-order kernel; exactMin: from
 * how many weight elements; wide: every call MLX's qmv takes (fewer than 8 rows, any N) rather than
 * one row with N, K ≤ 16384, and batched one-position rows from 8 go to MLX's op as one matrix;
 * eightBit: 8-bit weights at one row too (wide takes them from 2 rows).
 */
interface Resolved {
  on: boolean;
  exact: boolean;
  exactMin: number;
  wide: boolean;
  eightBit: boolean;
}
let resolved: Resolved | undefined;

function envSetting(): FastQmvSetting {
  const v = process.env.MLX_BUN_FAST_QMV;
  if (v === undefined || v === "" || v === "auto") return "auto";
  if (v === "1" || v === "on") return "on";
  if (v === "0" || v === "off") return "off";
  if (v === "exact") return "exact";
  throw new Error(`MLX_BUN_FAST_QMV=${v}: expected 0, 1, on, off, exact or auto`);
}

/**
 * Choose the quantized decode path for `quantized_linear` (the model's quantized layers):
 * "auto" (default; MLX_BUN_FAST_QMV=0|1|exact|auto overrides it): the exact-order kernel on CUDA
 * sm90, mx.quantized_matmul elsewhere; "off": mx.quantized_matmul, the path every parity test runs
 * on; "on": the float32 kernel where a GPU source runs; "exact": the exact-order kernel where MLX's
 * CUDA op would run its qmv (FastQmvSetting). `undefined` goes back to the environment variable.
 */
export function set_fast_qmv(s: FastQmvSetting | undefined): void {
  setting = s;
  resolved = undefined;
}

function resolve(): Resolved {
  if (resolved === undefined) {
    const s = setting ?? envSetting();
    const path = select_kernel_path(qmv_kernel.spec, kernel_environment());
    const on = path !== "reference" && s === "on";
    const cuda = select_kernel_path(qmv_exact_kernel.spec, kernel_environment()) === "cuda";
    const auto = s === "auto" && cuda && on_exact_arch();
    // MLX's qmv past one row and 16384 rows of W, and folded batched rows (MLX's GEMM with the same
    // tile): read from MLX's binary (docs/custom-kernels.md), bit for bit with MLX's op on an H100.
    const wide = cuda && (s === "exact" || s === "auto") && on_exact_arch();
    resolved = { on, exact: (cuda && s === "exact") || auto, exactMin: auto ? QMV_EXACT_AUTO_MIN_ELEMENTS : 0, wide, eightBit: wide && s === "exact" };
  }
  return resolved;
}

/** The exact kernel's launch class: the inputs' shapes and whether the staged launch is on (a setting an A/B changes mid-process). */
function exactKey(inputs: readonly MlxArray[]): string {
  return qmv_exact_staged() ? `${inputsKey(inputs)}|staged` : inputsKey(inputs);
}

/** Whether `quantized_linear` takes the kernel in this process (for calls it fits). */
export function fast_qmv_enabled(): boolean {
  const r = resolve();
  return r.on || r.exact;
}

/**
 * A quantized linear layer (nn.QuantizedLinear's op): x @ Wᵀ through the kernel where the
 * setting allows it and the call fits (affine, 4/8 bits, groups 32/64/128, at most
 * QMV_MAX_ROWS rows of x, the default stream on the GPU), mx.quantized_matmul(transpose = true)
 * otherwise.
 */
export function quantized_linear(
  x: MlxArray,
  w: MlxArray,
  scales: MlxArray,
  biases: MlxArray | undefined,
  q: { group_size: number; bits: number; mode?: QuantMode },
  stream?: Stream,
): MlxArray {
  const mode = q.mode ?? "affine";
  const r = resolve();
  if (biases && mode === "affine" && stream === undefined && (q.bits === 4 || q.bits === 8) && QMV_GROUP_SIZES.includes(q.group_size)) {
    const y = r.on || r.exact ? kernelLinear(x, w, scales, biases, q.bits, q.group_size, r) : null;
    if (y) return y;
  }
  const opts = { group_size: q.group_size, bits: q.bits, mode, transpose: true, stream };
  const K = x.shape[x.ndim - 1]!;
  // Batched decode ([B, 1, K]): from 8 rows MLX runs B one-row problems of its qmm_sm80, each
  // reading all of W; as one [B, K] matrix the same kernel with the same tile reads W once.
  if (r.wide && x.ndim >= 3 && x.shape[x.ndim - 2] === 1 && x.size > K) {
    using rows = reshape(x, [x.size / K, K]);
    using y = quantized_matmul(rows, w, scales, biases, opts);
    return reshape(y, [...x.shape.slice(0, -1), y.shape[1]!]);
  }
  return quantized_matmul(x, w, scales, biases, opts);
}

/** The kernel a `quantized_linear` call takes under setting `r`, or null where none fits (MLX's op). */
function kernelLinear(x: MlxArray, w: MlxArray, scales: MlxArray, biases: MlxArray, bits: number, group_size: number, r: Resolved): MlxArray | null {
  const K = x.shape[x.ndim - 1]!;
  const M = x.size / K;
  if (!shapesAgree(x, w, scales, bits, group_size)) return null;
  // First call of a shape: validated and marshalled once, then reused every step. The launches
  // read nothing but the inputs' shapes and dtypes (bits and groups included).
  const inputs = [x, w, scales, biases];
  if (exactTakes(x, w, scales, biases, bits, group_size, w.shape[0]!, r)) return qmv_exact_kernel.runKeyed(inputs, exactKey(inputs))[0]!;
  return r.on && M >= 1 && M <= QMV_MAX_ROWS ? qmv_kernel.runKeyed(inputs, inputsKey(inputs))[0]! : null;
}

/** Whether w and scales have the shapes `bits` and `group_size` give for x: either kernel reads them off the shapes. */
function shapesAgree(x: MlxArray, w: MlxArray, scales: MlxArray, bits: number, group_size: number): boolean {
  const K = x.shape[x.ndim - 1]!;
  return w.ndim === 2 && w.shape[1]! * 32 === K * bits && scales.shape[1]! * group_size === K;
}

/**
 * Whether setting `r` takes the exact-order kernel for x against w, whose rows are a stack of parts
 * of at most `partRows` rows each: only where MLX's own op on each part would run its qmv, whose
 * bits the kernel keeps (a part's rows come out the same whatever N; docs/fused-projections.md).
 */
function exactTakes(x: MlxArray, w: MlxArray, scales: MlxArray, biases: MlxArray, bits: number, group_size: number, partRows: number, r: Resolved): boolean {
  const K = x.shape[x.ndim - 1]!;
  const rows = x.size / K;
  // Where MLX's own op would run its qmv (quantized.cpp's dispatch; docs/custom-kernels.md): one
  // row within 16384 always; below 8 rows whatever N where the group size is below K (no qmm_sm90).
  const oneRow = rows === 1 && partRows <= MLX_QMV_MAX_DIM && K <= MLX_QMV_MAX_DIM;
  const wideQmv = r.wide && rows < MLX_QMV_ROWS && group_size < K;
  // 8-bit (MLX's float-accumulating qmv, bit for bit on an H100) from 2 rows, where MLX launches its
  // qmv once a row (1.3-1.4× on the 12B's gate/up at 2 and 4 rows); at one row MLX's own 8-bit qmv
  // streams as fast, so only when asked for (docs/benchmarks.md).
  const mlxQmv = (bits === 4 && (oneRow || wideQmv)) || (bits === 8 && wideQmv && (r.eightBit || rows > 1));
  return r.exact && mlxQmv && w.shape[0]! * K >= r.exactMin && x.dtype === "bfloat16" && scales.dtype === "bfloat16" && biases.dtype === "bfloat16";
}

/**
 * One matmul over a stack of quantized layers' weights (`w` their rows stacked, each part at most
 * `partRows` rows) whose rows carry each part's own `quantized_linear` bits, or null where the
 * setting would not take the exact-order kernel for it. For stacks taller than MLX's qmv bound
 * (16384 rows), where MLX's op would switch to another kernel and other bits: with the exact-order
 * kernel each row is computed from its row and x alone, as MLX's qmv computes it in the part.
 */
export function quantized_linear_stacked(
  x: MlxArray,
  w: MlxArray,
  scales: MlxArray,
  biases: MlxArray | undefined,
  q: { group_size: number; bits: number; mode?: QuantMode },
  partRows: number,
): MlxArray | null {
  const inputs = exactStack(x, w, scales, biases, q, partRows);
  return inputs && qmv_exact_kernel.runKeyed(inputs, exactKey(inputs))[0]!;
}

/** [x, w, scales, biases] where the setting takes the exact-order kernel for a stack of parts of `partRows` rows, else null. */
function exactStack(...[x, w, scales, biases, q, partRows]: Parameters<typeof quantized_linear_stacked>): MlxArray[] | null {
  if (!biases || (q.mode ?? "affine") !== "affine" || !QMV_GROUP_SIZES.includes(q.group_size)) return null;
  if (!shapesAgree(x, w, scales, q.bits, q.group_size)) return null;
  return exactTakes(x, w, scales, biases, q.bits, q.group_size, partRows, resolve()) ? [x, w, scales, biases] : null;
}

const gegluSwitch = new KernelSwitch("MLX_BUN_QMV_GEGLU");

/**
 * Whether `quantized_linear_geglu` runs (MLX_BUN_QMV_GEGLU=1|0, off by default: on an H100 its output
 * is one bf16 ulp off MLX's compiled GeGLU for ~0.7% of values, docs/custom-kernels.md). `undefined`
 * goes back to the environment variable.
 */
export function set_qmv_exact_geglu(on: boolean | undefined): void {
  gegluSwitch.set(on);
}

/** Whether the fused gate/up + GeGLU launch is on (the setting, else MLX_BUN_QMV_GEGLU read once). */
export function qmv_exact_geglu(): boolean {
  return gegluSwitch.get();
}

/**
 * mlx-lm's `geglu(x @ gateᵀ, x @ upᵀ)` from a gate/up stack (`w` the gate's `partRows` rows over as
 * many up rows) in one launch where the exact-order matvec would take the stack and the fused launch
 * is on (`qmv_exact_geglu`); null otherwise (the caller runs the matvec and its GeGLU).
 */
export function quantized_linear_geglu(...args: Parameters<typeof quantized_linear_stacked>): MlxArray | null {
  const [, w, , , , partRows] = args;
  if (!gegluSwitch.get() || w.shape[0] !== 2 * partRows) return null;
  const inputs = exactStack(...args);
  return inputs && qmv_exact_geglu_kernel.runKeyed(inputs, inputsKey(inputs))[0]!;
}
