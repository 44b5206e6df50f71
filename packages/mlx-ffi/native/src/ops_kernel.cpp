// Custom GPU kernels: mx::fast::metal_kernel / cuda_kernel from source strings.
// Which path runs (a kernel source or the TS reference composition) is decided on the TS side
// (packages/mlx-ops/src/kernels/kernel.ts) from mlxb_gpu_backend() and the stream's device.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "kernel_direct.h"
#include "ops_internal.h"

using namespace mlxb;

namespace {
// MLX's kernel function writes the whole kernel source (signature + body, several KB) at every
// call, 12-16 us of graph building per launch on the H200 (docs/custom-kernels.md). The
// primitive it makes depends only on the launch key below, so the first call's primitive is
// kept and later calls with the same key make their outputs from it (as mx.compile's replay
// shares primitives). MLX_BUN_KERNEL_REUSE=0 turns this off (for measuring it).
struct Kernel {
  Kernel(mx::fast::CustomKernelFunction f, bool direct_ok) : fn(std::move(f)), direct_ok(direct_ok) {}
  mx::fast::CustomKernelFunction fn;
  // The kernel's source allows direct launches (kernel_direct.cpp): checked bit for bit on a GPU.
  bool direct_ok;
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<mx::Primitive>> prims;
};
// Enough for every shape class of a model's kernels; past it the cache starts over.
constexpr size_t MAX_PRIMITIVES = 1024;

bool reuse_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MLX_BUN_KERNEL_REUSE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

template <class T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::vector<std::string> split_names(const char* joined) {
  std::vector<std::string> out;
  if (!joined || !*joined) return out;
  std::stringstream ss(joined);
  std::string item;
  while (std::getline(ss, item, '\n')) out.push_back(item);
  return out;
}
std::string str_or_empty(const char* s) { return s ? std::string(s) : std::string(); }
}  // namespace

// 0: no GPU backend in this build/machine, 1: Metal, 2: CUDA.
MLXB_API int mlxb_gpu_backend(void) {
  MLXB_GUARD(-1, {
    if (mx::metal::is_available()) return 1;
    if (mx::cu::is_available()) return 2;
    return 0;
  })
}

// backend 1 = Metal (extra = atomic_outputs), 2 = CUDA (extra = dynamic shared memory bytes;
// direct = launches may go direct where they are on). Names are '\n'-joined. The source is the
// kernel body; MLX generates the signature.
MLXB_API void* mlxb_kernel_new(int backend, const char* name, const char* input_names, const char* output_names,
                               const char* source, const char* header, int ensure_row_contiguous, int extra, int direct) {
  MLXB_GUARD(nullptr, {
    if (!name || !source) throw std::invalid_argument("kernel needs a name and a source");
    auto ins = split_names(input_names);
    auto outs = split_names(output_names);
    if (backend == 1) {
      return new Kernel(mx::fast::metal_kernel(name, ins, outs, source, str_or_empty(header), ensure_row_contiguous != 0, extra != 0), false);
    }
    if (backend == 2) {
      return new Kernel(mx::fast::cuda_kernel(name, ins, outs, source, str_or_empty(header), ensure_row_contiguous != 0, extra), direct != 0);
    }
    throw std::invalid_argument("kernel backend must be 1 (metal) or 2 (cuda), got " + std::to_string(backend));
  })
}

MLXB_API void mlxb_kernel_free(void* k) { delete static_cast<Kernel*>(k); }

// Launch. Output shapes are flattened (ndims gives each one's rank); grid and threadgroup are
// 3 ints each (grid counts threads, as in MLX). Template args: '\n'-joined names, a kind per
// arg (0 int, 1 bool, 2 dtype code) and a value. Returns an array list of the outputs.
MLXB_API void* mlxb_kernel_call(void* k, const uint64_t* inputs, int n_in, const int32_t* out_shapes, const int32_t* out_ndims,
                                const int32_t* out_dtypes, int n_out, const int32_t* grid, const int32_t* threadgroup,
                                const char* tmpl_names, const int32_t* tmpl_kinds, const int32_t* tmpl_values, int n_tmpl,
                                int has_init, double init_value, int verbose, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (!k) throw std::invalid_argument("null kernel");
    if (!grid || !threadgroup) throw std::invalid_argument("grid and threadgroup are required");
    if (n_out > 0 && (!out_ndims || !out_dtypes)) throw std::invalid_argument("null output shapes or dtypes");
    if (n_tmpl > 0 && (!tmpl_kinds || !tmpl_values)) throw std::invalid_argument("null template args");
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    int off = 0;
    for (int i = 0; i < n_out; i++) {
      shapes.push_back(shape_from(out_shapes ? out_shapes + off : nullptr, out_ndims[i]));
      off += out_ndims[i];
      dtypes.push_back(dtype_from_code(out_dtypes[i]));
    }
    std::optional<float> init;
    if (has_init) init = static_cast<float>(init_value);
    auto& kernel = *static_cast<Kernel*>(k);
    auto ins = arrays_from(inputs, n_in);
    auto stream = mx::to_stream(stream_of(s));
    // What the generated source and the primitive depend on: the stream, grid, threadgroup,
    // initial value, template arguments, input dtypes (and which are scalars), output dtypes.
    std::string key;
    const bool direct = kernel.direct_ok && !verbose && direct_launch_enabled();
    if (reuse_enabled() && !verbose) {
      key.reserve(128);
      put(key, direct);
      put(key, stream.index);
      for (int i = 0; i < 3; i++) put(key, grid[i]), put(key, threadgroup[i]);
      put(key, has_init);
      if (has_init) put(key, *init);
      for (int i = 0; i < n_tmpl; i++) put(key, tmpl_kinds[i]), put(key, tmpl_values[i]);
      if (tmpl_names) key += tmpl_names;
      key += '|';
      for (auto& a : ins) put(key, a.dtype().val()), put(key, static_cast<char>(a.ndim() == 0));
      for (auto& d : dtypes) put(key, d.val());
      std::lock_guard<std::mutex> lock(kernel.mu);
      auto hit = kernel.prims.find(key);
      if (hit != kernel.prims.end()) return wrap_list(mx::array::make_arrays(std::move(shapes), dtypes, hit->second, ins));
    }
    // Only a call that makes a new primitive reads the template arguments by name (a hit skips
    // splitting the names: a stringstream and a string per argument, at every launch).
    auto names = split_names(tmpl_names);
    if (static_cast<int>(names.size()) != n_tmpl) throw std::invalid_argument("template names and values differ in count");
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> tmpl;
    for (int i = 0; i < n_tmpl; i++) {
      switch (tmpl_kinds[i]) {
        case 0: tmpl.emplace_back(names[i], static_cast<int>(tmpl_values[i])); break;
        case 1: tmpl.emplace_back(names[i], tmpl_values[i] != 0); break;
        case 2: tmpl.emplace_back(names[i], dtype_from_code(tmpl_values[i])); break;
        default: throw std::invalid_argument("unknown template arg kind");
      }
    }
    auto out = kernel.fn(ins, shapes, dtypes, {grid[0], grid[1], grid[2]}, {threadgroup[0], threadgroup[1], threadgroup[2]},
                         tmpl, init, verbose != 0, stream);
    if (direct && !out.empty() && out[0].has_primitive()) {
      // The same kernel launched without MLX's per-launch source hashing (kernel_direct.cpp).
      if (auto d = direct_launch(out[0].primitive_ptr(), ins)) out = mx::array::make_arrays(std::move(shapes), dtypes, d, ins);
    }
    if (!key.empty() && !out.empty() && out[0].has_primitive()) {
      std::lock_guard<std::mutex> lock(kernel.mu);
      if (kernel.prims.size() >= MAX_PRIMITIVES) kernel.prims.clear();
      kernel.prims.emplace(std::move(key), out[0].primitive_ptr());
    }
    return wrap_list(std::move(out));
  })
}
