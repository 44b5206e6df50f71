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
  inputsKey,
  kernel_environment,
  select_kernel_path,
} from "./kernel.ts";
export { cuda_arch } from "./cuda-arch.ts";
export { geglu, geglu_kernel } from "./geglu.ts";
export { sdpa_unit_scale } from "./sdpa-unit-scale.ts";
export { QMV_EXACT_STAGE_MAX_BYTES, qmv_exact_stage, qmv_exact_staged, set_qmv_exact_staged } from "./qmv-exact.ts";
export {
  type FastQmvSetting,
  type QmvConfig,
  type QmvShape,
  QMV_BITS,
  QMV_EXACT_AUTO_MIN_ELEMENTS,
  QMV_GROUP_SIZES,
  QMV_MAX_ROWS,
  fast_qmv_enabled,
  qmv,
  qmv_config,
  qmv_kernel,
  qmv_launch_of,
  qmv_shape,
  quantized_linear,
  quantized_linear_stacked,
  set_fast_qmv,
} from "./qmv.ts";
export {
  type ExactNormsSetting,
  type QHeads,
  type QkvHeads,
  NORM_EXACT_MAX_AXIS,
  exact_norms_enabled,
  norm_partition,
  norm_threads,
  q_norm_exact,
  q_norm_fits,
  qkv_norm_exact,
  qkv_norm_fits,
  residual_exact,
  residual_fits,
  residual_norm_exact,
  residual_norm_fits,
  set_exact_norms,
} from "./norm-exact.ts";
export {
  type SdpaDecodeSetting,
  SDPA_DECODE_MAX_KEYS,
  sdpa_decode,
  sdpa_decode_enabled,
  sdpa_decode_scores_kernel,
  sdpa_decode_values_kernel,
  set_sdpa_decode,
} from "./sdpa-decode.ts";
