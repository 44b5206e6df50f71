// The CUDA architecture MLX compiles custom kernels for here (__CUDA_ARCH__: 900 on an H100/H200),
// read once by a one-thread kernel: the exact kernels keep MLX's bits only where they were read
// from and checked against MLX's SASS (sm90), so their "auto" settings ask this first.
import { evaluate, type MlxArray } from "@mlx-bun/mlx-ffi";
import { zeros } from "../creation.ts";
import { custom_kernel, kernel_environment, select_kernel_path } from "./kernel.ts";

const archKernel = custom_kernel({
  name: "mlxb_cuda_arch",
  input_names: ["x"],
  output_names: ["arch"],
  // A kernel takes at least one input; the value of x does not matter.
  cuda: { source: "arch[0] = __CUDA_ARCH__ + 0 * x[0];" },
  // No GPU: no architecture.
  reference: (_inputs, s) => [zeros([1], "int32", s)],
  launch: () => ({ output_shapes: [[1]], output_dtypes: ["int32"], grid: [1, 1, 1], threadgroup: [1, 1, 1] }),
});

/** The architecture whose MLX SASS the exact kernels reproduce (sm90: H100, H200). */
const EXACT_ARCH = 900;

let arch: number | null | undefined;

/** __CUDA_ARCH__ of the live CUDA device (e.g. 900), or null where CUDA is not the GPU backend here. */
export function cuda_arch(): number | null {
  if (arch === undefined) {
    if (select_kernel_path(archKernel.spec, kernel_environment()) !== "cuda") arch = null;
    else {
      using x = zeros([1], "int32");
      const out: MlxArray = archKernel.run([x])[0]!;
      evaluate(out);
      arch = out.item() as number;
      out.dispose();
    }
  }
  return arch;
}

/** Whether the live GPU is the one the exact kernels were read from and checked on: what their "auto" settings need. */
export function on_exact_arch(): boolean {
  return cuda_arch() === EXACT_ARCH;
}
