// Fused decode attention over a plain (bf16/fp16/fp32) KV cache: the split-K kernel of the
// quantized modes (decode-source.ts) with a plain load as its "decoder". MLX's own decode SDPA
// moved 268 GB/s at 131k tokens on the H200 (issue 24); this one is opt-in
// (MLX_BUN_DENSE_DECODE=kernel or setDenseDecode) until measured against it on each backend.
import { type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { processSetting } from "../setting.ts";
import type { Mask } from "../types.ts";
import { decodeTwoPass } from "./decode-combine.ts";
import { checkMask, decodeMask, decodePlan, type DecodePlan, partialsLaunch, planKey, referencePartials, scaledQueries } from "./decode-plan.ts";
import { type Backend, type Decoder, partialsSource, UNROLL } from "./decode-source.ts";

/** The lane's slice of row t of a plain [B, H, T, D] plane `a`, read through its strides, kept in T until used. */
const plainDecoder = (p: string, a: string, out: string, n: string): Decoder => ({
  prelude: "",
  regs: `
    T ${p}_raw[NT][${n}];`,
  load: `
      {
        const int64_t ar = b * ${a}_strides[0] + h * ${a}_strides[1] + t * ${a}_strides[2];
        ${UNROLL}
        for (int i = 0; i < ${n}; ++i) ${p}_raw[j][i] = ${a}[ar + (lane * ${n} + i) * ${a}_strides[3]];
      }`,
  decode: `
      ${UNROLL}
      for (int i = 0; i < ${n}; ++i) ${out}[i] = static_cast<float>(${p}_raw[j][i]);`,
});

const source = (b: Backend): string => partialsSource(b, plainDecoder("k", "kw", "kf", "EK"), plainDecoder("v", "vw", "vf", "EV"));

function planOf([q, kw, vw, mask]: readonly MlxArray[]): DecodePlan | string {
  for (const a of [kw!, vw!]) if (a.ndim !== 4) return `keys and values must be [B, H, T, D], got ${a.describe()}`;
  if (kw!.dtype !== q!.dtype || vw!.dtype !== q!.dtype) return `keys ${kw!.dtype} / values ${vw!.dtype} differ from the queries' ${q!.dtype}`;
  const [B, H, T] = kw!.shape as [number, number, number];
  if (vw!.shape[0] !== B || vw!.shape[1] !== H || vw!.shape[2] !== T) return `keys ${kw!.describe()} and values ${vw!.describe()} disagree in [B, H, T]`;
  if (q!.ndim !== 4 || q!.shape[0] !== B) return `queries ${q!.describe()} must be [${B}, Hq, 1, D]`;
  // A lane keeps its D/32 elements of each of K and V per token, in the cache's dtype.
  const plan = decodePlan(q!, H, kw!.shape[3]!, vw!.shape[3]!, T, Math.ceil(((kw!.shape[3]! + vw!.shape[3]!) / 32) * (kw!.itemsize / 4)));
  if (typeof plan === "string") return plan;
  return checkMask(mask!, B, T) ?? plan;
}

export const denseDecodeKernel = mx.kernels.custom_kernel({
  name: "mlxb_dense_decode_partials",
  // q is pre-scaled (q · scale); kw / vw are the cache's keys and values.
  input_names: ["q", "kw", "vw", "mask"],
  output_names: ["po", "pm", "pl"],
  metal: { source: source("metal") },
  cuda: { source: source("cuda") },
  // The keys and values are slices of the cache's buffers: read them in place through their strides.
  ensure_row_contiguous: false,
  validate: (inputs) => {
    const p = planOf(inputs);
    return typeof p === "string" ? p : null;
  },
  reference: (inputs, st) => {
    const [q, kw, vw, mask] = inputs;
    using keys = mx.astype(kw!, "float32", st);
    using values = mx.astype(vw!, "float32", st);
    return referencePartials(planOf(inputs) as DecodePlan, q!, keys, values, mask!, st);
  },
  launch: (inputs) => {
    const l = partialsLaunch(planOf(inputs) as DecodePlan, inputs[3]!);
    return { ...l, output_dtypes: [...l.output_dtypes], template: [["T", inputs[0]!.dtype], ...l.template] };
  },
});

/** The launch class of pass-1 inputs (CustomKernel.runKeyed), or null where the kernel does not take them. */
export function denseDecodeKey(inputs: readonly MlxArray[]): string | null {
  const plan = planOf(inputs);
  return typeof plan === "string" ? null : planKey(plan, inputs[0]!, inputs[3]!);
}

/** How a plain cache attends one decode token: MLX's fast SDPA ("sdpa", the default) or the split-K kernel ("kernel"). */
export type DenseDecodeSetting = "sdpa" | "kernel";

const setting = processSetting<DenseDecodeSetting>("MLX_BUN_DENSE_DECODE", "setDenseDecode", ["sdpa", "kernel"], () => "sdpa");

/** Choose the decode attention of plain caches for this process; `undefined` goes back to MLX_BUN_DENSE_DECODE. */
export function setDenseDecode(s: DenseDecodeSetting | undefined): void {
  setting.set(s);
}

/** The plain caches' decode attention in effect now. */
export function denseDecode(): DenseDecodeSetting {
  return setting.get();
}

/**
 * softmax(scale · q Kᵀ + mask) V for one query token per head through the split-K kernels, or
 * null where they do not run (the setting is "sdpa", no live GPU backend, a query of several
 * tokens, sinks, a head dim or mask form they do not take): the caller then runs fast SDPA.
 */
export function denseDecodeAttention(q: MlxArray, k: MlxArray, v: MlxArray, scale: number, mask: Mask, s?: Stream): MlxArray | null {
  if (denseDecode() !== "kernel" || denseDecodeKernel.path(s) === "reference" || q.ndim !== 4 || q.shape[2] !== 1) return null;
  using m = decodeMask(mask, q.shape[0]!, k.shape[2]!);
  if (!m) return null;
  using qs = scaledQueries(q, scale, s);
  const inputs = [qs, k, v, m];
  const key = denseDecodeKey(inputs);
  return key === null ? null : decodeTwoPass(denseDecodeKernel, inputs, key, s);
}
