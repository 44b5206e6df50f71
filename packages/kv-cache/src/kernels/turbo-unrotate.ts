// The un-rotation of TurboQuant attention outputs (fwht_inverse: x = signs ⊙ H y / √D) as one
// kernel: MLX issues a hadamard_transform and a multiply, two launches on every full-attention
// layer of every decode step. The CUDA source rounds as MLX's CUDA kernels do (hadamard-source.ts;
// the sign flip is exact), so on CUDA it writes the composition's bits. No Metal source: MLX's
// Metal hadamard_transform rounds elsewhere, so Metal (and the CPU) keep the composition.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { cudaHadamard, hadamardLaunch, hadamardRows } from "./hadamard-source.ts";

const tq = mx.turboquant;

// One threadgroup of D threads per row; thread i owns element i.
const CUDA = `
  const int i = (int)threadIdx.x;
  const long long row = (long long)blockIdx.x;
  __shared__ float buf[D];
  const float x = static_cast<float>(y[row * D + i]);
${cudaHadamard("x", "rot")}
  out[row * D + i] = static_cast<T>(rot * static_cast<float>(signs[i]));
`;

const dimOf = ([y, signs]: readonly MlxArray[]): number | string => hadamardRows(y!, signs!, "outputs");

export const turboUnrotateKernel = mx.kernels.custom_kernel({
  name: "mlxb_turbo_unrotate",
  input_names: ["y", "signs"],
  output_names: ["out"],
  cuda: { source: CUDA },
  validate: (inputs) => {
    const d = dimOf(inputs);
    return typeof d === "string" ? d : null;
  },
  reference: ([y, signs], s) => [tq.fwht_inverse(y!, signs!, s)],
  launch: (inputs) => {
    const y = inputs[0]!;
    return { output_shapes: [y.shape], output_dtypes: [y.dtype], ...hadamardLaunch(y, dimOf(inputs) as number) };
  },
});
