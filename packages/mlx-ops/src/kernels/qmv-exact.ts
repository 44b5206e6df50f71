// MLX's own CUDA matrix-vector product for a few rows of x, arithmetic for arithmetic, with wider and
// deeper loads: 4-bit or 8-bit affine weights, bfloat16 activations, groups of 32/64/128. MLX 0.32.4's
// `qmv_kernel` (read from its sm_90a SASS; docs/custom-kernels.md, "MLX's CUDA matvec, as
// compiled") gives each lane 16 (4-bit) or 8 (8-bit) elements of every 512- or 256-wide chunk of K,
// rounds each weight to bf16 by one fused q·s + b, keeps one accumulator an element (bf16 for 4-bit,
// float32 for 8-bit) updated by a fused x·w + acc, sums them in float32 in order, reduces the warp
// by a butterfly and rounds once. This kernel keeps that map and every rounding, so its outputs are
// meant to be MLX's bits; what changes is the memory side: 8-byte weight and 16-byte activation
// loads (MLX: 4-byte words), CH chunks' loads issued before any is used (MLX: one chunk at a
// time, K a runtime loop bound), K being a template, and up to 7 rows of x against one load of the
// weights (MLX: one row a block, each reading them again).
// Bit equality with mx.quantized_matmul is the kernel's test on a GPU (tools/kernels/
// check_cuda_kernels.py; 4-bit and 8-bit passed on an H100, and teacher-forced KL 0 end to end);
// MLX 0.32.4 takes this product for fewer than 8 rows of x where the group size is below K
// (docs/custom-kernels.md). quantized_linear (qmv.ts) routes 4-bit calls with fewer than 8 rows
// here by default on sm90 for matrices of ≥ 12 M weights, or every call MLX would run through its
// qmv with MLX_BUN_FAST_QMV=exact (8-bit included: as fast as MLX's own there, not faster).
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import { gelu_approx, multiply } from "../elementwise.ts";
import { quantized_matmul } from "../quantized.ts";
import { split } from "../shape.ts";
import { type CustomKernel, custom_kernel, KernelSwitch } from "./kernel.ts";

/** Group sizes MLX's qmv instantiates. */
export const QMV_EXACT_GROUP_SIZES: readonly number[] = [32, 64, 128];
/** Widths the kernel takes (MLX's qmv for 4-bit and for 8-bit differ in lane width and accumulators). */
export const QMV_EXACT_BITS: readonly number[] = [4, 8];
/** Output rows per block (one warp each), as MLX's `rows_per_block`. */
const ROWS = 8;
/** Chunks (512 values of K each at 4 bits, 256 at 8) whose loads a lane issues before using the first (template CH;
 * the order of the arithmetic does not depend on it, so neither do the bits). */
export const QMV_EXACT_CHUNKS = 4;
/** Rows of x a block takes against one load of the weights (MLX runs its qmv below 8 rows). */
const EXACT_BLOCK_ROWS = 7;
/** Largest row of x (bytes) the staged launch keeps in shared memory (48 KB of static shared memory a block). */
export const QMV_EXACT_STAGE_MAX_BYTES = 40 * 1024;
/** Blocks a staged launch aims at: about one wave of 8-warp blocks on an H100/H200 (132 SMs, ~4 blocks each). */
const STAGE_TARGET_BLOCKS = 512;
/** Most rows of w a staged warp takes. */
const STAGE_MAX_RPW = 8;

const stagedSwitch = new KernelSwitch("MLX_BUN_QMV_STAGED");

/**
 * Whether one-row calls take the staged launch (x in shared memory, RPW rows of w a warp, the next
 * loads issued across rows): MLX_BUN_QMV_STAGED=1|0, off by default: slower than the plain launch on every bench shape on an H100 (docs/benchmarks.md). The bits
 * are the same either way. `undefined` goes back to the environment variable.
 */
export function set_qmv_exact_staged(on: boolean | undefined): void {
  stagedSwitch.set(on);
}

/** Whether the staged launch is on (the setting, else MLX_BUN_QMV_STAGED read once). */
export function qmv_exact_staged(): boolean {
  return stagedSwitch.get();
}

/**
 * The staged launch's shape for R rows of x a block against N rows of w of K values: XS 1 and the
 * rows a warp takes (the fewest, a power of two up to STAGE_MAX_RPW, that bring the grid to about
 * one wave), or XS 0 (one row a warp, x from global memory) where it does not apply.
 */
export function qmv_exact_stage(R: number, N: number, K: number, on: boolean = qmv_exact_staged()): { xs: 0 | 1; rpw: number } {
  if (!on || R !== 1 || K * 2 > QMV_EXACT_STAGE_MAX_BYTES) return { xs: 0, rpw: 1 };
  let rpw = 1;
  while (rpw < STAGE_MAX_RPW && Math.ceil(N / (ROWS * rpw)) > STAGE_TARGET_BLOCKS) rpw *= 2;
  return { xs: 1, rpw };
}

const HEADER_CUDA = `
// The accumulator type: bf16 pairs for 4-bit, float for 8-bit (as MLX's qmv).
template <int B> struct mlxb_qmvx_acc { typedef __nv_bfloat162 type; };
template <> struct mlxb_qmvx_acc<8> { typedef float type; };
// Overloads on the accumulator type keep the body free of branches on it.
__device__ __forceinline__ void mlxb_qmvx_zero(__nv_bfloat162& a) { a = __floats2bfloat162_rn(0.0f, 0.0f); }
__device__ __forceinline__ void mlxb_qmvx_zero(float& a) { a = 0.0f; }
// The lane's sum in element order (a pair: its low element, then its high one).
__device__ __forceinline__ float mlxb_qmvx_add(float sum, __nv_bfloat162 a) { return (sum + __low2float(a)) + __high2float(a); }
__device__ __forceinline__ float mlxb_qmvx_add(float sum, float a) { return sum + a; }
// 4-bit: a lane's 16 weights of one chunk (one group), each rounded to bf16 by MLX's fused q·s + b.
__device__ __forceinline__ void mlxb_qmvx_weights4(uint2 wq, __nv_bfloat16 s, __nv_bfloat16 b, __nv_bfloat162* w2) {
  const __nv_bfloat162 s2 = __halves2bfloat162(s, s);
  const __nv_bfloat162 b2 = __halves2bfloat162(b, b);
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.0f, 128.0f);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    // Elements 2j (low nibble) and 2j + 1 (high nibble) of byte j; 0x4300 | q is the bf16 128 + q.
    const uint32_t byte = ((j < 4 ? wq.x : wq.y) >> (8 * (j & 3))) & 0xffu;
    const uint32_t qq = 0x43004300u | (byte & 0xfu) | ((byte >> 4) << 16);
    const __nv_bfloat162 q2 = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&qq), k128);
    w2[j] = __hfma2(q2, s2, b2);
  }
}
// 8-bit: a lane's 8 weights of one chunk, the same fused q·s + b in bf16 (a byte is exact in bf16).
__device__ __forceinline__ void mlxb_qmvx_weights8(uint2 wq, __nv_bfloat16 s, __nv_bfloat16 b, __nv_bfloat162* w2) {
  const __nv_bfloat162 s2 = __halves2bfloat162(s, s);
  const __nv_bfloat162 b2 = __halves2bfloat162(b, b);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t word = j < 2 ? wq.x : wq.y;
    const int sh = 16 * (j & 1);
    // A byte as a float without I2F (as MLX): 0x4B0000qq is 2^23 + q, less 2^23 exactly.
    const float q0 = __uint_as_float(0x4B000000u | ((word >> sh) & 0xffu)) - 8388608.0f;
    const float q1 = __uint_as_float(0x4B000000u | ((word >> (sh + 8)) & 0xffu)) - 8388608.0f;
    w2[j] = __hfma2(__floats2bfloat162_rn(q0, q1), s2, b2);
  }
}
// 4-bit, one row of x against them: 16 activations, MLX's fused x·w + acc into the lane's 16 bf16 accumulators.
__device__ __forceinline__ void mlxb_qmvx_accumulate(uint4 xa, uint4 xb, const __nv_bfloat162* w2, __nv_bfloat162* acc) {
  const uint32_t xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&xs[j]), w2[j], acc[j]);
}
// 8-bit, one row: 8 activations (xa; xb unused) and weights promoted to float, MLX's float32 fused x·w + acc.
__device__ __forceinline__ void mlxb_qmvx_accumulate(uint4 xa, uint4, const __nv_bfloat162* w2, float* acc) {
  const uint32_t xs[4] = {xa.x, xa.y, xa.z, xa.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 x2 = *reinterpret_cast<const __nv_bfloat162*>(&xs[j]);
    acc[2 * j] = __fmaf_rn(__low2float(x2), __low2float(w2[j]), acc[2 * j]);
    acc[2 * j + 1] = __fmaf_rn(__high2float(x2), __high2float(w2[j]), acc[2 * j + 1]);
  }
}
`;

// A row's output (`gate`: the same row of the gate part in the GLU form). The plain form writes
// the row as it is; the GLU form's header (GEGLU_HEADER_CUDA) defines it as mlx-lm's geglu, so
// the plain source carries none of it (MLX hashes a kernel's whole source at every launch).
const PLAIN_HEADER_CUDA = `
__device__ __forceinline__ __nv_bfloat16 mlxb_qmvx_out(__nv_bfloat16, __nv_bfloat16 y) { return y; }
`;
const GEGLU_HEADER_CUDA = `
#include "mlx/backend/cuda/device/binary_ops.cuh"
#include "mlx/backend/cuda/device/unary_ops.cuh"
// mlx-lm's geglu(gate, up) = gelu_approx(gate) · up as MLX 0.32's compile runs it on CUDA (two fused
// kernels, by their ncu names: 0.044715·x³, then the rest): every op through MLX's own functor on
// bf16 values in the tape's order, the constants Python's floats in bf16 (docs/custom-kernels.md).
__device__ __forceinline__ __nv_bfloat16 mlxb_geglu_exact(__nv_bfloat16 x, __nv_bfloat16 up) {
  using namespace mlx::core::cu;
  typedef __nv_bfloat16 T;
  const T cube = Multiply{}(T(0.044715f), Power{}(x, T(3.0f)));
  const T inner = Multiply{}(T(0.7978845608028654f), Add{}(x, cube));
  const T gelu = Multiply{}(Multiply{}(T(0.5f), x), Add{}(T(1.0f), Tanh{}(inner)));
  return Multiply{}(gelu, up);
}
__device__ __forceinline__ __nv_bfloat16 mlxb_qmvx_out(__nv_bfloat16 gate, __nv_bfloat16 up) { return mlxb_geglu_exact(gate, up); }
`;

// BITS 4: 16 values a lane (chunks of 512), bf16 accumulators; BITS 8: 8 a lane (chunks of 256),
// float32 accumulators (MLX's qmv_kernel<8, 16, …> and qmv_kernel<8, 8, …>). Either way a lane
// reads 8 bytes of weights a chunk.
const CUDA = `
  constexpr int E = BITS == 4 ? 16 : 8;
  constexpr int CW = 32 * E;
  constexpr int NC = (K + CW - 1) / CW;
  const int lane = (int)(threadIdx.x & 31u);
  const int n = w_shape[0];
  if constexpr (XS) {
    // Staged (one row of x, R = 1): the block copies x to shared memory once, and each warp takes
    // RPW rows of w, row i being (blockIdx.x · RPW + i) · ${ROWS} + warp. Its (row, chunk) pairs
    // run in order, CH at a time, the next CH's weight loads issued before the current CH is
    // used, across rows too, so the loads never drain between rows. Each row's arithmetic is the
    // unstaged path's: the same chunks in the same order into the same accumulators.
    __shared__ uint4 xs4[XS ? K / 8 : 1];  // uint4: 16-byte aligned rows of 8 values
    const __nv_bfloat16* xsm = reinterpret_cast<const __nv_bfloat16*>(xs4);
    const int warp = (int)(threadIdx.x >> 5);
    constexpr int NS = RPW * NC;
    constexpr int NG = (NS + CH - 1) / CH;
    const int rowBase = (int)blockIdx.x * RPW * ${ROWS} + warp;
    const uint8_t* w8 = reinterpret_cast<const uint8_t*>(w);
    uint2 wq[2][CH];
    __nv_bfloat16 sv[2][CH], bv[2][CH];
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      const int sl = u;
      const int rw = rowBase + (sl / NC) * ${ROWS};
      const int idx = (sl % NC) * CW + lane * E;
      if (sl < NS && rw < n && idx < K) {
        wq[0][u] = *reinterpret_cast<const uint2*>(w8 + (size_t)rw * (K * BITS / 8) + idx * BITS / 8);
        sv[0][u] = scales[(size_t)rw * (K / GS) + idx / GS];
        bv[0][u] = biases[(size_t)rw * (K / GS) + idx / GS];
      }
    }
    {
      const uint4* xg = reinterpret_cast<const uint4*>(x + (size_t)blockIdx.y * K);
      for (int i = (int)threadIdx.x; i < K / 8; i += (int)blockDim.x) xs4[i] = xg[i];
    }
    __syncthreads();
    typename mlxb_qmvx_acc<BITS>::type acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) mlxb_qmvx_zero(acc[j]);
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const int cur = g & 1;
      if (g + 1 < NG) {
#pragma unroll
        for (int u = 0; u < CH; ++u) {
          const int sl = (g + 1) * CH + u;
          const int rw = rowBase + (sl / NC) * ${ROWS};
          const int idx = (sl % NC) * CW + lane * E;
          if (sl < NS && rw < n && idx < K) {
            wq[cur ^ 1][u] = *reinterpret_cast<const uint2*>(w8 + (size_t)rw * (K * BITS / 8) + idx * BITS / 8);
            sv[cur ^ 1][u] = scales[(size_t)rw * (K / GS) + idx / GS];
            bv[cur ^ 1][u] = biases[(size_t)rw * (K / GS) + idx / GS];
          }
        }
      }
#pragma unroll
      for (int u = 0; u < CH; ++u) {
        const int sl = g * CH + u;
        if (sl < NS) {
          const int rw = rowBase + (sl / NC) * ${ROWS};
          const int idx = (sl % NC) * CW + lane * E;
          if (rw < n && idx < K) {
            __nv_bfloat162 w2[8];
            if constexpr (BITS == 4) mlxb_qmvx_weights4(wq[cur][u], sv[cur][u], bv[cur][u], w2);
            else mlxb_qmvx_weights8(wq[cur][u], sv[cur][u], bv[cur][u], w2);
            const uint4 xa = *reinterpret_cast<const uint4*>(xsm + idx);
            const uint4 xb = BITS == 4 ? *reinterpret_cast<const uint4*>(xsm + idx + 8) : uint4{0u, 0u, 0u, 0u};
            mlxb_qmvx_accumulate(xa, xb, w2, acc);
          }
          if (sl % NC == NC - 1) {
            // The row's last chunk: the unstaged path's sum and butterfly, then fresh accumulators.
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) sum = mlxb_qmvx_add(sum, acc[j]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (lane == 0 && rw < n) out[(size_t)blockIdx.y * n + rw] = __float2bfloat16_rn(sum);
#pragma unroll
            for (int j = 0; j < 8; ++j) mlxb_qmvx_zero(acc[j]);
          }
        }
      }
    }
    return;
  }
  // GLU: w stacks gate rows over up rows; a warp takes gate row \`row\` and up row \`row + n / 2\`,
  // each with the arithmetic of any row, and writes the geglu of their bf16 outputs (n / 2 columns).
  const int nOut = GLU ? n / 2 : n;
  const int row = (int)blockIdx.x * ${ROWS} + (int)(threadIdx.x >> 5);
  if (row >= nOut) return;
  // R rows of x a block (grid y: the groups of R), each against the same weights, loaded once.
  const __nv_bfloat16* xr = x + (size_t)blockIdx.y * R * K;
  __nv_bfloat16 gate[R];
#pragma unroll 1
  for (int half = 0; half < (GLU ? 2 : 1); ++half) {
    const int wrow = row + half * nOut;
    const uint8_t* wr = reinterpret_cast<const uint8_t*>(w) + (size_t)wrow * (K * BITS / 8);
    const __nv_bfloat16* sr = scales + (size_t)wrow * (K / GS);
    const __nv_bfloat16* br = biases + (size_t)wrow * (K / GS);
    typename mlxb_qmvx_acc<BITS>::type acc[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j) mlxb_qmvx_zero(acc[r][j]);
    // Chunks of CW values in order; the last is partial where K % CW ≠ 0 (MLX's residue: the
    // lanes whose E values start below K take it).
#pragma unroll
    for (int r0 = 0; r0 < NC; r0 += CH) {
      uint2 wq[CH];
      uint4 xa[CH], xb[CH];
      __nv_bfloat16 s[CH], b[CH];
      bool live[CH];
#pragma unroll
      for (int u = 0; u < CH; ++u) {
        const int idx = (r0 + u) * CW + lane * E;
        live[u] = r0 + u < NC && idx < K;
        if (live[u]) {
          wq[u] = *reinterpret_cast<const uint2*>(wr + idx * BITS / 8);
          xa[u] = *reinterpret_cast<const uint4*>(xr + idx);
          xb[u] = BITS == 4 ? *reinterpret_cast<const uint4*>(xr + idx + 8) : uint4{0u, 0u, 0u, 0u};
          s[u] = sr[idx / GS];
          b[u] = br[idx / GS];
        }
      }
#pragma unroll
      for (int u = 0; u < CH; ++u) {
        if (live[u]) {
          const int idx = (r0 + u) * CW + lane * E;
          __nv_bfloat162 w2[8];
          if constexpr (BITS == 4) mlxb_qmvx_weights4(wq[u], s[u], b[u], w2);
          else mlxb_qmvx_weights8(wq[u], s[u], b[u], w2);
          mlxb_qmvx_accumulate(xa[u], xb[u], w2, acc[0]);
#pragma unroll
          for (int r = 1; r < R; ++r) {
            const __nv_bfloat16* xm = xr + (size_t)r * K + idx;
            const uint4 x1 = BITS == 4 ? *reinterpret_cast<const uint4*>(xm + 8) : uint4{0u, 0u, 0u, 0u};
            mlxb_qmvx_accumulate(*reinterpret_cast<const uint4*>(xm), x1, w2, acc[r]);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // The lane's accumulators in element order, in float32 from 0 (MLX: 0 + a0 + a1 + …).
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum = mlxb_qmvx_add(sum, acc[r][j]);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      const __nv_bfloat16 y = __float2bfloat16_rn(sum);
      if (GLU && half == 0) gate[r] = y;
      else if (lane == 0) out[((size_t)blockIdx.y * R + r) * nOut + row] = GLU ? mlxb_qmvx_out(gate[r], y) : y;
    }
  }
`;

interface Shape {
  M: number;
  N: number;
  K: number;
  group_size: number;
  bits: number;
}

function shapeOf([x, w, scales, biases]: readonly MlxArray[]): Shape | string {
  if (x!.dtype !== "bfloat16") return `x must be bfloat16, got ${x!.dtype}`;
  if (x!.ndim < 1) return "x needs a last axis";
  if (w!.dtype !== "uint32" || w!.ndim !== 2) return `w must be 2-D uint32 (4- or 8-bit packed), got ${w!.describe()}`;
  const K = x!.shape.at(-1)!;
  const [N, words] = w!.shape as [number, number];
  // The bits a value are the row's 32-bit words over K: 4 or 8.
  const bits = QMV_EXACT_BITS.find((b) => words * 32 === K * b);
  if (bits === undefined) return `w ${w!.describe()} does not hold ${K} 4-bit or 8-bit values a row`;
  if (K % 16 !== 0 || K < 16) return `K = ${K} must be a positive multiple of 16`;
  for (const a of [scales!, biases!]) {
    if (a.dtype !== "bfloat16" || a.ndim !== 2 || a.shape[0] !== N) return `scales and biases must be [${N}, groups] bfloat16, got ${a.describe()}`;
  }
  if (biases!.shape[1] !== scales!.shape[1]) return "scales and biases disagree in groups";
  const group_size = K / scales!.shape[1]!;
  if (!QMV_EXACT_GROUP_SIZES.includes(group_size)) return `group size ${group_size} not one of ${QMV_EXACT_GROUP_SIZES.join(", ")}`;
  const M = x!.size / K;
  if (M < 1) return "x has no rows";
  // One row of x per grid row past EXACT_BLOCK_ROWS (CUDA's grid y is at most 65,535).
  if (M > 65535) return `x has ${M} rows, more than 65535`;
  return { M, N, K, group_size, bits };
}

/**
 * The exact-order matvec's spec; with `glu`, the gate/up matvec with the GeGLU after it in one
 * launch: w stacks the gate rows over as many up rows, out [..., N / 2] = geglu(x @ gateᵀ, x @ upᵀ),
 * each product's rows MLX's qmv bits and the geglu mlx-lm's compiled one as MLX's CUDA backend runs
 * it (every op MLX's functor, in bf16).
 */
function qmvExactSpec(glu: boolean): CustomKernel {
  return custom_kernel({
    name: glu ? "mlxb_qmv_exact_geglu" : "mlxb_qmv_exact",
    input_names: ["x", "w", "scales", "biases"],
    output_names: ["out"],
    // No Metal source: MLX's Metal qmv rounds elsewhere (float accumulation per simdgroup).
    // Direct launches for the plain form (bit for bit with MLX's path on an H100); the GLU form
    // includes MLX's JIT functors, which only MLX's path has.
    cuda: { source: CUDA, header: HEADER_CUDA + (glu ? GEGLU_HEADER_CUDA : PLAIN_HEADER_CUDA), direct: !glu },
    validate: (inputs) => {
      const s = shapeOf(inputs);
      if (typeof s === "string") return s;
      return !glu || s.N % 2 === 0 ? null : `w has ${s.N} rows: a gate/up stack needs as many up rows as gate rows`;
    },
    reference: ([x, w, scales, biases], stream) => {
      const { N, group_size, bits } = shapeOf([x!, w!, scales!, biases!]) as Shape;
      const y = quantized_matmul(x!, w!, scales!, biases!, { group_size, bits, transpose: true, stream });
      if (!glu) return [y];
      using both = y;
      const [g, u] = split(both, [N / 2], -1, stream) as [MlxArray, MlxArray];
      using gate = g;
      using up = u;
      using a = gelu_approx(gate, stream);
      return [multiply(a, up, stream)];
    },
    launch: (inputs) => {
      const x = inputs[0]!;
      const { M, N, K, group_size, bits } = shapeOf(inputs) as Shape;
      // Up to EXACT_BLOCK_ROWS rows of x in one block (the weights read once), else one a grid row.
      const R = M <= EXACT_BLOCK_ROWS ? M : 1;
      // The staged launch has no GLU form.
      const { xs, rpw } = glu ? { xs: 0, rpw: 1 } : qmv_exact_stage(R, N, K);
      const outRows = glu ? N / 2 : N;
      return {
        output_shapes: [[...x.shape.slice(0, -1), outRows]],
        output_dtypes: ["bfloat16"],
        grid: [Math.ceil(outRows / (ROWS * rpw)) * ROWS * 32, M / R, 1],
        threadgroup: [ROWS * 32, 1, 1],
        template: [
          ["K", K],
          ["GS", group_size],
          ["R", R],
          ["BITS", bits],
          ["CH", QMV_EXACT_CHUNKS],
          ["XS", xs],
          ["RPW", rpw],
          ["GLU", glu ? 1 : 0],
        ],
      };
    },
  });
}

export const qmv_exact_kernel = qmvExactSpec(false);
export const qmv_exact_geglu_kernel = qmvExactSpec(true);

/** x @ dequantize(w)ᵀ through the kernel on the GPU (its reference, MLX's op, elsewhere). */
export function qmv_exact(x: MlxArray, w: MlxArray, scales: MlxArray, biases: MlxArray): MlxArray {
  return qmv_exact_kernel.run([x, w, scales, biases])[0]!;
}
