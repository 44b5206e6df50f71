// Nsight Compute ranges from a Bun process on MLX's CUDA backend: `ncu --profile-from-start off`
// then records only the kernels between start() and stop(). MLX links the CUDA runtime
// statically, so these are the driver's cuProfilerStart/Stop (libcuda is mapped in the process).
// A marker kernel (mlxb_profile_marker) separates sections of one range in ncu's list.
import { dlopen, FFIType } from "bun:ffi";
import { readFileSync } from "node:fs";
import { evaluate, MlxArray, synchronize } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

export interface CudaProfiler {
  /** Start recording (after the GPU is idle); returns the driver's status (0 = success). */
  start(): number;
  /** Stop recording once the GPU has finished what was queued. */
  stop(): number;
  /** One tiny kernel, evaluated and waited for: a boundary in the recorded list. */
  mark(): void;
  /** The libcuda path the calls go to. */
  readonly library: string;
}

export function cudaProfiler(): CudaProfiler {
  const maps = readFileSync("/proc/self/maps", "utf8");
  const library = maps
    .split("\n")
    .map((l) => l.split(/\s+/).at(-1) ?? "")
    .find((p) => /\/libcuda\.so[.\d]*$/.test(p));
  if (!library) throw new Error("libcuda is not mapped in this process (not MLX's CUDA backend?)");
  const drv = dlopen(library, { cuProfilerStart: { args: [], returns: FFIType.i32 }, cuProfilerStop: { args: [], returns: FFIType.i32 } });
  const marker = mx.kernels.custom_kernel({
    name: "mlxb_profile_marker",
    input_names: ["a"],
    output_names: ["out"],
    cuda: { source: "  if (threadIdx.x == 0) out[0] = a[0];" },
    reference: ([a]) => [a!.retain()],
    launch: ([a]) => ({ output_shapes: [a!.shape], output_dtypes: [a!.dtype], grid: [1, 1, 1], threadgroup: [1, 1, 1] }),
  });
  const one = MlxArray.fromNumbers([1], [1], "float32");
  return {
    library,
    start() {
      synchronize();
      return drv.symbols.cuProfilerStart();
    },
    stop() {
      synchronize();
      return drv.symbols.cuProfilerStop();
    },
    mark() {
      const [m] = marker.run([one]);
      evaluate(m!);
      m!.dispose();
      synchronize();
    },
  };
}
