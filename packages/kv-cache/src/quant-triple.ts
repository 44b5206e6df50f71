// The three planes of an affine-quantized tensor, shared by the unfused attention (affine.ts)
// and the fused decode kernel (kernels/affine-decode.ts).
import type { MlxArray } from "@mlx-bun/mlx-ffi";

/** Packed weights with their per-group scales and biases, as `mx.quantize` returns them. */
export interface QuantTriple {
  w: MlxArray;
  scales: MlxArray;
  biases: MlxArray;
}
