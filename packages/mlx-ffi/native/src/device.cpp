// Devices and streams. Device types: 0 = cpu, 1 = gpu.
#include "internal.h"

using namespace mlxb;

static mx::Device::DeviceType dev_type(int t) {
  if (t == 0) return mx::Device::cpu;
  if (t == 1) return mx::Device::gpu;
  throw std::invalid_argument("unknown device type " + std::to_string(t) + " (0 = cpu, 1 = gpu)");
}

MLXB_API int mlxb_device_is_available(int type) { MLXB_GUARD(-1, { return mx::is_available(mx::Device(dev_type(type))) ? 1 : 0; }) }
MLXB_API int mlxb_default_device_type(void) { MLXB_GUARD(-1, { return mx::default_device().type == mx::Device::gpu ? 1 : 0; }) }
MLXB_API int mlxb_set_default_device(int type, int index) {
  MLXB_GUARD(-1, {
    mx::Device d(dev_type(type), index);
    if (!mx::is_available(d)) throw std::invalid_argument(std::string(type ? "gpu" : "cpu") + " device is not available in this MLX build");
    mx::set_default_device(d);
    return 0;
  })
}
MLXB_API mlxb_stream mlxb_default_stream(int type) { MLXB_GUARD(nullptr, { return new mx::Stream(mx::default_stream(mx::Device(dev_type(type)))); }) }
MLXB_API mlxb_stream mlxb_new_stream(int type) { MLXB_GUARD(nullptr, { return new mx::Stream(mx::new_stream(mx::Device(dev_type(type)))); }) }
// The stream ops without an explicit stream run on (mx.stream(...) in Python sets it).
MLXB_API int mlxb_set_default_stream(mlxb_stream s) {
  MLXB_GUARD(-1, {
    if (!s) throw std::invalid_argument("null stream handle");
    mx::set_default_stream(*static_cast<mx::Stream*>(s));
    return 0;
  })
}
MLXB_API void mlxb_stream_free(mlxb_stream s) { delete static_cast<mx::Stream*>(s); }
MLXB_API int mlxb_stream_index(mlxb_stream s) { MLXB_GUARD(-1, { return static_cast<mx::Stream*>(s)->index; }) }
MLXB_API int mlxb_stream_device_type(mlxb_stream s) {
  MLXB_GUARD(-1, { return static_cast<mx::Stream*>(s)->device.type == mx::Device::gpu ? 1 : 0; })
}
MLXB_API int mlxb_synchronize(mlxb_stream s) {
  MLXB_GUARD(-1, {
    join_background();
    if (s) mx::synchronize(*static_cast<mx::Stream*>(s));
    else mx::synchronize();
    return 0;
  })
}

// mlx-bun's defaults for MLX settings read from the environment, applied where the user set none
// (call before the first evaluation: MLX reads them once). On CUDA, MLX closes a CUDA graph every
// MLX_MAX_OPS_PER_BUFFER kernels (default 20); a decode step of a small model then launches dozens
// of graphs and the GPU idles between them. 60 measured best with background evaluation on an
// H200 (docs/benchmarks.md, "CUDA graph size").
MLXB_API int mlxb_apply_env_defaults(void) {
  MLXB_GUARD(-1, {
    if (mx::cu::is_available()) setenv("MLX_MAX_OPS_PER_BUFFER", "60", 0);
    return 0;
  })
}
