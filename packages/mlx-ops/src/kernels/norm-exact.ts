// RMSNorm fused with its neighbours in a decode step, keeping MLX's CUDA bits: the q/k/v head norms
// of one layer in one launch, and a residual point (branch norm, residual add, optional layer
// scale, the next block's input norm) in one launch instead of three or four. MLX 0.32.4's
// `rms_norm_small` (read from its sm_90a SASS; docs/custom-kernels.md, "MLX's CUDA RMSNorm, as
// compiled") gives one block a row, thread t the 8-value vectors BLOCK·i + t, an FFMA chain per
// thread, a two-level warp butterfly, IEEE division, `+ eps`, `rsqrtf`, then bf16(x·r) times the
// weight in bf16. These kernels use MLX's partition of each row (`norm_partition`) and every one of
// those roundings, so their outputs are meant to be MLX's bits; bit equality with MLX's own ops on
// a GPU is their test (tools/kernels/check_cuda_kernels.py). bf16 only, rows up to 8,192 values.
import type { MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { add, multiply } from "../elementwise.ts";
import { fast } from "../fast.ts";
import { reshape, slice } from "../shape.ts";
import { custom_kernel, inputsKey, kernel_environment, select_kernel_path } from "./kernel.ts";

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

/** eps as MLX holds it (a float32), by its bits: template arguments are integers. */
function epsBits(eps: number): number {
  const b = new DataView(new ArrayBuffer(4));
  b.setFloat32(0, eps);
  return b.getInt32(0);
}

const HEADER_CUDA = `
// A row's values as rms_norm_small holds them: thread t, vector BLOCK·i + t, 8 values; zeros past A.
template <int BLOCK, int CHUNKS, int A>
__device__ __forceinline__ void mlxb_norm_load(const __nv_bfloat16* x, __nv_bfloat16 (&v)[CHUNKS][8]) {
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int e = (BLOCK * i + (int)threadIdx.x) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[i][j] = e + j < A ? x[e + j] : __float2bfloat16_rn(0.0f);
  }
}
// MLX's reciprocal RMS: FFMA chain in order, warp butterfly, lane 0 of each warp to shared memory,
// the warp sums butterflied again, then IEEE division by A, + eps, rsqrtf.
template <int BLOCK, int CHUNKS, int A>
__device__ __forceinline__ float mlxb_norm_rscale(const __nv_bfloat16 (&v)[CHUNKS][8], float eps, float* tmp) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = __bfloat162float(v[i][j]);
      acc = fmaf(f, f, acc);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (BLOCK > 32) {
    const int lane = (int)(threadIdx.x & 31u);
    if (lane == 0) tmp[threadIdx.x >> 5] = acc;
    __syncthreads();
    acc = lane < BLOCK / 32 ? tmp[lane] : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  }
  return rsqrtf(__fadd_rn(__fdiv_rn(acc, (float)A), eps));
}
// One output: bf16(x·r), then times the weight in bf16 (no weight: MLX multiplies by 1).
__device__ __forceinline__ __nv_bfloat16 mlxb_norm_out(__nv_bfloat16 x, float r, const __nv_bfloat16* w, int e) {
  const __nv_bfloat16 y = __float2bfloat16_rn(__bfloat162float(x) * r);
  return w ? __hmul_rn(w[e], y) : y;
}
`;

const QKV_CUDA = `
  constexpr int HT = HQ + 2 * HK;
  __shared__ float tmp[BLOCK / 32];
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
  __nv_bfloat16 vals[CHUNKS][8];
  mlxb_norm_load<BLOCK, CHUNKS, A>(src, vals);
  const float r = mlxb_norm_rscale<BLOCK, CHUNKS, A>(vals, __uint_as_float((unsigned)EPS_BITS), tmp);
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int e = (BLOCK * i + (int)threadIdx.x) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) if (e + j < A) dst[e + j] = mlxb_norm_out(vals[i][j], r, w, e + j);
  }
`;

const RESIDUAL_CUDA = `
  __shared__ float tmp1[BLOCK / 32];
  __shared__ float tmp2[BLOCK / 32];
  const float eps = __uint_as_float((unsigned)EPS_BITS);
  const size_t base = (size_t)blockIdx.x * A;
  __nv_bfloat16 vals[CHUNKS][8];
  mlxb_norm_load<BLOCK, CHUNKS, A>(y + base, vals);
  const float r1 = mlxb_norm_rscale<BLOCK, CHUNKS, A>(vals, eps, tmp1);
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int e = (BLOCK * i + (int)threadIdx.x) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (e + j < A) {
        __nv_bfloat16 s = __hadd_rn(h[base + e + j], mlxb_norm_out(vals[i][j], r1, post_w, e + j));
        if (HAS_SCALE) s = __hmul_rn(s, scale[0]);
        h_out[base + e + j] = s;
        vals[i][j] = s;
      }
    }
  }
  const float r2 = mlxb_norm_rscale<BLOCK, CHUNKS, A>(vals, eps, tmp2);
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int e = (BLOCK * i + (int)threadIdx.x) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) if (e + j < A) n_out[base + e + j] = mlxb_norm_out(vals[i][j], r2, next_w, e + j);
  }
`;

/** Head counts of a fused q/k/v projection's output: `hv` 0 where v is k (k = v attention). */
export interface QkvHeads {
  hq: number;
  hk: number;
  hv: number;
  dim: number;
  eps: number;
}

const isVector = (a: MlxArray, n: number): boolean => a.dtype === "bfloat16" && a.ndim === 1 && a.shape[0] === n;

function qkvCheck([x, qw, kw]: readonly MlxArray[], p: QkvHeads): string | null {
  const { hq, hk, hv, dim } = p;
  for (const [name, v] of Object.entries({ hq, hk, dim })) if (!Number.isInteger(v) || v < 1) return `${name} = ${v} must be a positive integer`;
  if (hv !== 0 && hv !== hk) return `hv = ${hv} must be 0 (v is k) or hk = ${hk}`;
  if (dim > NORM_EXACT_MAX_AXIS) return `head dim ${dim} is over ${NORM_EXACT_MAX_AXIS}`;
  if (x!.dtype !== "bfloat16") return `x must be bfloat16, got ${x!.dtype}`;
  const width = (hq + hk + hv) * dim;
  if (x!.ndim < 1 || x!.shape.at(-1) !== width) return `x ${x!.describe()} must end in ${width} = (${hq} + ${hk} + ${hv}) heads × ${dim}`;
  if (!isVector(qw!, dim) || !isVector(kw!, dim)) return `q and k norm weights must be [${dim}] bfloat16, got ${qw!.describe()} and ${kw!.describe()}`;
  return null;
}

function qkvReference([x, qw, kw]: readonly MlxArray[], p: QkvHeads, s?: Stream): MlxArray[] {
  const lead = x!.shape.slice(0, -1);
  const { hq, hk, hv, dim, eps } = p;
  const part = (start: number, heads: number): MlxArray => {
    using v = slice(x!, [...lead.map(() => 0), start * dim], [...lead, (start + heads) * dim], undefined, s);
    return reshape(v, [...lead, heads, dim], s);
  };
  using q0 = part(0, hq);
  using k0 = part(hq, hk);
  using v0 = part(hv ? hq + hk : hq, hk);
  return [fast.rms_norm(q0, qw!, eps, s), fast.rms_norm(k0, kw!, eps, s), fast.rms_norm(v0, null, eps, s)];
}

/** Kernels keyed by their constants (heads, eps): one spec each, built on first use (same name and source). */
const qkvKernels = new Map<string, ReturnType<typeof custom_kernel>>();

export function qkv_norm_kernel(p: QkvHeads): ReturnType<typeof custom_kernel> {
  const key = `${p.hq},${p.hk},${p.hv},${p.dim},${p.eps}`;
  let k = qkvKernels.get(key);
  if (k) return k;
  const { block, chunks } = norm_partition(p.dim);
  k = custom_kernel({
    name: "mlxb_qkv_norm_exact",
    input_names: ["x", "q_w", "k_w"],
    output_names: ["q", "k", "v"],
    cuda: { source: QKV_CUDA, header: HEADER_CUDA },
    validate: (inputs) => qkvCheck(inputs, p),
    reference: (inputs, s) => qkvReference(inputs, p, s),
    launch: ([x]) => {
      const lead = x!.shape.slice(0, -1);
      const rows = x!.size / x!.shape.at(-1)!;
      return {
        output_shapes: [
          [...lead, p.hq, p.dim],
          [...lead, p.hk, p.dim],
          [...lead, p.hk, p.dim],
        ],
        output_dtypes: ["bfloat16", "bfloat16", "bfloat16"],
        grid: [rows * (p.hq + 2 * p.hk) * block, 1, 1],
        threadgroup: [block, 1, 1],
        template: [
          ["HQ", p.hq],
          ["HK", p.hk],
          ["HV", p.hv],
          ["A", p.dim],
          ["BLOCK", block],
          ["CHUNKS", chunks],
          ["EPS_BITS", epsBits(p.eps)],
        ],
      };
    },
  });
  qkvKernels.set(key, k);
  return k;
}

/**
 * The q, k and v head norms of a fused q/k/v projection's output `x` [..., (hq + hk + hv)·dim]:
 * q = rms_norm(q heads, qw), k = rms_norm(k heads, kw), v = rms_norm(v heads) (no weight; the k
 * heads where hv = 0), each [..., heads, dim]. One launch on CUDA, MLX's ops elsewhere.
 */
export function qkv_norm_exact(x: MlxArray, qw: MlxArray, kw: MlxArray, p: QkvHeads, stream?: Stream): [MlxArray, MlxArray, MlxArray] {
  const inputs = [x, qw, kw];
  const [q, k, v] = qkv_norm_kernel(p).runKeyed(inputs, inputsKey(inputs), { stream });
  return [q!, k!, v!];
}

/** A residual point: `h + rms_norm(y, postW)`, optionally times `scale`, and that sum's norm by `nextW`. */
export interface ResidualNorm {
  eps: number;
  /** Multiply the sum by the 1-element `scale` input (Gemma's layer scalar). */
  scaled: boolean;
}

function residualCheck([h, y, postW, nextW, scale]: readonly MlxArray[], scaled: boolean): string | null {
  if (h!.dtype !== "bfloat16" || y!.dtype !== "bfloat16") return `h and y must be bfloat16, got ${h!.dtype} and ${y!.dtype}`;
  if (h!.shape.join() !== y!.shape.join()) return `h ${h!.describe()} and y ${y!.describe()} must have one shape`;
  const a = h!.shape.at(-1) ?? 0;
  if (h!.ndim < 1 || a < 1 || a > NORM_EXACT_MAX_AXIS) return `the last axis of h ${h!.describe()} must hold 1 to ${NORM_EXACT_MAX_AXIS} values`;
  if (!isVector(postW!, a) || !isVector(nextW!, a)) return `norm weights must be [${a}] bfloat16, got ${postW!.describe()} and ${nextW!.describe()}`;
  if (scaled && (scale!.dtype !== "bfloat16" || scale!.size !== 1)) return `scale must be one bfloat16 value, got ${scale!.describe()}`;
  return null;
}

function residualReference([h, y, postW, nextW, scale]: readonly MlxArray[], p: ResidualNorm, s?: Stream): MlxArray[] {
  using yn = fast.rms_norm(y!, postW!, p.eps, s);
  const sum = add(h!, yn, s);
  let out = sum;
  if (p.scaled) {
    out = multiply(sum, scale!, s);
    sum.dispose();
  }
  return [out, fast.rms_norm(out, nextW!, p.eps, s)];
}

const residualKernels = new Map<string, ReturnType<typeof custom_kernel>>();

export function residual_norm_kernel(p: ResidualNorm): ReturnType<typeof custom_kernel> {
  const key = `${p.eps},${p.scaled}`;
  let k = residualKernels.get(key);
  if (k) return k;
  k = custom_kernel({
    name: "mlxb_residual_norm_exact",
    input_names: ["h", "y", "post_w", "next_w", "scale"],
    output_names: ["h_out", "n_out"],
    cuda: { source: RESIDUAL_CUDA, header: HEADER_CUDA },
    validate: (inputs) => residualCheck(inputs, p.scaled),
    reference: (inputs, s) => residualReference(inputs, p, s),
    launch: ([h]) => {
      const a = h!.shape.at(-1)!;
      const { block, chunks } = norm_partition(a);
      return {
        output_shapes: [h!.shape, h!.shape],
        output_dtypes: ["bfloat16", "bfloat16"],
        grid: [(h!.size / a) * block, 1, 1],
        threadgroup: [block, 1, 1],
        template: [
          ["A", a],
          ["BLOCK", block],
          ["CHUNKS", chunks],
          ["EPS_BITS", epsBits(p.eps)],
          ["HAS_SCALE", p.scaled],
        ],
      };
    },
  });
  residualKernels.set(key, k);
  return k;
}

/**
 * [h', n] for a residual point: h' = h + rms_norm(y, postW) (times `scale` where given), n =
 * rms_norm(h', nextW); MLX's ops in that order, one launch on CUDA. Without a scale any
 * 1-element bf16 array may stand in for it (it is not read).
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
  const inputs = [h, y, postW, nextW, scale ?? postW];
  const [hOut, n] = residual_norm_kernel({ eps, scaled: scale !== null }).runKeyed(inputs, inputsKey(inputs), { stream });
  return [hOut!, n!];
}

/**
 * Whether the model's norms take these kernels: "on" where the CUDA source runs (MLX's ops
 * elsewhere), "off" (MLX's ops), "always" (the kernels everywhere: their reference composition
 * where no CUDA runs, for tests of the routing on any machine).
 */
export type ExactNormsSetting = "on" | "off" | "always";

let normsSetting: ExactNormsSetting | undefined;
let normsOn: boolean | undefined;

/** Choose for this process; undefined goes back to MLX_BUN_EXACT_NORMS (default "off"). */
export function set_exact_norms(s: ExactNormsSetting | undefined): void {
  if (s !== undefined && s !== "on" && s !== "off" && s !== "always") throw new Error(`set_exact_norms: expected "on", "off" or "always", got ${String(s)}`);
  normsSetting = s;
  normsOn = undefined;
}

/** Whether the model routes its norms through these kernels in this process (ExactNormsSetting). */
export function exact_norms_enabled(): boolean {
  if (normsOn === undefined) {
    const v = normsSetting ?? (process.env.MLX_BUN_EXACT_NORMS || "off");
    if (v !== "on" && v !== "off" && v !== "always") throw new Error(`MLX_BUN_EXACT_NORMS=${v}: expected on, off or always`);
    const probe = residual_norm_kernel({ eps: 1e-6, scaled: false }).spec;
    normsOn = v === "always" || (v === "on" && select_kernel_path(probe, kernel_environment()) === "cuda");
  }
  return normsOn;
}
