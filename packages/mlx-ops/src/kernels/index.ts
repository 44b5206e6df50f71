// Custom kernels: the declaration API and the kernels mlx-bun ships.
export {
  type GpuBackend,
  type KernelEnvironment,
  type KernelLaunch,
  type KernelPath,
  type KernelRunOptions,
  type KernelSource,
  type KernelSpec,
  type PreparedLaunch,
  type TemplateArg,
  CustomKernel,
  custom_kernel,
  gpu_backend,
  kernel_environment,
  select_kernel_path,
} from "./kernel.ts";
export { geglu, geglu_kernel } from "./geglu.ts";
export {
  type FastQmvSetting,
  type QmvConfig,
  type QmvShape,
  QMV_BITS,
  QMV_GROUP_SIZES,
  QMV_MAX_ROWS,
  fast_qmv_enabled,
  qmv,
  qmv_config,
  qmv_kernel,
  qmv_launch_of,
  qmv_shape,
  quantized_linear,
  set_fast_qmv,
} from "./qmv.ts";
