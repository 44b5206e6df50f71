// Custom kernels: the declaration API and the kernels mlx-bun ships.
export {
  type GpuBackend,
  type KernelEnvironment,
  type KernelLaunch,
  type KernelPath,
  type KernelRunOptions,
  type KernelSource,
  type KernelSpec,
  type TemplateArg,
  CustomKernel,
  custom_kernel,
  gpu_backend,
  kernel_environment,
  select_kernel_path,
} from "./kernel.ts";
export { geglu, geglu_kernel } from "./geglu.ts";
