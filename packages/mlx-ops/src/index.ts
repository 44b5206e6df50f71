/**
 * @mlx-bun/mlx-ops: typed MLX ops named like MLX Python (`mx.*`, `mx.random.*`, `mx.fast.*`).
 * `import * as mx from "@mlx-bun/mlx-ops"` and translate line by line: `mx.softmax(x, -1,
 * { precise: true })`, `mx.index(x, ":", -1)` for `x[:, -1]`, `mx.random.normal([2, 3], { key })`.
 */
export * from "./creation.ts";
export * from "./elementwise.ts";
export * from "./reduce.ts";
export * from "./shape.ts";
export * from "./linalg.ts";
export * as random from "./random.ts";
export * as distributed from "./distributed.ts";
export { type ArrayOrScalar, type Scalar, scalarDtype } from "./scalar.ts";
export type { Axes } from "./axes.ts";
export {
  type DequantizeOptions,
  type GatherOptions,
  type QuantizeOptions,
  type QuantizedMatmulOptions,
  type QuantMode,
  QUANT_DEFAULTS,
  QuantizedTensor,
  dequantize,
  gather_mm,
  gather_qmm,
  quantize,
  quantized_matmul,
} from "./quantized.ts";
export { type AttentionMask, type RopeOptions, type SdpaOptions, fast } from "./fast.ts";
export { type CompileOptions, type CompiledFunction, compile, set_compile_enabled } from "./compile.ts";
export * as kernels from "./kernels/index.ts";
export { type DeviceCodebook, type GaussianCodebook, turboquant } from "./turboquant.ts";
