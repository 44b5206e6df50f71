// Fused GeGLU: gelu_approx(gate) * up, the Gemma MLP activation, in one pass over memory
// (the composition reads and writes the intermediate gelu_approx(gate) in full).
import { isFloating, type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import { gelu_approx, multiply } from "../elementwise.ts";
import { custom_kernel } from "./kernel.ts";

// Both sources compute in float32 and round once at the end, so they can differ from the
// reference (which rounds after every op in the input dtype) by about one ulp of that dtype.
// gelu_approx(x) = 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), as mlx.nn.gelu_approx.
const METAL = `
  uint elem = thread_position_in_grid.x;
  float g = static_cast<float>(gate[elem]);
  float u = static_cast<float>(up[elem]);
  float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
  out[elem] = static_cast<T>(0.5f * g * (1.0f + metal::precise::tanh(inner)) * u);
`;

// MLX launches ceil(grid / threadgroup) whole blocks on CUDA: threads past the end return.
const CUDA = `
  auto elem = cooperative_groups::this_grid().thread_rank();
  long long n = 1;
  for (int i = 0; i < gate_ndim; ++i) n *= gate_shape[i];
  if (elem >= n) return;
  float g = static_cast<float>(gate[elem]);
  float u = static_cast<float>(up[elem]);
  float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
  out[elem] = static_cast<T>(0.5f * g * (1.0f + tanhf(inner)) * u);
`;

export const geglu_kernel = custom_kernel({
  name: "mlxb_geglu",
  input_names: ["gate", "up"],
  output_names: ["out"],
  metal: { source: METAL },
  cuda: { source: CUDA },
  validate: ([gate, up]) => {
    if (gate!.shape.join() !== up!.shape.join()) return "gate and up must have the same shape";
    if (gate!.dtype !== up!.dtype) return "gate and up must have the same dtype";
    if (!isFloating(gate!.dtype)) return "needs floating-point inputs";
    return null;
  },
  reference: ([gate, up], s) => {
    using g = gelu_approx(gate!, s);
    return [multiply(g, up!, s)];
  },
  launch: ([gate]) => ({
    output_shapes: [gate!.shape],
    output_dtypes: [gate!.dtype],
    grid: [gate!.size, 1, 1],
    threadgroup: [256, 1, 1],
    template: [["T", gate!.dtype]],
  }),
});

/** gelu_approx(gate) * up (fused on Metal/CUDA, the plain composition elsewhere). */
export function geglu(gate: MlxArray, up: MlxArray, s?: Stream): MlxArray {
  return geglu_kernel.run([gate, up], { stream: s })[0]!;
}
