// Part B of @mlx-bun/mlx-ops: quantized ops, mx.fast, mx.compile, custom kernels, TurboQuant.
// Re-exported by index.ts.
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
