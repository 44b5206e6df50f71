// Quantized ops (mx.quantize, mx.dequantize, mx.quantized_matmul, mx.gather_qmm, mx.gather_mm)
// and QuantizedTensor, the {weight, scales, biases} triple a quantized layer holds.
import { FFIType } from "bun:ffi";
import { type Dtype, dtypeCode, type MlxArray, MlxError, type Stream } from "@mlx-bun/mlx-ffi";
import { describeArgs, takeList } from "./list.ts";
import { bindOps, result, sh } from "./native.ts";

const { ptr, i32 } = FFIType;
const lib = bindOps({
  mlxb_quantize: { args: [ptr, i32, i32, i32, ptr, ptr], returns: ptr },
  mlxb_dequantize: { args: [ptr, ptr, ptr, i32, i32, i32, ptr, i32, ptr], returns: ptr },
  mlxb_quantized_matmul: { args: [ptr, ptr, ptr, ptr, i32, i32, i32, i32, ptr], returns: ptr },
  mlxb_gather_qmm: { args: [ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, ptr, i32, ptr], returns: ptr },
  mlxb_gather_mm: { args: [ptr, ptr, ptr, ptr, i32, ptr], returns: ptr },
});

/** MLX quantization modes: affine (scale + bias per group) and the microscaling float formats. */
export type QuantMode = "affine" | "mxfp4" | "mxfp8" | "nvfp4";
const MODES: readonly QuantMode[] = ["affine", "mxfp4", "mxfp8", "nvfp4"];

/**
 * Group size / bits defaults per mode (MLX's table): affine 64/4 (groups 32, 64, 128; bits
 * 1-6, 8), mxfp4 32/4, mxfp8 32/8, nvfp4 16/4.
 */
export const QUANT_DEFAULTS: Readonly<Record<QuantMode, { group_size: number; bits: number }>> = {
  affine: { group_size: 64, bits: 4 },
  mxfp4: { group_size: 32, bits: 4 },
  mxfp8: { group_size: 32, bits: 8 },
  nvfp4: { group_size: 16, bits: 4 },
};

function modeCode(op: string, mode: QuantMode): number {
  const i = MODES.indexOf(mode);
  if (i < 0) throw new MlxError(`${op}: unknown quantization mode '${String(mode)}' (expected ${MODES.join(", ")})`);
  return i;
}

/** An optional int argument: -1 tells the native side "the mode's default". */
function optInt(op: string, name: string, v: number | undefined): number {
  if (v === undefined) return -1;
  if (!Number.isInteger(v) || v < 0) throw new MlxError(`${op}: ${name} must be a non-negative integer, got ${v}`);
  return v;
}

export interface QuantizeOptions {
  group_size?: number;
  bits?: number;
  mode?: QuantMode;
  /** nvfp4 only: a per-tensor float32 scale. */
  global_scale?: MlxArray;
  stream?: Stream;
}

/**
 * A quantized matrix: packed weight (uint32), per-group scales and, for affine, biases.
 * Owns its arrays: dispose it (or `using`) to free all of them.
 */
export class QuantizedTensor implements Disposable {
  /** Takes ownership of the arrays (e.g. a checkpoint's `weight`, `scales`, `biases`). */
  constructor(
    readonly weight: MlxArray,
    readonly scales: MlxArray,
    readonly biases: MlxArray | undefined,
    readonly groupSize: number,
    readonly bits: number,
    readonly mode: QuantMode,
  ) {}

  /** Quantize `w` along its last axis (mx.quantize) into a QuantizedTensor. */
  static quantize(w: MlxArray, opts: QuantizeOptions = {}): QuantizedTensor {
    const mode = opts.mode ?? "affine";
    const d = QUANT_DEFAULTS[mode] ?? QUANT_DEFAULTS.affine;
    const [weight, scales, biases] = quantize(w, opts);
    return new QuantizedTensor(weight, scales, biases, opts.group_size ?? d.group_size, opts.bits ?? d.bits, mode);
  }

  /** The float matrix back (mx.dequantize); `dtype` as in `dequantize`. */
  dequantize(opts: { dtype?: Dtype; stream?: Stream } = {}): MlxArray {
    return dequantize(this.weight, this.scales, this.biases, { ...this.#q(), ...opts });
  }

  /** x @ Wᵀ (transpose, the Linear layout; default) or x @ W. */
  matmul(x: MlxArray, opts: { transpose?: boolean; stream?: Stream } = {}): MlxArray {
    return quantized_matmul(x, this.weight, this.scales, this.biases, { ...this.#q(), ...opts });
  }

  /** Logical (unpacked) shape of the matrix. */
  get shape(): readonly number[] {
    const s = [...this.weight.shape];
    if (s.length) s[s.length - 1] = (s[s.length - 1]! * 32) / this.bits;
    return s;
  }

  /** Bytes held by weight, scales and biases. */
  get nbytes(): number {
    return this.weight.nbytes + this.scales.nbytes + (this.biases?.nbytes ?? 0);
  }

  #q(): { group_size: number; bits: number; mode: QuantMode } {
    return { group_size: this.groupSize, bits: this.bits, mode: this.mode };
  }

  dispose(): void {
    this.weight.dispose();
    this.scales.dispose();
    this.biases?.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  toString(): string {
    return `QuantizedTensor(shape=[${this.shape.join(", ")}], mode=${this.mode}, bits=${this.bits}, groupSize=${this.groupSize})`;
  }
}

/**
 * mx.quantize: [wq, scales, biases] for affine, [wq, scales] for the fp modes. The caller
 * owns the arrays (QuantizedTensor.quantize wraps them).
 */
export function quantize(w: MlxArray, opts: QuantizeOptions = {}): [MlxArray, MlxArray, MlxArray?] {
  const mode = opts.mode ?? "affine";
  const args = [w, `group_size=${opts.group_size ?? "default"}`, `bits=${opts.bits ?? "default"}`, `mode=${mode}`];
  const h = lib().mlxb_quantize(
    w.handle,
    optInt("quantize", "group_size", opts.group_size),
    optInt("quantize", "bits", opts.bits),
    modeCode("quantize", mode),
    opts.global_scale?.handle ?? null,
    sh(opts.stream),
  );
  return takeList("quantize", h, () => describeArgs(args)) as [MlxArray, MlxArray, MlxArray?];
}

export interface DequantizeOptions {
  group_size?: number;
  bits?: number;
  mode?: QuantMode;
  global_scale?: MlxArray;
  /** Output dtype; default: the scales' dtype for affine, bfloat16 for the fp modes (MLX's). */
  dtype?: Dtype;
  stream?: Stream;
}

/** mx.dequantize */
export function dequantize(w: MlxArray, scales: MlxArray, biases: MlxArray | undefined, opts: DequantizeOptions = {}): MlxArray {
  const mode = opts.mode ?? "affine";
  return result(
    "dequantize",
    lib().mlxb_dequantize(
      w.handle,
      scales.handle,
      biases?.handle ?? null,
      optInt("dequantize", "group_size", opts.group_size),
      optInt("dequantize", "bits", opts.bits),
      modeCode("dequantize", mode),
      opts.global_scale?.handle ?? null,
      opts.dtype === undefined ? -1 : dtypeCode(opts.dtype),
      sh(opts.stream),
    ),
    [w, scales, biases ?? "biases=None", () => `group_size=${opts.group_size ?? "default"}`, () => `bits=${opts.bits ?? "default"}`, () => `mode=${mode}`],
  );
}

export interface QuantizedMatmulOptions {
  /** x @ Wᵀ when true (default), x @ W when false. */
  transpose?: boolean;
  group_size?: number;
  bits?: number;
  mode?: QuantMode;
  stream?: Stream;
}

/** mx.quantized_matmul */
export function quantized_matmul(x: MlxArray, w: MlxArray, scales: MlxArray, biases: MlxArray | undefined, opts: QuantizedMatmulOptions = {}): MlxArray {
  const mode = opts.mode ?? "affine";
  const transpose = opts.transpose ?? true;
  return result(
    "quantized_matmul",
    lib().mlxb_quantized_matmul(
      x.handle,
      w.handle,
      scales.handle,
      biases?.handle ?? null,
      transpose ? 1 : 0,
      optInt("quantized_matmul", "group_size", opts.group_size),
      optInt("quantized_matmul", "bits", opts.bits),
      modeCode("quantized_matmul", mode),
      sh(opts.stream),
    ),
    [
      x,
      w,
      scales,
      biases ?? "biases=None",
      () => `transpose=${transpose}`,
      () => `group_size=${opts.group_size ?? "default"}`,
      () => `bits=${opts.bits ?? "default"}`,
    ],
  );
}

export interface GatherOptions {
  /** Flat indices into the batch dims of the left operand. */
  lhs_indices?: MlxArray;
  /** Flat indices into the batch dims of the right operand (the experts). */
  rhs_indices?: MlxArray;
  /** The indices are sorted (lets MLX use a faster kernel). */
  sorted_indices?: boolean;
  stream?: Stream;
}

/** mx.gather_qmm: quantized matmul with matrix-level gather (MoE experts). */
export function gather_qmm(
  x: MlxArray,
  w: MlxArray,
  scales: MlxArray,
  biases: MlxArray | undefined,
  opts: GatherOptions & Omit<QuantizedMatmulOptions, "stream"> & { global_scale?: MlxArray } = {},
): MlxArray {
  const mode = opts.mode ?? "affine";
  const transpose = opts.transpose ?? true;
  return result(
    "gather_qmm",
    lib().mlxb_gather_qmm(
      x.handle,
      w.handle,
      scales.handle,
      biases?.handle ?? null,
      opts.lhs_indices?.handle ?? null,
      opts.rhs_indices?.handle ?? null,
      transpose ? 1 : 0,
      optInt("gather_qmm", "group_size", opts.group_size),
      optInt("gather_qmm", "bits", opts.bits),
      modeCode("gather_qmm", mode),
      opts.global_scale?.handle ?? null,
      opts.sorted_indices ? 1 : 0,
      sh(opts.stream),
    ),
    [x, w, scales, biases ?? "biases=None", opts.lhs_indices ?? "lhs=None", opts.rhs_indices ?? "rhs=None", () => `transpose=${transpose}`],
  );
}

/** mx.gather_mm: matmul with matrix-level gather over the batch dims. */
export function gather_mm(a: MlxArray, b: MlxArray, opts: GatherOptions = {}): MlxArray {
  return result(
    "gather_mm",
    lib().mlxb_gather_mm(a.handle, b.handle, opts.lhs_indices?.handle ?? null, opts.rhs_indices?.handle ?? null, opts.sorted_indices ? 1 : 0, sh(opts.stream)),
    [a, b, opts.lhs_indices ?? "lhs=None", opts.rhs_indices ?? "rhs=None"],
  );
}
