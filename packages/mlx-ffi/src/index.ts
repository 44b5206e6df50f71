/**
 * @mlx-bun/mlx-ffi: bun:ffi bindings to the mlx-bun C ABI over MLX C++.
 * Arrays (MlxArray), dtypes, eval, devices/streams, memory, safetensors.
 */
export { MlxArray, checkShape, handleList, type NestedList } from "./array.ts";
export {
  DTYPES,
  dtypeCode,
  dtypeFromCode,
  dtypeOfHostArray,
  isDtype,
  isFloating,
  isInteger,
  itemSize,
  type Dtype,
  type HostArray,
} from "./dtype.ts";
export { fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits } from "./half.ts";
export {
  ABI_VERSION,
  MlxError,
  NativeLibraryError,
  checkHandle,
  checkStatus,
  coreSymbols,
  cstr,
  fail,
  lastError,
  lib,
  libraryCandidates,
  openLibrary,
  prebuiltCandidates,
  prebuiltPackages,
  resolveLibraryPath,
} from "./library.ts";
export {
  Stream,
  asyncEval,
  asyncEvalInBackground,
  BackgroundJob,
  joinBackground,
  useSharedStreams,
  defaultDevice,
  evaluate,
  exportToDot,
  isAvailable,
  isDeviceAvailable,
  memory,
  mlxVersion,
  setDefaultDevice,
  setDefaultStream,
  synchronize,
  withStream,
  waitFor,
  type DeviceType,
} from "./runtime.ts";
export {
  SafetensorsError,
  loadSafetensors,
  readSafetensorsHeader,
  saveSafetensors,
  type SafetensorsHeader,
  type SafetensorsLoad,
  type TensorInfo,
} from "./safetensors.ts";
export {
  MappedFile,
  PAD_PREFIX,
  liveMappings,
  mapSafetensors,
  saveMappableSafetensors,
  type MappableSaveInfo,
  type MappableSaveOptions,
  type MappedSafetensors,
} from "./mmap.ts";
