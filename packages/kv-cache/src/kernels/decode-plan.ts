// The launch plan of the fused decode-attention kernels (how tokens and query heads are split
// over warps), the mask they read, and the reference composition of pass 1 (partials) in
// plain ops. docs/kv-cache-kernels.md explains the design.
import { isFloating, MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { processSetting } from "../setting.ts";
import type { Mask } from "../types.ts";
import { WARPS } from "./decode-source.ts";

/** Largest head dim the kernels take (each lane holds D/32 elements of a query and an output). */
export const DECODE_MAX_DIM = 512;
/** Warps per threadgroup (128 threads); a threadgroup writes one partial for its WARPS runs. */
export const DECODE_WARPS = WARPS;
/**
 * Warps to split the tokens over: threadgroups of several waves, so the last, partial wave is a
 * small share of the time (the H200 profile of 4,096 warps at 131k tokens: 1.3 waves of
 * 3 threadgroups per SM, a fifth of the time lost to the tail), yet few partials for pass 2.
 */
const MAX_WARPS = 8192;
/** MLX_BUN_DECODE_WARPS (1024-32768, powers of two) sets it, to measure the split on a GPU. */
const warpTarget = processSetting(
  "MLX_BUN_DECODE_WARPS",
  "the decode warp target",
  Array.from({ length: 6 }, (_, i) => String(1024 << i)),
  () => String(MAX_WARPS),
);
/** Fewest tokens a warp takes (its query loads and the merge of partials are paid per run). */
const MIN_RUN = 32;
/** Floats per lane for the queries (and as many for the accumulators) a warp carries. */
const LANE_FLOATS = 32;
/**
 * MLX_BUN_DECODE_LANE_FLOATS (8, 16, 32) lowers it, to measure on a GPU fewer query heads a warp:
 * fewer registers (ptxas: 168 → 122 for turbo:4,3 with 8/2 heads of 256, 4 threadgroups an SM
 * instead of 3) against decoding each token once per group of heads instead of once.
 */
const laneFloats = processSetting("MLX_BUN_DECODE_LANE_FLOATS", "the decode lane floats", ["8", "16", "32"], () => String(LANE_FLOATS));

export interface DecodePlan {
  batch: number;
  qHeads: number;
  kvHeads: number;
  /** Query heads per KV head (GQA). */
  nRep: number;
  dk: number;
  dv: number;
  tokens: number;
  /** Query heads one warp carries (a divisor of nRep); nRep / reps warps share each token run. */
  reps: number;
  /** Tokens a warp loads and scores together (a tile), so their loads are in flight at once. */
  nt: number;
  /** Tokens per warp: decodeRunLength(tokens, parts, nt), which the kernels compute from their grid. */
  tpw: number;
  /** Partials per query head, one per threadgroup of DECODE_WARPS runs. */
  parts: number;
}

/**
 * Tokens per warp for `parts` threadgroups of DECODE_WARPS warps: the even split rounded up to
 * whole tiles. The kernels derive it from their grid, so the token count never enters a template
 * (one compilation per shape class, not per context length); the plan and the reference use it too.
 */
export function decodeRunLength(tokens: number, parts: number, nt: number): number {
  return Math.ceil(Math.ceil(tokens / (parts * DECODE_WARPS)) / nt) * nt;
}

/**
 * Registers per lane a tile's raw K/V words and mask may take (decode-source.ts Decoder); sizes
 * NT. Measured on the H200 (docs/benchmarks.md, issue 24, the tile sweep): 3-4 tokens of about 8-10
 * registers were fastest for heads of 256 and 512 in every mode; 8 tokens were up to 1.7x slower.
 */
const TILE_REGS = 34;
/** Most tokens per tile; MLX_BUN_DECODE_TILE (1-8) lowers it, to measure the tile size on a GPU. */
const MAX_NT = 8;
const tileCap = processSetting(
  "MLX_BUN_DECODE_TILE",
  "the decode tile cap",
  Array.from({ length: MAX_NT }, (_, i) => String(i + 1)),
  () => String(MAX_NT),
);

/**
 * The plan for q [B, Hq, 1, Dk] over `tokens` cached tokens of `kvHeads` heads, or why the
 * kernels cannot take it. `tokenRegs`: the 32-bit registers a lane holds per token of a tile
 * (both decoders' raw words; the mask's is added here).
 */
export function decodePlan(q: MlxArray, kvHeads: number, dk: number, dv: number, tokens: number, tokenRegs: number): DecodePlan | string {
  if (q.ndim !== 4) return `queries must be [B, Hq, 1, D], got ${q.describe()}`;
  const [batch, qHeads, L, qd] = q.shape as [number, number, number, number];
  if (L !== 1) return `decode kernels take one query token, got ${L}`;
  if (!isFloating(q.dtype) || q.dtype === "float64") return `queries must be float32, bfloat16 or float16, got ${q.dtype}`;
  if (qd !== dk) return `query dim ${qd} differs from the key dim ${dk}`;
  if (qHeads % kvHeads !== 0) return `${qHeads} query heads are not a multiple of ${kvHeads} KV heads`;
  for (const [n, d] of [
    ["key", dk],
    ["value", dv],
  ] as const) {
    if (d % 32 !== 0 || d > DECODE_MAX_DIM) return `${n} head dim ${d} must be a multiple of 32 up to ${DECODE_MAX_DIM}`;
  }
  if (tokens < 1) return "no cached tokens";
  const nRep = qHeads / kvHeads;
  const perHead = Math.max(dk, dv) / 32;
  const lane = Number(laneFloats.get());
  let reps = 1;
  for (let r = nRep; r >= 1; r--) {
    if (nRep % r === 0 && r * perHead <= lane) {
      reps = r;
      break;
    }
  }
  const rows = batch * kvHeads * (nRep / reps);
  // A tile's raw K/V words (and mask) stay in registers until decoded: about TILE_REGS per lane.
  // The tile's NT × REPS scores, each padded to a power of two, share the warp's 32 lanes (decode-source.ts).
  const nt = Math.max(1, Math.min(Number(tileCap.get()), Math.floor(TILE_REGS / (tokenRegs + 1)), 32 / 2 ** Math.ceil(Math.log2(reps))));
  // Runs of whole tiles, about MAX_WARPS of them over every row (not fewer than MIN_RUN tokens).
  const run = Math.ceil(Math.max(MIN_RUN, Math.ceil((tokens * rows) / Number(warpTarget.get()))) / nt) * nt;
  const parts = Math.ceil(tokens / (run * DECODE_WARPS));
  return { batch, qHeads, kvHeads, nRep, dk, dv, tokens, reps, nt, tpw: decodeRunLength(tokens, parts, nt), parts };
}

/** Grid, threadgroup and the plan's template arguments (shared by both pass-1 kernels). */
export function partialsLaunch(p: DecodePlan, mask: MlxArray) {
  const rows = p.batch * p.qHeads;
  return {
    output_shapes: [
      [rows, p.parts, p.dv],
      [rows, p.parts],
      [rows, p.parts],
    ],
    output_dtypes: ["float32", "float32", "float32"] as const,
    // x = partial · (nRep / reps) + query-head group: the groups reading the same tokens run together (L2).
    grid: [p.parts * (p.nRep / p.reps) * DECODE_WARPS * 32, p.batch * p.kvHeads, 1] as [number, number, number],
    threadgroup: [DECODE_WARPS * 32, 1, 1] as [number, number, number],
    template: [
      ["DK", p.dk],
      ["DV", p.dv],
      ["NREP", p.nRep],
      ["REPS", p.reps],
      ["NT", p.nt],
      ["MASK_MODE", maskMode(mask)],
    ] as [string, number][],
  };
}

/** 0: one boolean for every key (decodeMask's form of no mask), read once; 1: booleans; 2: additive. */
function maskMode(mask: MlxArray): number {
  return mask.dtype === "bool" ? (mask.size === 1 ? 0 : 1) : 2;
}

/**
 * The launch class of a pass-1 call (CustomKernel.runKeyed): everything partialsLaunch reads, and
 * so pass 2's launch too. Not the token count: the kernels derive their run length from the grid.
 */
export function planKey(p: DecodePlan, q: MlxArray, mask: MlxArray): string {
  return `${q.dtype},${p.batch},${p.qHeads},${p.kvHeads},${p.dk},${p.dv},${p.reps},${p.nt},${p.parts},${maskMode(mask)}`;
}

/**
 * The queries the kernels take: q · scale as the unfused path computes it (a multiply in q's
 * dtype). At scale 1 that product is q itself, bit for bit, so no multiply is issued: Gemma 4
 * attends with scale 1, and a multiply node per attention layer and step costs launch and encode time.
 */
export function scaledQueries(q: MlxArray, scale: number, s?: Stream): MlxArray {
  return scale === 1 ? q.retain() : mx.multiply(q, scale, s);
}

/**
 * The single `true` of "every key visible", made once for the process (this module owns it and
 * never frees it): a decode step then writes no mask from the host. On CUDA MLX keeps such small
 * arrays in one managed-memory pool, whose page each host write takes back from the GPU.
 */
let allVisible: MlxArray | null = null;

/**
 * The mask as the kernels read it: an owned [1 or B, 1, 1, T] array (boolean: true = visible;
 * or additive). No mask and "causal" (one query at the last position sees every key) become a
 * single `true`. Null when the mask has another form (per-head masks): the unfused path takes it.
 */
export function decodeMask(mask: Mask, batch: number, tokens: number): MlxArray | null {
  if (mask === null || mask === "causal") return (allVisible ??= MlxArray.fromNumbers([1], [1, 1, 1, 1], "bool")).retain();
  if (mask.ndim > 4 || mask.ndim < 1) return null;
  if (mask.dtype !== "bool" && (!isFloating(mask.dtype) || mask.dtype === "float64")) return null;
  const s = [...new Array<number>(4 - mask.ndim).fill(1), ...mask.shape];
  if (s[1] !== 1 || s[2] !== 1 || s[3] !== tokens || (s[0] !== 1 && s[0] !== batch)) return null;
  return mx.reshape(mask, s);
}

/** Check a mask input of the kernels (the form decodeMask makes). */
export function checkMask(mask: MlxArray, batch: number, tokens: number): string | null {
  const s = mask.shape;
  if (mask.ndim !== 4 || s[1] !== 1 || s[2] !== 1 || (s[0] !== 1 && s[0] !== batch) || (s[3] !== tokens && mask.size !== 1)) {
    return `mask ${mask.describe()} must be [1 or ${batch}, 1, 1, ${tokens}] (or one element)`;
  }
  if (mask.dtype !== "bool" && (!isFloating(mask.dtype) || mask.dtype === "float64")) return `mask must be boolean or float, got ${mask.dtype}`;
  return null;
}

/**
 * Pass 1 in plain ops, float32 throughout: scores q·Kᵀ of every query head, the mask (hidden
 * keys score −FLT_MAX), then per chunk of `tpw · DECODE_WARPS` tokens (one threadgroup's runs,
 * merged) the max m, l = Σ exp(s − m) and o = Σ exp(s − m) v. Keys/values come decoded to float32 [B, Hkv, T, D]. Returns
 * [o [B·Hq, parts, Dv], m, l [B·Hq, parts]] as the sources lay them out.
 */
export function referencePartials(p: DecodePlan, qs: MlxArray, keys: MlxArray, values: MlxArray, mask: MlxArray, s?: Stream): MlxArray[] {
  const { batch: B, kvHeads: H, nRep: R, parts: P, tokens: T, dv } = p;
  const tpw = p.tpw * DECODE_WARPS;
  const pad = P * tpw - T;
  const so = s ? { stream: s } : {};
  using q32 = mx.astype(qs, "float32", s);
  using q5 = mx.reshape(q32, [B, H, R, p.dk], s);
  using kt = mx.transpose(keys, [0, 1, 3, 2], s);
  using raw = mx.matmul(q5, kt, s); // [B, H, R, T]
  using m32 = mask.dtype === "bool" ? mask.retain() : mx.astype(mask, "float32", s);
  using masked = mask.dtype === "bool" ? mx.where(m32, raw, -3.4028234663852886e38, s) : mx.add(raw, m32, s);
  using padded = pad
    ? mx.pad(
        masked,
        [
          [0, 0],
          [0, 0],
          [0, 0],
          [0, pad],
        ],
        { constant_values: -Infinity, ...so },
      )
    : masked.retain();
  using s5 = mx.reshape(padded, [B, H, R, P, tpw], s);
  using mrun = mx.max(s5, -1, { keepdims: true, ...so });
  using diff = mx.subtract(s5, mrun, s);
  using ex = mx.exp(diff, s);
  using gone = mx.equal(s5, -Infinity, s);
  using e = mx.where(gone, 0, ex, s);
  using l = mx.sum(e, -1, so);
  using vpad = pad
    ? mx.pad(
        values,
        [
          [0, 0],
          [0, 0],
          [0, pad],
          [0, 0],
        ],
        so,
      )
    : values.retain();
  using v5 = mx.reshape(vpad, [B, H, P, tpw, dv], s);
  using et = mx.transpose(e, [0, 1, 3, 2, 4], s); // [B, H, P, R, tpw]
  using ot = mx.matmul(et, v5, s); // [B, H, P, R, Dv]
  using o = mx.transpose(ot, [0, 1, 3, 2, 4], s); // [B, H, R, P, Dv]
  return [mx.reshape(o, [B * H * R, P, dv], s), mx.reshape(mrun, [B * H * R, P], s), mx.reshape(l, [B * H * R, P], s)];
}
