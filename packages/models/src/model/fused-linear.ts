// Quantized linear layers over one input (q/k/v, gate/up) fused along their output rows, so a
// decode step issues one quantized matmul where it issued one per layer. Design and limits:
// docs/fused-projections.md.
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { linear, type ModuleWeights, qopts } from "./nn.ts";

/**
 * The most output rows (and input features) MLX's op may run a fused matmul over. MLX's CUDA
 * backend on sm90 runs its matrix-vector kernel for one row only up to 16384 of each and a tiled
 * GEMM beyond: MLX's op on a taller stack would leave the kernel its parts use. A taller stack
 * (each part within the bound) runs only through the exact-order matvec, which keeps each part's
 * qmv bits whatever the stack's height (mx.kernels.quantized_linear_stacked), and else as its parts.
 */
export const FUSED_MAX_DIM = 16384;

/** Linear modules fused along their output rows; each part's tensors are row views of the fused ones. */
export interface FusedLinear {
  readonly fused: ModuleWeights;
  readonly parts: readonly ModuleWeights[];
  /** Each part's weight when fused: a part whose tensors were replaced since (sharding) is not fused any more. */
  readonly weights: readonly MlxArray[];
  /** Where parts 2..n start in the fused output. */
  readonly splits: readonly number[];
  /** The most rows of one part, where the stack is taller than FUSED_MAX_DIM (else undefined). */
  readonly tall?: number;
}

function sameQuant(a: ModuleWeights, b: ModuleWeights): boolean {
  const [p, q] = [a.quant!, b.quant!];
  return (
    p.bits === q.bits && p.groupSize === q.groupSize && p.mode === q.mode && a.scales!.dtype === b.scales!.dtype && a.weight.shape[1] === b.weight.shape[1]
  );
}

/**
 * Fuse `parts` (affine-quantized 2-D linear layers over the same input, same quantization) into
 * one module, or null where they do not qualify. On success each part's weight, scales and biases
 * become row views of the fused tensors (`replace(old, view)` is told of each, to swap the
 * caller's references), and the fused tensors are pushed to `owned`: no memory is added.
 */
export function fuseLinears(parts: readonly ModuleWeights[], owned: MlxArray[], replace: (old: MlxArray, view: MlxArray) => void): FusedLinear | null {
  if (parts.length < 2) return null;
  const first = parts[0]!;
  for (const p of parts) {
    if (!p.quant || p.quant.mode !== "affine" || !p.scales || !p.biases || p.weight.ndim !== 2 || p.lora || p.reduce) return null;
    if (!sameQuant(first, p)) return null;
  }
  const rows = parts.map((p) => p.weight.shape[0]!);
  // Metal picks qmv_fast or qmv by N % 8 (and K): with every part a multiple of 8, the stack takes the parts' kernel.
  if (rows.some((n) => n % 8 !== 0)) return null;
  const total = rows.reduce((a, b) => a + b, 0);
  const inFeatures = (first.weight.shape[1]! * 32) / first.quant!.bits;
  if (Math.max(...rows) > FUSED_MAX_DIM || inFeatures > FUSED_MAX_DIM) return null;
  const splits: number[] = [];
  for (let i = 0, at = 0; i < rows.length - 1; i++) splits.push((at += rows[i]!));
  const fuse = (field: "weight" | "scales" | "biases"): MlxArray => {
    const olds = parts.map((p) => p[field]!);
    const whole = mx.concatenate(olds, 0);
    owned.push(whole);
    const views = mx.split(whole, splits, 0);
    parts.forEach((p, i) => {
      p[field] = views[i]!;
      replace(olds[i]!, views[i]!);
    });
    return whole;
  };
  const fused: ModuleWeights = { weight: fuse("weight"), scales: fuse("scales"), biases: fuse("biases"), quant: first.quant! };
  const tall = total > FUSED_MAX_DIM ? Math.max(...rows) : undefined;
  return { fused, parts, weights: parts.map((p) => p.weight), splits, ...(tall ? { tall } : {}) };
}

/**
 * The parts' outputs for input `x`: one fused matmul split into the parts' outputs where `x` is a
 * single row and the parts are unchanged (no adapter, no sharding), else each part's own linear.
 * MLX's quantized matrix-vector kernels (CPU, CUDA qmv, Metal qmv) compute each output row
 * alone, so either way every output holds the same bits.
 */
export function linearParts(group: FusedLinear | undefined, parts: readonly ModuleWeights[], x: MlxArray): MlxArray[] {
  const y = fusedLinear(group, parts, x);
  if (y) {
    using whole = y;
    return mx.split(whole, group!.splits, -1);
  }
  return parts.map((p) => linear(p, x));
}

/**
 * The fused matmul's whole output (the parts' outputs side by side) where `linearParts` would fuse,
 * else null. A stack taller than FUSED_MAX_DIM fuses only where the exact-order matvec takes it.
 */
export function fusedLinear(group: FusedLinear | undefined, parts: readonly ModuleWeights[], x: MlxArray): MlxArray | null {
  if (!group || !usable(group, parts, x) || fusedProjections() !== "on") return null;
  if (group.tall === undefined) return linear(group.fused, x);
  const f = group.fused;
  return mx.kernels.quantized_linear_stacked(x, f.weight, f.scales!, f.biases, qopts(f.quant!), group.tall);
}

/**
 * mlx-lm's `geglu(gate, up)` of a fused gate/up pair in one launch (the matvec with the GeGLU after
 * it: mx.kernels.quantized_linear_geglu, where that launch is on and takes the stack), else null.
 */
export function fusedGeglu(group: FusedLinear | undefined, parts: readonly ModuleWeights[], x: MlxArray): MlxArray | null {
  if (!group || parts.length !== 2 || !usable(group, parts, x) || fusedProjections() !== "on") return null;
  // The gate's rows; quantized_linear_geglu refuses a stack that is not two parts of that many.
  const f = group.fused;
  return mx.kernels.quantized_linear_geglu(x, f.weight, f.scales!, f.biases, qopts(f.quant!), group.splits[0]!);
}

function usable(g: FusedLinear, parts: readonly ModuleWeights[], x: MlxArray): boolean {
  if (x.size !== x.shape[x.ndim - 1]) return false;
  if (parts.length !== g.parts.length) return false;
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i]!;
    if (p !== g.parts[i] || p.weight !== g.weights[i] || p.lora || p.reduce) return false;
  }
  return true;
}

/** Free a fused group's tensors (the parts keep theirs). */
export function releaseFused(g: FusedLinear): void {
  for (const a of [g.fused.weight, g.fused.scales, g.fused.biases]) if (a instanceof MlxArray) a.dispose();
}

/** Whether single-row inputs take the fused matmuls: "on" (default) or "off" (each layer alone, for A/B runs). */
export type FusedProjections = "on" | "off";
let chosen: FusedProjections | undefined;

/** The setting in effect: setFusedProjections, else MLX_BUN_FUSED_PROJECTIONS, else "on". */
export function fusedProjections(): FusedProjections {
  if (chosen) return chosen;
  const v = process.env.MLX_BUN_FUSED_PROJECTIONS;
  if (v === undefined || v === "" || v === "on") return "on";
  if (v === "off") return "off";
  throw new Error(`MLX_BUN_FUSED_PROJECTIONS=${v}: expected on or off`);
}

/** Choose for this process; undefined goes back to MLX_BUN_FUSED_PROJECTIONS (or the default). */
export function setFusedProjections(v: FusedProjections | undefined): void {
  if (v !== undefined && v !== "on" && v !== "off") throw new Error(`setFusedProjections: expected "on" or "off", got ${String(v)}`);
  chosen = v;
}
