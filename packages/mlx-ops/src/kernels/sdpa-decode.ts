// Decode attention in two launches with the rounding points of MLX's composition. Where MLX composes
// attention from ops (CUDA heads over 128: Gemma 4's 256 and 512) a decode step costs four launches a
// layer (cuBLAS's pointer set-up and batched q·kᵀ, the precise softmax, p·v). These two kernels keep
// every rounding of that composition — scores rounded to the dtype, softmax in float32 with MLX's
// __expf and its multiply by 1/Σ, probabilities rounded to the dtype, p·v accumulated in float32 and
// rounded once — and differ from it only in the order of float32 sums (MLX's gemv's and cuBLAS's), so a
// value may move by one unit in the last place of the dtype. Not MLX's bits, and on the bench models
// that is enough to miss the KL bar: off by default (docs/custom-kernels.md, "Decode attention at
// MLX's rounding points").
import type { MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { pad, reshape, slice } from "../shape.ts";
import { type CustomKernel, custom_kernel, kernel_environment, select_kernel_path } from "./kernel.ts";
import { composed_attention, composed_scores } from "./sdpa-unit-scale.ts";

/** Keys a call may attend: past it a block's serial walk over the values costs more than MLX's four launches save. */
export const SDPA_DECODE_MAX_KEYS = 1024;
/** Query heads × head dim of one KV head's group, as float32 in one block's 32 KB of shared memory. */
const MAX_GROUP_VALUES = 8192;
/** Output elements a block of the second kernel takes (8 lanes a token, 8 elements a lane). */
const CHUNK = 64;
const WARPS = 8;
/** Tokens a block of the first kernel scores (TOK / WARPS a warp). */
const TOK = 32;

// The scores buffer has room for SDPA_DECODE_MAX_KEYS keys whatever T (only the first T are
// written): its shape, the grids and so both launches are the same every step of a context, so a
// launch is prepared once per layer shape (CustomKernel.runKeyed), not per step.
// Grid: x = blocks of TOK tokens (those past T return at once), y = b·Hkv. q of the KV head's REP query heads in shared memory as
// [r][i][lane] (lane l holds elements l·EK..l·EK+EK-1: conflict-free reads); a warp takes TOK / WARPS
// keys, its lanes EK elements each, every head's dot product summed by a butterfly, rounded to T.
const SCORES_CUDA = `
  constexpr int EK = D / 32;
  const int tid = (int)threadIdx.x;
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int HKV = k_shape[1];
  const int TL = k_shape[2];
  const int t0 = (int)blockIdx.x * TOK;
  if (t0 >= TL) return;
  const int bh = (int)blockIdx.y;
  const int b = bh / HKV;
  const int h = bh - b * HKV;
  // The warp's TOK / WARPS keys: every load issued first (before q is
  // staged, which they overlap), then each key's dot products in turn.
  constexpr int KPW = TOK / WARPS;
  float kf[KPW][EK];
#pragma unroll
  for (int j = 0; j < KPW; ++j) {
    const int t = t0 + wid + j * WARPS;
    const int64_t kr = (int64_t)b * k_strides[0] + (int64_t)h * k_strides[1] + (int64_t)(t < TL ? t : TL - 1) * k_strides[2];
#pragma unroll
    for (int i = 0; i < EK; ++i) kf[j][i] = static_cast<float>(k[kr + (int64_t)(lane * EK + i) * k_strides[3]]);
  }
  __shared__ float qs[REP * D];
  for (int e = tid; e < REP * D; e += WARPS * 32) {
    const int r = e / D;
    const int d = e - r * D;
    const int64_t qi = (int64_t)b * q_strides[0] + (int64_t)(h * REP + r) * q_strides[1] + (int64_t)d * q_strides[3];
    qs[(r * EK + d % EK) * 32 + d / EK] = static_cast<float>(q[qi]);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < KPW; ++j) {
    const int t = t0 + wid + j * WARPS;
    if (t >= TL) break;
    // Heads two at a time: fully unrolled, 16 heads of 512 took all 255 registers.
#pragma unroll 2
    for (int r = 0; r < REP; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < EK; ++i) acc += qs[(r * EK + i) * 32 + lane] * kf[j][i];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (lane == 0) s[((int64_t)b * HKV * REP + h * REP + r) * MAXK + t] = static_cast<T>(acc);
    }
  }
`;

// Grid: x = DV / CHUNK blocks, y = b·Hq. The row's max and Σ __expf(s − max) over the block, then
// p = T(__expf(s − max) · (1/Σ)) as MLX's softmax writes it; a warp takes 4 tokens at a time (8
// lanes each, 8 elements a lane; a lane's next U tokens' loads in flight together), float32 sums
// over the warp's tokens, the 4 lane groups and the 8 warps in a fixed order, one rounding to T.
const VALUES_CUDA = `
  const int tid = (int)threadIdx.x;
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int TL = v_shape[2];
  const int HQ = s_shape[1];
  const int row = (int)blockIdx.y;
  const int b = row / HQ;
  const int hq = row - b * HQ;
  const int h = hq / REP;
  const T* sr = s + (int64_t)b * s_strides[0] + (int64_t)hq * s_strides[1];
  const int64_t ss = s_strides[2];
  __shared__ float red[WARPS];
  __shared__ float part[WARPS][CHUNK];
  float rmax = -cuda::std::numeric_limits<float>::infinity();
  for (int t = tid; t < TL; t += WARPS * 32) rmax = fmaxf(rmax, static_cast<float>(sr[t * ss]));
  for (int off = 16; off > 0; off >>= 1) rmax = fmaxf(rmax, __shfl_xor_sync(0xffffffffu, rmax, off));
  if (lane == 0) red[wid] = rmax;
  __syncthreads();
  rmax = red[0];
  for (int w = 1; w < WARPS; ++w) rmax = fmaxf(rmax, red[w]);
  __syncthreads();
  float l = 0.0f;
  for (int t = tid; t < TL; t += WARPS * 32) l += __expf(static_cast<float>(sr[t * ss]) - rmax);
  for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
  if (lane == 0) red[wid] = l;
  __syncthreads();
  l = 0.0f;
  for (int w = 0; w < WARPS; ++w) l += red[w];
  const float inv = 1.0f / l;
  const int g = lane >> 3;
  const int e0 = (int)blockIdx.x * CHUNK + (lane & 7) * 8;
  const int64_t vb = (int64_t)b * v_strides[0] + (int64_t)h * v_strides[1];
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  // U of the lane's tokens at a time: their loads are issued together, then used in token order.
  constexpr int U = 4;
  for (int tb = wid * 4 + g; tb < TL; tb += WARPS * 4 * U) {
    float sv[U];
    float vv[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = tb + u * WARPS * 4;
      const int tc = t < TL ? t : TL - 1;
      sv[u] = static_cast<float>(sr[tc * ss]);
      const int64_t vr = vb + (int64_t)tc * v_strides[2];
#pragma unroll
      for (int i = 0; i < 8; ++i) vv[u][i] = static_cast<float>(v[vr + (int64_t)(e0 + i) * v_strides[3]]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (tb + u * WARPS * 4 >= TL) break;
      const float p = static_cast<float>(static_cast<T>(__expf(sv[u] - rmax) * inv));
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += p * vv[u][i];
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 8);
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 16);
  }
  if (g == 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) part[wid][(lane & 7) * 8 + i] = acc[i];
  }
  __syncthreads();
  if (tid < CHUNK) {
    float total = 0.0f;
    for (int w = 0; w < WARPS; ++w) total += part[w][tid];
    o[(int64_t)row * DV + (int)blockIdx.x * CHUNK + tid] = static_cast<T>(total);
  }
`;

/** Why the kernels do not take q, k, v (null when they do): the checks of both launches. */
function problem(q: MlxArray, k: MlxArray, v: MlxArray): string | null {
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) return `q, k and v must be [B, H, L, D], got ${q.describe()}, ${k.describe()}, ${v.describe()}`;
  // float32 has no roundings to keep: MLX's composition is as good there.
  if (!["bfloat16", "float16"].includes(q.dtype) || k.dtype !== q.dtype || v.dtype !== q.dtype) {
    return `q, k and v must share a dtype, bfloat16 or float16, got ${q.dtype}, ${k.dtype}, ${v.dtype}`;
  }
  const [B, HQ, L, D] = q.shape as [number, number, number, number];
  const [KB, HKV, T, KD] = k.shape as [number, number, number, number];
  if (L !== 1) return `one query token, got ${L}`;
  if (KB !== B || v.shape[0] !== B || v.shape[1] !== HKV || v.shape[2] !== T || KD !== D)
    return `k ${k.describe()} and v ${v.describe()} do not match q ${q.describe()}`;
  if (HKV < 1 || HQ % HKV !== 0) return `query heads ${HQ} are not a multiple of KV heads ${HKV}`;
  if (D % 32 !== 0 || D > 512 || (HQ / HKV) * D > MAX_GROUP_VALUES) return `head dim ${D} with ${HQ / HKV} query heads a KV head is outside the kernels' range`;
  if (v.shape[3]! % CHUNK !== 0) return `value head dim ${v.shape[3]} is not a multiple of ${CHUNK}`;
  if (T < 1 || T > SDPA_DECODE_MAX_KEYS) return `${T} keys (the kernels take 1 to ${SDPA_DECODE_MAX_KEYS})`;
  return null;
}

/** q·kᵀ for one query token rounded to the dtype, in [B, Hq, SDPA_DECODE_MAX_KEYS] (the first T valid; the reference: MLX's matmul as its composition issues it, zeros after). */
export const sdpa_decode_scores_kernel: CustomKernel = custom_kernel({
  name: "mlxb_sdpa_decode_scores",
  input_names: ["q", "k"],
  output_names: ["s"],
  cuda: { source: SCORES_CUDA },
  // k is a slice of the cache's buffer: read in place through its strides.
  ensure_row_contiguous: false,
  validate: ([q, k]) => problem(q!, k!, k!),
  reference: ([q, k], st) => [scoresReference(q!, k!, st)],
  launch: ([q, k]) => {
    const [B, HQ, , D] = q!.shape as [number, number, number, number];
    const HKV = k!.shape[1]!;
    return {
      output_shapes: [[B, HQ, SDPA_DECODE_MAX_KEYS]],
      output_dtypes: [q!.dtype],
      grid: [(SDPA_DECODE_MAX_KEYS / TOK) * WARPS * 32, B * HKV, 1],
      threadgroup: [WARPS * 32, 1, 1],
      template: [
        ["T", q!.dtype],
        ["D", D],
        ["REP", HQ / HKV],
        ["WARPS", WARPS],
        ["TOK", TOK],
        ["MAXK", SDPA_DECODE_MAX_KEYS],
      ],
    };
  },
});

/** softmax(s[..., :T], precise) · v for one query token, T = v's keys: [B, Hq, 1, DV] (the reference: MLX's precise softmax and matmul). */
export const sdpa_decode_values_kernel: CustomKernel = custom_kernel({
  name: "mlxb_sdpa_decode_values",
  input_names: ["s", "v"],
  output_names: ["o"],
  cuda: { source: VALUES_CUDA },
  ensure_row_contiguous: false,
  validate: ([s, v]) => {
    if (s!.ndim !== 3 || v!.ndim !== 4 || s!.shape[0] !== v!.shape[0] || s!.shape[2]! < v!.shape[2]! || s!.shape[1]! % v!.shape[1]! !== 0) {
      return `scores [B, Hq, ≥ T] and values [B, Hkv, T, D] do not match: ${s!.describe()}, ${v!.describe()}`;
    }
    if (s!.dtype !== v!.dtype || v!.shape[3]! % CHUNK !== 0)
      return `scores ${s!.dtype} and values ${v!.describe()}: one dtype, a head dim of a multiple of ${CHUNK}`;
    return null;
  },
  reference: ([s, v], st) => [valuesReference(s!, v!, st)],
  launch: ([s, v]) => {
    const [B, HQ] = s!.shape as [number, number];
    const DV = v!.shape[3]!;
    return {
      output_shapes: [[B, HQ, 1, DV]],
      output_dtypes: [s!.dtype],
      grid: [(DV / CHUNK) * WARPS * 32, B * HQ, 1],
      threadgroup: [WARPS * 32, 1, 1],
      template: [
        ["T", s!.dtype],
        ["DV", DV],
        ["REP", HQ / v!.shape[1]!],
        ["WARPS", WARPS],
        ["CHUNK", CHUNK],
      ],
    };
  },
});

function scoresReference(q: MlxArray, k: MlxArray, st?: Stream): MlxArray {
  // The composition's q·kᵀ (scale 1) as [B, Hq, T], zeros to SDPA_DECODE_MAX_KEYS.
  const [B, HQ] = q.shape as [number, number];
  const T = k.shape[2]!;
  using sc = composed_scores(q, k, st);
  using s3 = reshape(sc, [B, HQ, T], st);
  return pad(
    s3,
    [
      [0, 0],
      [0, 0],
      [0, SDPA_DECODE_MAX_KEYS - T],
    ],
    { stream: st },
  );
}

function valuesReference(s: MlxArray, v: MlxArray, st?: Stream): MlxArray {
  // The composition's precise softmax and p·v on the first T scores, in composed_scores' layout.
  const [B, HQ] = s.shape as [number, number];
  const [, HKV, T] = v.shape as [number, number, number];
  using live = slice(s, [0, 0, 0], [B, HQ, T], undefined, st);
  using sc = reshape(live, HQ === HKV ? [B, HQ, 1, T] : [B, HKV, HQ / HKV, 1, T], st);
  return composed_attention(sc, v, st);
}

/**
 * Whether the plain caches' decode attention takes these kernels: "off" (the default: on an H100 their
 * teacher-forced KL against MLX's composition is 2.5e-3 a token on the 12B-shaped bench model, above
 * the 1e-4 bar, since a rounding flipped by another float32 order in 0.01-0.1% of values is enough;
 * docs/custom-kernels.md) or "on" (where the CUDA source runs).
 */
export type SdpaDecodeSetting = "on" | "off";
const SETTINGS: readonly SdpaDecodeSetting[] = ["on", "off"];
let sdpaSetting: SdpaDecodeSetting | undefined;
let sdpaOn: boolean | undefined;

/** Choose the setting for this process; `undefined` goes back to MLX_BUN_SDPA_DECODE (read once). */
export function set_sdpa_decode(s: SdpaDecodeSetting | undefined): void {
  if (s !== undefined && !SETTINGS.includes(s)) throw new Error(`set_sdpa_decode: expected ${SETTINGS.join(", ")}, got ${String(s)}`);
  sdpaSetting = s;
  sdpaOn = undefined;
}

/** Whether `sdpa_decode` runs the kernels in this process (SdpaDecodeSetting; always false without a CUDA source path). */
export function sdpa_decode_enabled(): boolean {
  if (sdpaOn === undefined) {
    const v = sdpaSetting ?? (process.env.MLX_BUN_SDPA_DECODE || "off");
    if (!SETTINGS.includes(v as SdpaDecodeSetting)) throw new Error(`MLX_BUN_SDPA_DECODE=${v}: expected ${SETTINGS.join(", ")}`);
    sdpaOn = v === "on" && select_kernel_path(sdpa_decode_scores_kernel.spec, kernel_environment()) === "cuda";
  }
  return sdpaOn;
}

/**
 * softmax(q kᵀ) v for one query token (q [B, Hq, 1, D], k/v [B, Hkv, T, D] of one dtype, scale 1,
 * no mask, no sinks, at most SDPA_DECODE_MAX_KEYS keys) in two launches at the rounding points of
 * MLX's composition, or null where the setting is off, no CUDA source runs, or the call is anything
 * else: the caller then runs MLX's composition (`sdpa_unit_scale`) or its op.
 */
export function sdpa_decode(q: MlxArray, k: MlxArray, v: MlxArray, scale: number, stream?: Stream): MlxArray | null {
  if (scale !== 1 || !sdpa_decode_enabled() || problem(q, k, v) !== null) return null;
  // Both launches depend on the shapes less T: prepared once per layer shape.
  const key = `${q.dtype}|${q.shape.join(",")}|${k.shape[1]}|${v.shape[3]}`;
  using s = sdpa_decode_scores_kernel.runKeyed([q, k], key, { stream })[0]!;
  return sdpa_decode_values_kernel.runKeyed([s, v], key, { stream })[0]!;
}
