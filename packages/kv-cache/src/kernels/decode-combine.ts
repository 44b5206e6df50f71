// Pass 2 of the fused decode attention: merge the per-run partials (o, m, l) of every query
// head into the normalized output, rounded once to the query dtype.
import { type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { COMBINE_WARPS, combineSource } from "./decode-source.ts";

export const decodeCombineKernel = mx.kernels.custom_kernel({
  name: "mlxb_decode_combine",
  // q only gives the output's shape [B, Hq, 1, ·] and dtype; the sources never read it.
  input_names: ["po", "pm", "pl", "q"],
  output_names: ["out"],
  metal: { source: combineSource("metal") },
  cuda: { source: combineSource("cuda") },
  validate: ([po, pm, pl, q]) => {
    if (po!.ndim !== 3 || pm!.ndim !== 2) return `partials must be o [R, P, Dv] and m, l [R, P], got ${po!.describe()}, ${pm!.describe()}`;
    if (pm!.shape.join() !== po!.shape.slice(0, 2).join() || pl!.shape.join() !== pm!.shape.join()) return "partials o, m, l disagree in [R, P]";
    for (const a of [po!, pm!, pl!]) if (a.dtype !== "float32") return `partials must be float32, got ${a.dtype}`;
    if (po!.shape[2]! % 32 !== 0) return `partials' head dim ${po!.shape[2]} must be a multiple of 32`;
    if (q!.ndim !== 4 || q!.shape[0]! * q!.shape[1]! !== po!.shape[0] || q!.shape[2] !== 1)
      return `q ${q!.describe()} must be [B, Hq, 1, D] with B·Hq = ${po!.shape[0]}`;
    return null;
  },
  reference: ([po, pm, pl, q], s) => {
    const [B, H] = q!.shape as [number, number];
    const dv = po!.shape[2]!;
    const so = s ? { stream: s } : {};
    using top = mx.max(pm!, -1, { keepdims: true, ...so });
    using diff = mx.subtract(pm!, top, s);
    using ex = mx.exp(diff, s);
    using gone = mx.equal(pm!, -Infinity, s);
    using w = mx.where(gone, 0, ex, s);
    using wl = mx.multiply(w, pl!, s);
    using den = mx.sum(wl, -1, { keepdims: true, ...so });
    using w3 = mx.expand_dims(w, -1, s);
    using wo = mx.multiply(po!, w3, s);
    using acc = mx.sum(wo, 1, so);
    using out = mx.divide(acc, den, s);
    using typed = mx.astype(out, q!.dtype, s);
    return [mx.reshape(typed, [B, H, 1, dv], s)];
  },
  launch: ([po, , , q]) => {
    const dv = po!.shape[2]!;
    return {
      output_shapes: [[q!.shape[0]!, q!.shape[1]!, 1, dv]],
      output_dtypes: [q!.dtype],
      // One threadgroup per (row, 32 output elements); Dv is a multiple of 32 (decodePlan).
      grid: [(dv / 32) * COMBINE_WARPS * 32, po!.shape[0]!, 1],
      threadgroup: [COMBINE_WARPS * 32, 1, 1],
      template: [
        ["T", q!.dtype],
        ["DV", dv],
      ],
    };
  },
});

/**
 * Pass 1 (`kernel` over `inputs`, the scaled queries first, already checked by the caller) then
 * pass 2: the attention output [B, Hq, 1, Dv]. `key`: the inputs' launch class (planKey plus what
 * the kernel's own template adds); pass 2's launch follows from pass 1's, so it shares the key.
 */
export function decodeTwoPass(kernel: ReturnType<typeof mx.kernels.custom_kernel>, inputs: MlxArray[], key: string, s?: Stream): MlxArray {
  const opts = s ? { stream: s } : {};
  const parts = kernel.runKeyed(inputs, key, opts);
  try {
    return decodeCombineKernel.runKeyed([parts[0]!, parts[1]!, parts[2]!, inputs[0]!], key, opts)[0]!;
  } finally {
    for (const p of parts) p.dispose();
  }
}
