// Fused decode attention over an affine-quantized KV cache (mx.quantize planes): one query token
// per head, GQA, boolean/additive masks. Pass 1 (this kernel) reads each packed K/V row once per
// warp and keeps an online softmax in float32; pass 2 (decode-combine.ts) merges the runs.
// On a CPU (or where no GPU backend is live) the view keeps the unfused mlx-lm path.
import { type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { QuantTriple } from "../quant-triple.ts";
import type { Mask } from "../types.ts";
import { decodeTwoPass } from "./decode-combine.ts";
import { checkMask, decodeMask, decodePlan, type DecodePlan, partialsLaunch, planKey, referencePartials, scaledQueries } from "./decode-plan.ts";
import { affineDecoder, affineTokenRegs, type Backend, partialsSource } from "./decode-source.ts";

/** Bit widths the kernel decodes (a code never straddles a uint32 word); others stay unfused. */
export const AFFINE_DECODE_BITS: readonly number[] = [2, 4, 8];

const source = (b: Backend): string => partialsSource(b, affineDecoder(b, "k", "kf", "EK", "BK", "GK"), affineDecoder(b, "v", "vf", "EV", "BV", "GV"));

interface Shapes {
  plan: DecodePlan;
  bits: number;
  kGroup: number;
  vGroup: number;
}

/** Plan, bits and group sizes from the inputs' shapes (K and V share the bit width, as the codec does). */
function shapesOf([q, kw, ks, kb, vw, vs, vb, mask]: readonly MlxArray[]): Shapes | string {
  for (const a of [kw!, ks!, kb!, vw!, vs!, vb!]) if (a.ndim !== 4) return `planes must be [B, H, T, x], got ${a.describe()}`;
  if (kw!.dtype !== "uint32" || vw!.dtype !== "uint32") return "packed planes must be uint32";
  const [B, H, T] = kw!.shape as [number, number, number];
  for (const a of [ks!, kb!, vw!, vs!, vb!]) {
    if (a.shape[0] !== B || a.shape[1] !== H || a.shape[2] !== T) return `planes disagree in [B, H, T]: ${kw!.describe()} vs ${a.describe()}`;
  }
  if (ks!.shape[3] !== kb!.shape[3] || vs!.shape[3] !== vb!.shape[3]) return "scales and biases disagree in groups";
  for (const a of [ks!, kb!, vs!, vb!]) if (a.dtype !== q!.dtype) return `scales/biases ${a.dtype} differ from the queries' ${q!.dtype}`;
  if (q!.ndim !== 4 || q!.shape[0] !== B) return `queries ${q!.describe()} must be [${B}, Hq, 1, D]`;
  const dk = q!.shape[3]!;
  const bits = (kw!.shape[3]! * 32) / dk;
  if (!AFFINE_DECODE_BITS.includes(bits)) return `key bits ${bits} not one of ${AFFINE_DECODE_BITS.join(", ")}`;
  const dv = (vw!.shape[3]! * 32) / bits;
  const kGroup = dk / ks!.shape[3]!;
  const vGroup = dv / vs!.shape[3]!;
  if (!Number.isInteger(dv) || !Number.isInteger(kGroup) || !Number.isInteger(vGroup)) return "plane widths do not fit one bit width and group size";
  const plan = decodePlan(q!, H, dk, dv, T, affineTokenRegs(dk, bits, kGroup) + affineTokenRegs(dv, bits, vGroup));
  if (typeof plan === "string") return plan;
  const bad = checkMask(mask!, B, T);
  return bad ?? { plan, bits, kGroup, vGroup };
}

export const affineDecodeKernel = mx.kernels.custom_kernel({
  name: "mlxb_affine_decode_partials",
  // q is pre-scaled (q · scale, as the unfused path computes it first).
  input_names: ["q", "kw", "ks", "kb", "vw", "vs", "vb", "mask"],
  output_names: ["po", "pm", "pl"],
  metal: { source: source("metal") },
  cuda: { source: source("cuda") },
  // The planes are slices of the cache's buffers: read them in place through their strides.
  ensure_row_contiguous: false,
  validate: (inputs) => {
    const s = shapesOf(inputs);
    return typeof s === "string" ? s : null;
  },
  reference: (inputs, st) => {
    const [q, kw, ks, kb, vw, vs, vb, mask] = inputs;
    const { plan, bits, kGroup, vGroup } = shapesOf(inputs) as Shapes;
    const deq = (w: MlxArray, s: MlxArray, b: MlxArray, group_size: number): MlxArray => {
      using s32 = mx.astype(s, "float32", st);
      using b32 = mx.astype(b, "float32", st);
      return mx.dequantize(w, s32, b32, { group_size, bits, ...(st ? { stream: st } : {}) });
    };
    using keys = deq(kw!, ks!, kb!, kGroup);
    using values = deq(vw!, vs!, vb!, vGroup);
    return referencePartials(plan, q!, keys, values, mask!, st);
  },
  launch: (inputs) => {
    const { plan, bits, kGroup, vGroup } = shapesOf(inputs) as Shapes;
    const l = partialsLaunch(plan, inputs[7]!);
    return {
      ...l,
      output_shapes: l.output_shapes,
      output_dtypes: [...l.output_dtypes],
      template: [["T", inputs[0]!.dtype], ...l.template, ["BK", bits], ["GK", kGroup], ["BV", bits], ["GV", vGroup]],
    };
  },
});

/** The launch class of pass-1 inputs (CustomKernel.runKeyed), or null where the kernel does not take them. */
export function affineDecodeKey(inputs: readonly MlxArray[]): string | null {
  const sh = shapesOf(inputs);
  return typeof sh === "string" ? null : `${planKey(sh.plan, inputs[0]!, inputs[7]!)},${sh.bits},${sh.kGroup},${sh.vGroup}`;
}

/**
 * softmax(scale · q Kᵀ + mask) V for one query token per head through the fused kernels, or
 * null where they do not run (no live GPU backend, a query of several tokens, a bit width or
 * head dim or mask form they do not take): the caller then runs the unfused path.
 */
export function affineDecodeAttention(q: MlxArray, k: QuantTriple, v: QuantTriple, scale: number, mask: Mask, bits: number, s?: Stream): MlxArray | null {
  if (affineDecodeKernel.path(s) === "reference" || q.ndim !== 4 || q.shape[2] !== 1 || !AFFINE_DECODE_BITS.includes(bits)) return null;
  using m = decodeMask(mask, q.shape[0]!, k.w.shape[2]!);
  if (!m) return null;
  using qs = scaledQueries(q, scale, s);
  const inputs = [qs, k.w, k.scales, k.biases, v.w, v.scales, v.biases, m];
  const key = affineDecodeKey(inputs);
  return key === null ? null : decodeTwoPass(affineDecodeKernel, inputs, key, s);
}
