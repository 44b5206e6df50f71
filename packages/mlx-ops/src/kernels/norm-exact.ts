// RMSNorm fused with its neighbours in a decode step, keeping MLX's CUDA bits: the q/k/v head norms
// of one layer (or a KV-sharing layer's q alone) with RoPE in one launch, and a residual point
// (branch norm, residual add, optional layer scale, optionally the next block's input norm) in one
// launch instead of two to four. MLX 0.32.4's
// `rms_norm_small` (read from its sm_90a SASS; docs/custom-kernels.md, "MLX's CUDA RMSNorm, as
// compiled") gives one block a row, thread t the 8-value vectors BLOCK·i + t, an FFMA chain per
// thread, a two-level warp butterfly, IEEE division, `+ eps`, `rsqrtf`, then bf16(x·r) times the
// weight in bf16. These kernels use MLX's partition of each row (`norm_partition`) for the sums and
// every one of those roundings (the element-wise work spread over more threads: `norm_threads`), so
// their outputs are meant to be MLX's bits; bit equality with MLX's own ops on
// a GPU is their test (tools/kernels/check_cuda_kernels.py). bf16 only, rows up to 8,192 values.
import type { MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { add, multiply } from "../elementwise.ts";
import { fast } from "../fast.ts";
import { reshape, slice, transpose } from "../shape.ts";
import { on_exact_arch } from "./cuda-arch.ts";
import { type CustomKernel, custom_kernel, inputsKey, kernel_environment, select_kernel_path } from "./kernel.ts";

/** Rows longer than this run MLX's looped `rms_norm` kernel, whose partition these do not model. */
export const NORM_EXACT_MAX_AXIS = 8192;

/** MLX's `dispatch_num_chunks` for bf16 (8 values a thread): threads a block, vectors a thread. */
export function norm_partition(axis: number): { block: number; chunks: number } {
  const nvec = Math.ceil(axis / 8);
  if (axis <= 8 * 64) return { block: 64, chunks: 1 };
  if (nvec % 128 === 0 && nvec / 128 <= 8) return { block: 128, chunks: nvec / 128 };
  if (nvec % 64 === 0 && nvec / 64 <= 8) return { block: 64, chunks: nvec / 64 };
  return { block: 128, chunks: Math.min(8, Math.ceil(nvec / 128)) };
}

/** Values a norm kernel's threads take one each (block size, a multiple of 32 and at least MLX's BLOCK, at most 512). */
export function norm_threads(axis: number): number {
  return Math.max(norm_partition(axis).block, Math.min(512, Math.ceil(axis / 32) * 32));
}

// A block has WIDE threads (norm_threads): each loads, normalizes and stores the values
// e = threadIdx.x + WIDE·m, so the element-wise work is spread over up to 16 warps; only the sum of
// squares keeps MLX's partition, taken by threads t < BLOCK from the row staged in shared memory.
const HEADER_CUDA = `
// A thread's values e = threadIdx.x + WIDE·m (m < EPT, e < A) into the row staged in shared memory.
template <int WIDE, int A, int EPT>
__device__ __forceinline__ void mlxb_row_put(__nv_bfloat16* row, const __nv_bfloat16 (&v)[EPT]) {
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = (int)threadIdx.x + WIDE * m;
    if (e < A) row[e] = v[m];
  }
}
// MLX's reciprocal RMS over a row in shared memory (every thread of the block calls it; it
// synchronizes once): threads t < BLOCK take rms_norm_small's vectors BLOCK·i + t (8 values each,
// none past A) in an FFMA chain in order, then the warp butterfly, lane 0 of each warp to tmp, the
// warp sums butterflied again in every warp, IEEE division by A, + eps, rsqrtf.
template <int BLOCK, int CHUNKS, int A>
__device__ __forceinline__ float mlxb_norm_rscale(const uint4* row, float eps, float* tmp) {
  const int lane = (int)(threadIdx.x & 31u);
  if ((int)threadIdx.x < BLOCK) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
      const int v = BLOCK * i + (int)threadIdx.x;
      if (v * 8 < A) {
        const uint4 q = row[v];
        const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&q);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          // Past A MLX adds 0·0, which leaves the sum as it is.
          if (v * 8 + j < A) {
            const float f = __bfloat162float(x[j]);
            acc = fmaf(f, f, acc);
          }
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) tmp[threadIdx.x >> 5] = acc;
  }
  __syncthreads();
  float acc = lane < BLOCK / 32 ? tmp[lane] : 0.0f;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return rsqrtf(__fadd_rn(__fdiv_rn(acc, (float)A), eps));
}
// MLX's rope_single / rope_single_freqs (non-traditional, forward), split in two: the angle of
// pair p, as read from their sm_90a SASS (docs/custom-kernels.md): IEEE d = p / HALF,
// exp2f(-(d·log2 base)) or the correctly rounded 1/freq, theta = (scale·offset)·inv, cosf and sinf
// (not sincosf, whose zero signs differ);
template <int RD, int ROPE, typename F>
__device__ __forceinline__ void mlxb_rope_angle(int p, float pos, float log2_base, const F* freqs, float& c, float& s) {
  constexpr int HALF = RD / 2;
  const float inv = ROPE == 1 ? exp2f(-__fmul_rn(__fdiv_rn((float)p, (float)HALF), log2_base)) : __frcp_rn((float)freqs[p]);
  const float theta = __fmul_rn(pos, inv);
  c = cosf(theta);
  s = sinf(theta);
}
// and one output of the pair (x1, x2): the x2 product rounded first and the x1 product fused.
__device__ __forceinline__ __nv_bfloat16 mlxb_rope_apply(__nv_bfloat16 x1, __nv_bfloat16 x2, float c, float s, bool first) {
  const float a = __bfloat162float(x1), b = __bfloat162float(x2);
  return __float2bfloat16_rn(first ? __fmaf_rn(a, c, -__fmul_rn(b, s)) : __fmaf_rn(a, s, __fmul_rn(b, c)));
}
// One output: bf16(x·r), then times the weight in bf16 (no weight: MLX multiplies by 1).
__device__ __forceinline__ __nv_bfloat16 mlxb_norm_out(__nv_bfloat16 x, float r, __nv_bfloat16 w, bool weighted) {
  const __nv_bfloat16 y = __float2bfloat16_rn(__bfloat162float(x) * r);
  return weighted ? __hmul_rn(w, y) : y;
}
// One head of a projection's output: src normed by w (none: v) into dst; with ROPE and \`rotate\`
// (q and k), then rotated at pos. A block per head (\`rotate\` is the same for every thread); a
// thread takes values e = threadIdx.x + WIDE·m: it loads its weights and computes its angles while
// its values load, and reads a rotation's partner value from the staged row.
template <int WIDE, int BLOCK, int CHUNKS, int A, int ROPE, int RD, typename F>
__device__ __forceinline__ void mlxb_head_norm(const __nv_bfloat16* src, __nv_bfloat16* dst, const __nv_bfloat16* w, bool rotate, float eps,
                                               float pos, float log2_base, const F* freqs, float* tmp, uint4* row4) {
  constexpr int EPT = (A + WIDE - 1) / WIDE;
  constexpr int HALF = RD / 2;
  __nv_bfloat16* row = reinterpret_cast<__nv_bfloat16*>(row4);
  const bool rot = ROPE != 0 && rotate;
  __nv_bfloat16 xv[EPT], w1[EPT], w2[EPT];
  float c[EPT], s[EPT];
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = (int)threadIdx.x + WIDE * m;
    xv[m] = w1[m] = w2[m] = __float2bfloat16_rn(0.0f);
    c[m] = s[m] = 0.0f;
    if (e < A) {
      xv[m] = src[e];
      const int p = rot && e < RD ? (e < HALF ? e : e - HALF) : e;
      if (w) {
        w1[m] = w[p];
        if (rot && e < RD) w2[m] = w[p + HALF];
      }
      if (rot && e < RD) mlxb_rope_angle<RD, ROPE>(p, pos, log2_base, freqs, c[m], s[m]);
    }
  }
  mlxb_row_put<WIDE, A, EPT>(row, xv);
  __syncthreads();
  const float r = mlxb_norm_rscale<BLOCK, CHUNKS, A>(row4, eps, tmp);
  const bool weighted = w != nullptr;
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = (int)threadIdx.x + WIDE * m;
    if (e >= A) continue;
    if (rot && e < RD) {
      const int p = e < HALF ? e : e - HALF;
      const __nv_bfloat16 x1 = mlxb_norm_out(row[p], r, w1[m], weighted);
      const __nv_bfloat16 x2 = mlxb_norm_out(row[p + HALF], r, w2[m], weighted);
      dst[e] = mlxb_rope_apply(x1, x2, c[m], s[m], e < HALF);
    } else {
      dst[e] = mlxb_norm_out(xv[m], r, w1[m], weighted);
    }
  }
}
`;

// What a heads kernel takes once per block: shared scratch (the head's row, the warp sums), eps,
// and the position and base of RoPE.
const HEADS_PRELUDE_CUDA = `
  __shared__ float tmp[32];
  __shared__ uint4 row4[(A + 7) / 8];
  const float eps = __uint_as_float((unsigned)EPS_BITS);
  const float pos = ROPE != 0 ? __fmul_rn(__uint_as_float((unsigned)SCALE_BITS), (float)offset[0]) : 0.0f;
  const float log2_base = __uint_as_float((unsigned)BASE_BITS);
`;

const QKV_CUDA = `${HEADS_PRELUDE_CUDA}
  constexpr int HT = HQ + 2 * HK;
  const int row = (int)blockIdx.x / HT, h = (int)blockIdx.x % HT;
  const __nv_bfloat16* src = x + (size_t)row * ((HQ + HK + HV) * A);
  __nv_bfloat16* dst;
  const __nv_bfloat16* w;
  if (h < HQ) {
    src += h * A; dst = q + ((size_t)row * HQ + h) * A; w = q_w;
  } else if (h < HQ + HK) {
    src += h * A; dst = k + ((size_t)row * HK + h - HQ) * A; w = k_w;
  } else {
    const int vh = h - HQ - HK;
    src += (HV ? HQ + HK + vh : HQ + vh) * A; dst = v + ((size_t)row * HK + vh) * A; w = nullptr;
  }
  mlxb_head_norm<WIDE, BLOCK, CHUNKS, A, ROPE, RD>(src, dst, w, h < HQ + HK, eps, pos, log2_base, freqs, tmp, row4);
`;

// The queries alone (a KV-sharing layer's projection): a block per q head.
const Q_CUDA = `${HEADS_PRELUDE_CUDA}
  const size_t head = (size_t)blockIdx.x * A;
  mlxb_head_norm<WIDE, BLOCK, CHUNKS, A, ROPE, RD>(x + head, q + head, q_w, true, eps, pos, log2_base, freqs, tmp, row4);
`;

// h + rms_norm(y, post_w), times the scale where HAS_SCALE, to h_out; with NEXT, then the sum's
// norm by next_w to n_out. Every input a thread needs is loaded before the first sum.
const residualSource = (next: boolean): string => `
  constexpr int EPT = (A + WIDE - 1) / WIDE;
  __shared__ float tmp[32];
  __shared__ uint4 row4[(A + 7) / 8];
  __nv_bfloat16* row = reinterpret_cast<__nv_bfloat16*>(row4);
  const float eps = __uint_as_float((unsigned)EPS_BITS);
  const size_t base = (size_t)blockIdx.x * A;
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
  __nv_bfloat16 yv[EPT], hv[EPT], pw[EPT], nw[EPT];
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = (int)threadIdx.x + WIDE * m;
    yv[m] = hv[m] = pw[m] = nw[m] = zero;
    if (e < A) {
      yv[m] = y[base + e];
      hv[m] = h[base + e];
      pw[m] = post_w[e];
      ${next ? "nw[m] = next_w[e];" : ""}
    }
  }
  const __nv_bfloat16 sc = HAS_SCALE ? scale[0] : zero;
  mlxb_row_put<WIDE, A, EPT>(row, yv);
  __syncthreads();
  const float r1 = mlxb_norm_rscale<BLOCK, CHUNKS, A>(row4, eps, tmp);
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = (int)threadIdx.x + WIDE * m;
    __nv_bfloat16 s = __hadd_rn(hv[m], mlxb_norm_out(yv[m], r1, pw[m], true));
    if (HAS_SCALE) s = __hmul_rn(s, sc);
    yv[m] = s;
    if (e < A) h_out[base + e] = s;
  }
${
  next
    ? `  // mlxb_norm_rscale's barrier came after every read of the row: it can take the sums now.
  mlxb_row_put<WIDE, A, EPT>(row, yv);
  // The warp sums of the first norm are read by then too (every thread read them before this barrier).
  __syncthreads();
  const float r2 = mlxb_norm_rscale<BLOCK, CHUNKS, A>(row4, eps, tmp);
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = (int)threadIdx.x + WIDE * m;
    if (e < A) n_out[base + e] = mlxb_norm_out(yv[m], r2, nw[m], true);
  }
`
    : ""
}
`;

/** Head counts of a fused q/k/v projection's output: `hv` 0 where v is k (k = v attention). */
export interface QkvHeads {
  hq: number;
  hk: number;
  hv: number;
  dim: number;
  eps: number;
  /**
   * RoPE on q and k after their norms (mx.fast.rope, non-traditional, one position: x is a single
   * row): `dims` rotated, `base` or float32 `freqs` input, `scale`. Outputs are then [1, heads, 1, dim].
   */
  rope?: { dims: number; base: number | null; scale: number };
}

/** The queries alone (a KV-sharing layer's q projection): QkvHeads without k and v. */
export type QHeads = Omit<QkvHeads, "hk" | "hv">;

/** float32 bits of a number (template arguments are integers). */
function f32Bits(v: number): number {
  const b = new DataView(new ArrayBuffer(4));
  b.setFloat32(0, v);
  return b.getInt32(0);
}

const isVector = (a: MlxArray, n: number): boolean => a.dtype === "bfloat16" && a.ndim === 1 && a.shape[0] === n;

function qkvCheck([x, qw, kw, offset, freqs]: readonly MlxArray[], p: QkvHeads): string | null {
  const { hq, hk, hv, dim } = p;
  for (const [name, v] of Object.entries({ hq, hk, dim })) if (!Number.isInteger(v) || v < 1) return `${name} = ${v} must be a positive integer`;
  if (hv !== 0 && hv !== hk) return `hv = ${hv} must be 0 (v is k) or hk = ${hk}`;
  const width = (hq + hk + hv) * dim;
  const bad = rowCheck(x!, dim, width, `(${hq} + ${hk} + ${hv}) heads × ${dim}`);
  if (bad) return bad;
  if (!isVector(qw!, dim) || !isVector(kw!, dim)) return `q and k norm weights must be [${dim}] bfloat16, got ${qw!.describe()} and ${kw!.describe()}`;
  return p.rope ? ropeCheck(x!, offset!, freqs!, p.rope, dim) : null;
}

function qCheck([x, qw, offset, freqs]: readonly MlxArray[], p: QHeads): string | null {
  const { hq, dim } = p;
  for (const [name, v] of Object.entries({ hq, dim })) if (!Number.isInteger(v) || v < 1) return `${name} = ${v} must be a positive integer`;
  const bad = rowCheck(x!, dim, hq * dim, `${hq} heads × ${dim}`);
  if (bad) return bad;
  if (!isVector(qw!, dim)) return `the q norm weight must be [${dim}] bfloat16, got ${qw!.describe()}`;
  return p.rope ? ropeCheck(x!, offset!, freqs!, p.rope, dim) : null;
}

/** x: bf16 rows of `width` values (`what` says how they split into heads), heads of `dim` values. */
function rowCheck(x: MlxArray, dim: number, width: number, what: string): string | null {
  if (dim > NORM_EXACT_MAX_AXIS) return `head dim ${dim} is over ${NORM_EXACT_MAX_AXIS}`;
  if (x.dtype !== "bfloat16") return `x must be bfloat16, got ${x.dtype}`;
  if (x.ndim < 1 || x.shape.at(-1) !== width) return `x ${x.describe()} must end in ${width} = ${what}`;
  return null;
}

function ropeCheck(x: MlxArray, offset: MlxArray, freqs: MlxArray, r: NonNullable<QkvHeads["rope"]>, dim: number): string | null {
  if (x.size !== x.shape.at(-1)) return `RoPE needs one row of x (one position), got ${x.describe()}`;
  if (!Number.isInteger(r.dims) || r.dims < 2 || r.dims % 2 !== 0 || r.dims > dim) return `rope dims ${r.dims} must be even and at most ${dim}`;
  if (offset.dtype !== "int32" || offset.size !== 1) return `offset must be one int32, got ${offset.describe()}`;
  if (r.base === null && (freqs.dtype !== "float32" || freqs.ndim !== 1 || freqs.shape[0] !== r.dims / 2))
    return `freqs must be [${r.dims / 2}] float32, got ${freqs.describe()}`;
  if (!(r.scale > 0) || (r.base !== null && !(r.base > 0))) return `rope scale ${r.scale} and base ${r.base} must be positive`;
  return null;
}

function qkvReference([x, qw, kw, offset, freqs]: readonly MlxArray[], p: QkvHeads, s?: Stream): MlxArray[] {
  const lead = x!.shape.slice(0, -1);
  const { hq, hk, hv, dim, eps } = p;
  const part = (start: number, heads: number): MlxArray => {
    using v = slice(x!, [...lead.map(() => 0), start * dim], [...lead, (start + heads) * dim], undefined, s);
    return reshape(v, [...lead, heads, dim], s);
  };
  using q0 = part(0, hq);
  using k0 = part(hq, hk);
  using v0 = part(hv ? hq + hk : hq, hk);
  const normed = [fast.rms_norm(q0, qw!, eps, s), fast.rms_norm(k0, kw!, eps, s), fast.rms_norm(v0, null, eps, s)];
  return p.rope ? normed.map((a, i) => rotated(a, i < 2, p.rope!, offset!, freqs!, s)) : normed;
}

function qReference([x, qw, offset, freqs]: readonly MlxArray[], p: QHeads, s?: Stream): MlxArray[] {
  using q0 = reshape(x!, [...x!.shape.slice(0, -1), p.hq, p.dim], s);
  const q = fast.rms_norm(q0, qw!, p.eps, s);
  return [p.rope ? rotated(q, true, p.rope, offset!, freqs!, s) : q];
}

/** The model's order after the norms: transpose `a` (taken) to [B, heads, L, dim], then RoPE where `rope`. */
function rotated(a: MlxArray, rope: boolean, r: NonNullable<QkvHeads["rope"]>, offset: MlxArray, freqs: MlxArray, s?: Stream): MlxArray {
  using t = a;
  const heads = transpose(t, [0, 2, 1, 3], s);
  if (!rope) return heads;
  using hd = heads;
  const opts = r.base === null ? { freqs, scale: r.scale, offset } : { base: r.base, scale: r.scale, offset };
  return fast.rope(hd, r.dims, { traditional: false, ...opts, stream: s });
}

/** Kernels keyed by their constants (heads, eps, RoPE): one spec each, built on first use (same name and source). */
const kernels = new Map<string, CustomKernel>();

function cachedKernel(key: string, make: () => CustomKernel): CustomKernel {
  let k = kernels.get(key);
  if (!k) kernels.set(key, (k = make()));
  return k;
}

export function qkv_norm_kernel(p: QkvHeads): CustomKernel {
  return cachedKernel(`qkv ${p.hq},${p.hk},${p.hv},${p.dim},${p.eps},${ropeKey(p)}`, () => qkvSpec(p));
}

export function q_norm_kernel(p: QHeads): CustomKernel {
  return cachedKernel(`q ${p.hq},${p.dim},${p.eps},${ropeKey(p)}`, () => qSpec(p));
}

const ropeKey = (p: QHeads): string => (p.rope ? `${p.rope.dims},${p.rope.base},${p.rope.scale}` : "");

/** A block over rows of `axis` values: its threads (norm_threads) and the template arguments of the row's size and MLX's partition. */
function rowLaunch(axis: number): { wide: number; template: [string, number][] } {
  const { block, chunks } = norm_partition(axis);
  const wide = norm_threads(axis);
  return {
    wide,
    template: [
      ["A", axis],
      ["WIDE", wide],
      ["BLOCK", block],
      ["CHUNKS", chunks],
    ],
  };
}

/** The template arguments both heads kernels take: the head's row (rowLaunch), eps and RoPE. */
function headsTemplate(p: QHeads): [string, number][] {
  const r = p.rope;
  return [
    ...rowLaunch(p.dim).template,
    ["EPS_BITS", f32Bits(p.eps)],
    ["ROPE", r ? (r.base === null ? 2 : 1) : 0],
    ["RD", r?.dims ?? 2],
    ["SCALE_BITS", f32Bits(r?.scale ?? 1)],
    // MLX passes std::log2 of the float base (glibc's correctly rounded log2f).
    ["BASE_BITS", f32Bits(r?.base ? Math.log2(Math.fround(r.base)) : 1)],
  ];
}

function qkvSpec(p: QkvHeads): CustomKernel {
  const { wide } = rowLaunch(p.dim);
  return custom_kernel({
    name: "mlxb_qkv_norm_exact",
    input_names: ["x", "q_w", "k_w", "offset", "freqs"],
    output_names: ["q", "k", "v"],
    cuda: { source: QKV_CUDA, header: HEADER_CUDA, direct: true },
    validate: (inputs) => qkvCheck(inputs, p),
    reference: (inputs, s) => qkvReference(inputs, p, s),
    launch: ([x]) => {
      const lead = x!.shape.slice(0, -1);
      const rows = x!.size / x!.shape.at(-1)!;
      const shape = (heads: number) => (p.rope ? [1, heads, 1, p.dim] : [...lead, heads, p.dim]);
      return {
        output_shapes: [shape(p.hq), shape(p.hk), shape(p.hk)],
        output_dtypes: ["bfloat16", "bfloat16", "bfloat16"],
        grid: [rows * (p.hq + 2 * p.hk) * wide, 1, 1],
        threadgroup: [wide, 1, 1],
        template: [["HQ", p.hq], ["HK", p.hk], ["HV", p.hv], ...headsTemplate(p)],
      };
    },
  });
}

function qSpec(p: QHeads): CustomKernel {
  const { wide } = rowLaunch(p.dim);
  return custom_kernel({
    name: "mlxb_q_norm_exact",
    input_names: ["x", "q_w", "offset", "freqs"],
    output_names: ["q"],
    cuda: { source: Q_CUDA, header: HEADER_CUDA, direct: true },
    validate: (inputs) => qCheck(inputs, p),
    reference: (inputs, s) => qReference(inputs, p, s),
    launch: ([x]) => {
      const rows = x!.size / x!.shape.at(-1)!;
      return {
        output_shapes: [p.rope ? [1, p.hq, 1, p.dim] : [...x!.shape.slice(0, -1), p.hq, p.dim]],
        output_dtypes: ["bfloat16"],
        grid: [rows * p.hq * wide, 1, 1],
        threadgroup: [wide, 1, 1],
        template: headsTemplate(p),
      };
    },
  });
}

/**
 * The q, k and v head norms of a fused q/k/v projection's output `x` [..., (hq + hk + hv)·dim]:
 * q = rms_norm(q heads, qw), k = rms_norm(k heads, kw), v = rms_norm(v heads) (no weight; the k
 * heads where hv = 0), each [..., heads, dim]; with `p.rope`, q and k then rotated at `offset`
 * (one int32; `freqs` where `p.rope.base` is null), all three [1, heads, 1, dim]. One launch on
 * CUDA, MLX's ops in the model's order elsewhere.
 */
export function qkv_norm_exact(
  x: MlxArray,
  qw: MlxArray,
  kw: MlxArray,
  p: QkvHeads,
  rope: { offset: MlxArray; freqs?: MlxArray } | null = null,
  stream?: Stream,
): [MlxArray, MlxArray, MlxArray] {
  const inputs = qkvInputs(x, qw, kw, rope);
  const [q, k, v] = qkv_norm_kernel(p).runKeyed(inputs, inputsKey(inputs), { stream });
  return [q!, k!, v!];
}

/** Whether `qkv_norm_exact` takes these arguments (a caller that would rather use MLX's ops than an error). */
export function qkv_norm_fits(x: MlxArray, qw: MlxArray, kw: MlxArray, p: QkvHeads, rope: { offset: MlxArray; freqs?: MlxArray } | null = null): boolean {
  return qkvCheck(qkvInputs(x, qw, kw, rope), p) === null;
}

// Unused inputs (no RoPE, or a base instead of freqs) take a stand-in the kernel does not read.
function qkvInputs(x: MlxArray, qw: MlxArray, kw: MlxArray, rope: { offset: MlxArray; freqs?: MlxArray } | null): MlxArray[] {
  return [x, qw, kw, rope?.offset ?? qw, rope?.freqs ?? qw];
}

/**
 * The head norms of a q projection's output `x` [..., hq·dim]: rms_norm(heads, qw), [..., hq, dim];
 * with `p.rope`, then rotated at `offset` (one int32; `freqs` where `p.rope.base` is null),
 * [1, hq, 1, dim]. One launch on CUDA, MLX's ops in the model's order elsewhere.
 */
export function q_norm_exact(x: MlxArray, qw: MlxArray, p: QHeads, rope: { offset: MlxArray; freqs?: MlxArray } | null = null, stream?: Stream): MlxArray {
  const inputs = [x, qw, rope?.offset ?? qw, rope?.freqs ?? qw];
  return q_norm_kernel(p).runKeyed(inputs, inputsKey(inputs), { stream })[0]!;
}

/** Whether `q_norm_exact` takes these arguments (a caller that would rather use MLX's ops than an error). */
export function q_norm_fits(x: MlxArray, qw: MlxArray, p: QHeads, rope: { offset: MlxArray; freqs?: MlxArray } | null = null): boolean {
  return qCheck([x, qw, rope?.offset ?? qw, rope?.freqs ?? qw], p) === null;
}

/** A residual point: `h + rms_norm(y, postW)`, optionally times `scale`, and with `next` that sum's norm by `nextW`. */
export interface ResidualNorm {
  eps: number;
  /** Multiply the sum by the 1-element `scale` input (Gemma's layer scalar). */
  scaled: boolean;
  /** Also the sum's norm by the `next_w` input (the next block's input norm): outputs [h', n], else [h']. */
  next: boolean;
}

/** The inputs by name: with `next`, h, y, post_w, next_w, scale; without, no next_w. */
function residualInputs(inputs: readonly MlxArray[], p: ResidualNorm): { h: MlxArray; y: MlxArray; postW: MlxArray; nextW: MlxArray | null; scale: MlxArray } {
  const [h, y, postW] = inputs as [MlxArray, MlxArray, MlxArray];
  return p.next ? { h, y, postW, nextW: inputs[3]!, scale: inputs[4]! } : { h, y, postW, nextW: null, scale: inputs[3]! };
}

function residualCheck(inputs: readonly MlxArray[], p: ResidualNorm): string | null {
  const { h, y, postW, nextW, scale } = residualInputs(inputs, p);
  if (h.dtype !== "bfloat16" || y.dtype !== "bfloat16") return `h and y must be bfloat16, got ${h.dtype} and ${y.dtype}`;
  if (h.shape.join() !== y.shape.join()) return `h ${h.describe()} and y ${y.describe()} must have one shape`;
  const a = h.shape.at(-1) ?? 0;
  if (h.ndim < 1 || a < 1 || a > NORM_EXACT_MAX_AXIS) return `the last axis of h ${h.describe()} must hold 1 to ${NORM_EXACT_MAX_AXIS} values`;
  if (!isVector(postW, a) || (nextW && !isVector(nextW, a)))
    return `norm weights must be [${a}] bfloat16, got ${[postW, ...(nextW ? [nextW] : [])].map((w) => w.describe()).join(" and ")}`;
  if (p.scaled && (scale.dtype !== "bfloat16" || scale.size !== 1)) return `scale must be one bfloat16 value, got ${scale.describe()}`;
  return null;
}

function residualReference(inputs: readonly MlxArray[], p: ResidualNorm, s?: Stream): MlxArray[] {
  const { h, y, postW, nextW, scale } = residualInputs(inputs, p);
  using yn = fast.rms_norm(y, postW, p.eps, s);
  const sum = add(h, yn, s);
  let out = sum;
  if (p.scaled) {
    out = multiply(sum, scale, s);
    sum.dispose();
  }
  return nextW ? [out, fast.rms_norm(out, nextW, p.eps, s)] : [out];
}

export function residual_norm_kernel(p: ResidualNorm): CustomKernel {
  return cachedKernel(`residual ${p.eps},${p.scaled},${p.next}`, () => residualSpec(p));
}

function residualSpec(p: ResidualNorm): CustomKernel {
  return custom_kernel({
    name: p.next ? "mlxb_residual_norm_exact" : "mlxb_residual_exact",
    input_names: p.next ? ["h", "y", "post_w", "next_w", "scale"] : ["h", "y", "post_w", "scale"],
    output_names: p.next ? ["h_out", "n_out"] : ["h_out"],
    cuda: { source: residualSource(p.next), header: HEADER_CUDA, direct: true },
    validate: (inputs) => residualCheck(inputs, p),
    reference: (inputs, s) => residualReference(inputs, p, s),
    launch: ([h]) => {
      const a = h!.shape.at(-1)!;
      const row = rowLaunch(a);
      return {
        output_shapes: p.next ? [h!.shape, h!.shape] : [h!.shape],
        output_dtypes: p.next ? ["bfloat16", "bfloat16"] : ["bfloat16"],
        grid: [(h!.size / a) * row.wide, 1, 1],
        threadgroup: [row.wide, 1, 1],
        template: [...row.template, ["EPS_BITS", f32Bits(p.eps)], ["HAS_SCALE", p.scaled]],
      };
    },
  });
}

/**
 * [h', n] for a residual point: h' = h + rms_norm(y, postW) (times `scale` where given), n =
 * rms_norm(h', nextW); MLX's ops in that order, one launch on CUDA.
 */
export function residual_norm_exact(
  h: MlxArray,
  y: MlxArray,
  postW: MlxArray,
  nextW: MlxArray,
  scale: MlxArray | null,
  eps: number,
  stream?: Stream,
): [MlxArray, MlxArray] {
  // Without a scale, a stand-in the kernel does not read (HAS_SCALE false).
  const inputs = [h, y, postW, nextW, scale ?? postW];
  const [hOut, n] = residual_norm_kernel({ eps, scaled: scale !== null, next: true }).runKeyed(inputs, inputsKey(inputs), { stream });
  return [hOut!, n!];
}

/** Whether `residual_norm_exact` takes these arguments (a caller that would rather use MLX's ops than an error). */
export function residual_norm_fits(h: MlxArray, y: MlxArray, postW: MlxArray, nextW: MlxArray, scale: MlxArray | null): boolean {
  return residualCheck([h, y, postW, nextW, scale ?? postW], { eps: 0, scaled: scale !== null, next: true }) === null;
}

/** h + rms_norm(y, postW) (times `scale` where given): MLX's ops in that order, one launch on CUDA. */
export function residual_exact(h: MlxArray, y: MlxArray, postW: MlxArray, scale: MlxArray | null, eps: number, stream?: Stream): MlxArray {
  const inputs = [h, y, postW, scale ?? postW];
  return residual_norm_kernel({ eps, scaled: scale !== null, next: false }).runKeyed(inputs, inputsKey(inputs), { stream })[0]!;
}

/** Whether `residual_exact` takes these arguments. */
export function residual_fits(h: MlxArray, y: MlxArray, postW: MlxArray, scale: MlxArray | null): boolean {
  return residualCheck([h, y, postW, scale ?? postW], { eps: 0, scaled: scale !== null, next: false }) === null;
}

/**
 * Whether the model's norms take these kernels (and a plain cache's attention at scale 1 skips MLX's
 * multiply by 1: sdpa-unit-scale.ts, the same kind of launch cut): "auto" (the default) where the CUDA source runs on
 * sm90 (H100/H200), the architecture whose MLX SASS they reproduce and were checked against bit for
 * bit; "on" where the CUDA source runs on any architecture; "off" MLX's ops; "always" the kernels
 * everywhere (their reference composition where no CUDA runs, for tests of the routing on any machine).
 */
export type ExactNormsSetting = "auto" | "on" | "off" | "always";
const NORMS_SETTINGS: readonly string[] = ["auto", "on", "off", "always"];

let normsSetting: ExactNormsSetting | undefined;
let normsOn: boolean | undefined;

/** Choose for this process; undefined goes back to MLX_BUN_EXACT_NORMS (default "auto"). */
export function set_exact_norms(s: ExactNormsSetting | undefined): void {
  if (s !== undefined && !NORMS_SETTINGS.includes(s)) throw new Error(`set_exact_norms: expected "auto", "on", "off" or "always", got ${String(s)}`);
  normsSetting = s;
  normsOn = undefined;
}

/** Whether the model routes its norms through these kernels in this process (ExactNormsSetting). */
export function exact_norms_enabled(): boolean {
  if (normsOn === undefined) {
    const v = normsSetting ?? (process.env.MLX_BUN_EXACT_NORMS || "auto");
    if (!NORMS_SETTINGS.includes(v)) throw new Error(`MLX_BUN_EXACT_NORMS=${v}: expected auto, on, off or always`);
    const probe = residual_norm_kernel({ eps: 1e-6, scaled: false, next: true }).spec;
    const cuda = select_kernel_path(probe, kernel_environment()) === "cuda";
    normsOn = v === "always" || (v === "on" && cuda) || (v === "auto" && cuda && on_exact_arch());
  }
  return normsOn;
}
