// Fused decode attention over a TurboQuant KV cache: keys affine per 32-group, values
// Lloyd-Max codes of the FWHT-rotated vectors. The output stays rotated (deferred V): the view
// un-rotates it once per query row, as on the unfused path. Pass 2 is decode-combine.ts.
import { type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Mask } from "../types.ts";
import { decodeTwoPass } from "./decode-combine.ts";
import { checkMask, decodeMask, decodePlan, type DecodePlan, partialsLaunch, planKey, referencePartials, scaledQueries } from "./decode-plan.ts";
import { affineDecoder, affineTokenRegs, type Backend, partialsSource, TURBO_VALUE_TOKEN_REGS, turboValueDecoder } from "./decode-source.ts";
import { turboValuesKernel } from "./turbo-values.ts";

/** Key bit widths the kernel decodes (3-bit keys stay unfused); every value width (2, 3, 4) is taken. */
export const TURBO_DECODE_K_BITS: readonly number[] = [2, 4, 8];
const K_GROUP = 32;

const source = (b: Backend): string => partialsSource(b, affineDecoder(b, "k", "kf", "EK", "BK", "GK"), turboValueDecoder(b, "vf"));

interface Shapes {
  plan: DecodePlan;
  kBits: number;
  vBits: number;
}

function shapesOf([q, kw, ks, kb, vc, vs, centroids, mask]: readonly MlxArray[]): Shapes | string {
  for (const a of [kw!, ks!, kb!, vc!, vs!]) if (a.ndim !== 4) return `planes must be [B, H, T, x], got ${a.describe()}`;
  if (kw!.dtype !== "uint32") return "packed keys must be uint32";
  if (vc!.dtype !== "uint8") return `value codes must be uint8, got ${vc!.dtype}`;
  if (centroids!.dtype !== "float32" || centroids!.ndim !== 1) return "centroids must be a float32 vector";
  const vBits = Math.log2(centroids!.size);
  if (![2, 3, 4].includes(vBits)) return `centroids must have 4, 8 or 16 entries, got ${centroids!.size}`;
  const [B, H, T] = kw!.shape as [number, number, number];
  for (const a of [ks!, kb!, vc!, vs!]) {
    if (a.shape[0] !== B || a.shape[1] !== H || a.shape[2] !== T) return `planes disagree in [B, H, T]: ${kw!.describe()} vs ${a.describe()}`;
  }
  if (vs!.shape[3] !== 1) return `value scales must be [B, H, T, 1], got ${vs!.describe()}`;
  for (const a of [ks!, kb!, vs!]) if (a.dtype !== q!.dtype) return `scales/biases ${a.dtype} differ from the queries' ${q!.dtype}`;
  if (q!.ndim !== 4 || q!.shape[0] !== B) return `queries ${q!.describe()} must be [${B}, Hq, 1, D]`;
  const dk = q!.shape[3]!;
  const kBits = (kw!.shape[3]! * 32) / dk;
  if (!TURBO_DECODE_K_BITS.includes(kBits)) return `key bits ${kBits} not one of ${TURBO_DECODE_K_BITS.join(", ")}`;
  if (ks!.shape[3]! * K_GROUP !== dk || kb!.shape[3]! * K_GROUP !== dk) return `key scales must have ${dk / K_GROUP} groups of ${K_GROUP}`;
  const dv = (vc!.shape[3]! * 8) / vBits;
  if (!Number.isInteger(dv)) return `value codes of ${vc!.shape[3]} bytes do not hold ${vBits}-bit codes`;
  const plan = decodePlan(q!, H, dk, dv, T, affineTokenRegs(dk, kBits, K_GROUP) + TURBO_VALUE_TOKEN_REGS);
  if (typeof plan === "string") return plan;
  const bad = checkMask(mask!, B, T);
  return bad ?? { plan, kBits, vBits };
}

export const turboDecodeKernel = mx.kernels.custom_kernel({
  name: "mlxb_turbo_decode_partials",
  // q is pre-scaled; the values and so the output stay rotated.
  input_names: ["q", "kw", "ks", "kb", "vc", "vs", "centroids", "mask"],
  output_names: ["po", "pm", "pl"],
  metal: { source: source("metal") },
  cuda: { source: source("cuda") },
  ensure_row_contiguous: false,
  validate: (inputs) => {
    const s = shapesOf(inputs);
    return typeof s === "string" ? s : null;
  },
  reference: (inputs, st) => {
    const [q, kw, ks, kb, vc, vs, centroids, mask] = inputs;
    const { plan, kBits } = shapesOf(inputs) as Shapes;
    const so = st ? { stream: st } : {};
    using s32 = mx.astype(ks!, "float32", st);
    using b32 = mx.astype(kb!, "float32", st);
    using keys = mx.dequantize(kw!, s32, b32, { group_size: K_GROUP, bits: kBits, ...so });
    // The rotated values exactly as the value-decode kernel's reference rounds them.
    const [vr] = turboValuesKernel.run([vc!, vs!, centroids!], { path: "reference", ...so });
    using rotated = vr!;
    using values = mx.astype(rotated, "float32", st);
    return referencePartials(plan, q!, keys, values, mask!, st);
  },
  launch: (inputs) => {
    const { plan, kBits, vBits } = shapesOf(inputs) as Shapes;
    const l = partialsLaunch(plan, inputs[7]!);
    return {
      ...l,
      output_dtypes: [...l.output_dtypes],
      template: [["T", inputs[0]!.dtype], ...l.template, ["BK", kBits], ["GK", K_GROUP], ["VB", vBits]],
    };
  },
});

/** The launch class of pass-1 inputs (CustomKernel.runKeyed), or null where the kernel does not take them. */
export function turboDecodeKey(inputs: readonly MlxArray[]): string | null {
  const sh = shapesOf(inputs);
  return typeof sh === "string" ? null : `${planKey(sh.plan, inputs[0]!, inputs[7]!)},${sh.kBits},${sh.vBits}`;
}

/**
 * Attention over rotated values for one query token per head through the fused kernels (the
 * caller un-rotates the output), or null where they do not run; the caller then takes the
 * unfused path.
 */
export function turboDecodeAttention(
  q: MlxArray,
  keys: { w: MlxArray; scales: MlxArray; biases: MlxArray },
  codes: MlxArray,
  vscale: MlxArray,
  centroids: MlxArray,
  scale: number,
  mask: Mask,
  kBits: number,
  s?: Stream,
): MlxArray | null {
  if (turboDecodeKernel.path(s) === "reference" || q.ndim !== 4 || q.shape[2] !== 1 || !TURBO_DECODE_K_BITS.includes(kBits)) return null;
  using m = decodeMask(mask, q.shape[0]!, keys.w.shape[2]!);
  if (!m) return null;
  using qs = scaledQueries(q, scale, s);
  const inputs = [qs, keys.w, keys.scales, keys.biases, codes, vscale, centroids, m];
  const key = turboDecodeKey(inputs);
  return key === null ? null : decodeTwoPass(turboDecodeKernel, inputs, key, s);
}
