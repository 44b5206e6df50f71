// Direct CUDA launches of custom kernels (docs/custom-kernels.md, "Direct launch").
//
// MLX's CustomKernel::eval_gpu hashes the kernel's whole generated source (10 KB for the exact
// matvec), formats a module name and looks the module and the kernel up by name at every launch:
// 2-4 us of encode a launch over a built-in op, on a host-paced decode. DirectLaunch takes the
// same generated source from the CustomKernel (its public state()), compiles it once per process
// with NVRTC and MLX's options, and at each launch adds the kernel node to MLX's command encoder
// itself. MLX's CUDA entry points it calls are exported by libmlx but not declared without the
// CUDA headers, so they are looked up by symbol in libmlx (and through it NVRTC and the driver):
// one libmlxb serves the CPU and CUDA builds alike.
#include "kernel_direct.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "mlx/fast_primitives.h"
#include "mlx/version.h"

namespace mlxb {
extern std::atomic<uint64_t> direct_launches;
namespace {

// CUDA's dim3 as passed by value (12 bytes: the same registers as the real struct).
struct Dim3 {
  unsigned x, y, z;
};
struct CUfunc_st;
struct CUmod_st;
struct NvrtcProg;
using CUfunction = CUfunc_st*;
using CUmodule = CUmod_st*;
using NvrtcProgram = NvrtcProg*;

constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

// The functions this file calls, from libmlx's dependency tree.
struct Api {
  // MLX's CUDA backend. Member functions take the object first (Itanium C++ ABI).
  void* (*get_command_encoder)(mx::Stream);
  void (*set_input_array)(void*, const mx::array&);
  void (*set_output_array)(void*, const mx::array&);
  void (*add_kernel_node_raw)(void*, CUfunction, Dim3, Dim3, Dim3, unsigned, void**);
  const char* (*cccl_dir)();
  // NVRTC.
  int (*nvrtcVersion)(int*, int*);
  int (*nvrtcCreateProgram)(NvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  int (*nvrtcCompileProgram)(NvrtcProgram, int, const char* const*);
  int (*nvrtcGetProgramLogSize)(NvrtcProgram, size_t*);
  int (*nvrtcGetProgramLog)(NvrtcProgram, char*);
  int (*nvrtcAddNameExpression)(NvrtcProgram, const char*);
  int (*nvrtcGetLoweredName)(NvrtcProgram, const char*, const char**);
  int (*nvrtcGetCUBINSize)(NvrtcProgram, size_t*);
  int (*nvrtcGetCUBIN)(NvrtcProgram, char*);
  int (*nvrtcGetPTXSize)(NvrtcProgram, size_t*);
  int (*nvrtcGetPTX)(NvrtcProgram, char*);
  int (*nvrtcDestroyProgram)(NvrtcProgram*);
  // The driver.
  int (*cuModuleLoadData)(CUmodule*, const void*);
  int (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  int (*cuFuncSetAttribute)(CUfunction, int, int);
  int (*cuCtxGetDevice)(int*);
  int (*cuDeviceGetAttribute)(int*, int, int);
  // <site-packages>/mlx: MLX's headers and its include search start here.
  std::string mlx_root;
};

template <class F>
void bind(void* lib, F& f, const char* symbol) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
  if (!f) throw std::runtime_error(std::string("direct launch: libmlx's dependency tree has no ") + symbol);
}

// Null where libmlx is not a CUDA build (no MLX CUDA symbols).
const Api* api() {
  static std::once_flag once;
  static std::unique_ptr<Api> a;
  std::call_once(once, [] {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&mx::version), &info) || !info.dli_fname) return;
    void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!lib || !dlsym(lib, "_ZN3mlx4core2cu19get_command_encoderENS0_6StreamE")) return;
    auto x = std::make_unique<Api>();
    bind(lib, x->get_command_encoder, "_ZN3mlx4core2cu19get_command_encoderENS0_6StreamE");
    bind(lib, x->set_input_array, "_ZN3mlx4core2cu14CommandEncoder15set_input_arrayERKNS0_5arrayE");
    bind(lib, x->set_output_array, "_ZN3mlx4core2cu14CommandEncoder16set_output_arrayERKNS0_5arrayE");
    bind(lib, x->add_kernel_node_raw, "_ZN3mlx4core2cu14CommandEncoder19add_kernel_node_rawEP9CUfunc_st4dim3S5_S5_jPPv");
    bind(lib, x->cccl_dir, "_ZN3mlx4core2cu8cccl_dirEv");
    bind(lib, x->nvrtcVersion, "nvrtcVersion");
    bind(lib, x->nvrtcCreateProgram, "nvrtcCreateProgram");
    bind(lib, x->nvrtcCompileProgram, "nvrtcCompileProgram");
    bind(lib, x->nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
    bind(lib, x->nvrtcGetProgramLog, "nvrtcGetProgramLog");
    bind(lib, x->nvrtcAddNameExpression, "nvrtcAddNameExpression");
    bind(lib, x->nvrtcGetLoweredName, "nvrtcGetLoweredName");
    bind(lib, x->nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
    bind(lib, x->nvrtcGetCUBIN, "nvrtcGetCUBIN");
    bind(lib, x->nvrtcGetPTXSize, "nvrtcGetPTXSize");
    bind(lib, x->nvrtcGetPTX, "nvrtcGetPTX");
    bind(lib, x->nvrtcDestroyProgram, "nvrtcDestroyProgram");
    bind(lib, x->cuModuleLoadData, "cuModuleLoadData");
    bind(lib, x->cuModuleGetFunction, "cuModuleGetFunction");
    bind(lib, x->cuFuncSetAttribute, "cuFuncSetAttribute");
    bind(lib, x->cuCtxGetDevice, "cuCtxGetDevice");
    bind(lib, x->cuDeviceGetAttribute, "cuDeviceGetAttribute");
    std::string path = info.dli_fname;  // <root>/lib/libmlx.so
    path = path.substr(0, path.rfind('/'));
    x->mlx_root = path.substr(0, path.rfind('/'));
    a = std::move(x);
  });
  return a.get();
}

// MLX's NVRTC include search (jit_module.cpp's include_path_args): its bundled headers, CCCL, then
// the CUDA runtime headers of the nvidia wheel beside mlx, else CUDA_HOME / CUDA_PATH /
// /usr/local/cuda.
std::vector<std::string> include_args(const Api& a, int nvrtc_major) {
  auto exists = [](const std::string& p) { return !p.empty() && access(p.c_str(), F_OK) == 0; };
  std::vector<std::string> args;
  std::string inc = a.mlx_root + "/include";
  if (exists(inc)) args.push_back("--include-path=" + inc);
  std::string cccl = inc + "/cccl";
  if (!exists(cccl) && a.cccl_dir() && *a.cccl_dir()) cccl = a.cccl_dir();
  if (exists(cccl)) args.push_back("--include-path=" + cccl);
  std::string site = a.mlx_root.substr(0, a.mlx_root.rfind('/'));
  std::string cudart = site + "/nvidia/" + (nvrtc_major >= 13 ? "cu13" : "cuda_runtime") + "/include";
  if (!exists(cudart)) {
    const char* home = std::getenv("CUDA_HOME");
    if (!home) home = std::getenv("CUDA_PATH");
    cudart = std::string(home ? home : "/usr/local/cuda") + "/include";
  }
  if (!exists(cudart)) throw std::runtime_error("direct launch: no CUDA headers (set CUDA_HOME or CUDA_PATH)");
  args.push_back("--include-path=" + cudart);
  return args;
}

// MLX's generated source begins with its default header, whose utils.cuh is one of MLX's JIT headers
// (compiled into libmlx, not files): the definitions the kernels' signatures use stand in for it.
constexpr const char* MLX_UTILS_INCLUDE = "#include \"mlx/backend/cuda/device/utils.cuh\"";
constexpr const char* PRELUDE = R"(#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/cstdint>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
}  // namespace mlx::core::cu
using mlx::core::cu::Shape;
using mlx::core::cu::Strides;
)";

// The source to compile, or "" where it includes MLX JIT headers besides utils.cuh.
std::string direct_source(const std::string& mlx_source) {
  auto at = mlx_source.find(MLX_UTILS_INCLUDE);
  if (at == std::string::npos) return "";
  std::string s = mlx_source.substr(0, at) + PRELUDE + mlx_source.substr(at + std::strlen(MLX_UTILS_INCLUDE));
  if (s.find("#include \"mlx/") != std::string::npos) return "";
  return s;
}

std::string nvrtc_log(const Api& a, NvrtcProgram p) {
  size_t n = 0;
  a.nvrtcGetProgramLogSize(p, &n);
  std::string log(n, '\0');
  if (n) a.nvrtcGetProgramLog(p, log.data());
  return log;
}

// Compile `source` and load kernel `name` (MLX's: mlx::core::cu::custom_kernel_...), as MLX's
// jit_module.cpp does: --device-as-default-execution-space, SASS for the device's sm_XY(a), the same
// include path.
CUfunction compile(const Api& a, const std::string& source, const std::string& name, int smem) {
  int dev = 0, major = 0, minor = 0, nv_major = 0, nv_minor = 0;
  if (a.cuCtxGetDevice(&dev) || a.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) ||
      a.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    throw std::runtime_error("direct launch: no current CUDA device");
  a.nvrtcVersion(&nv_major, &nv_minor);
  // MLX's compiler_supports_device_sass: NVRTC 11.8+ writes SASS for every device it knows.
  bool sass = nv_major > 11 || (nv_major == 11 && nv_minor >= 8);
  std::string arch = std::string("--gpu-architecture=") + (sass ? "sm_" : "compute_") + std::to_string(major) + std::to_string(minor) +
                     (major >= 9 ? "a" : "");
  auto incs = include_args(a, nv_major);
  std::vector<const char*> opts{"--device-as-default-execution-space", arch.c_str()};
  for (auto& i : incs) opts.push_back(i.c_str());
  NvrtcProgram p = nullptr;
  if (a.nvrtcCreateProgram(&p, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr))
    throw std::runtime_error("direct launch: nvrtcCreateProgram failed for " + name);
  std::string error;
  CUfunction fn = nullptr;
  const char* lowered = nullptr;
  if (a.nvrtcAddNameExpression(p, name.c_str())) {
    error = "nvrtcAddNameExpression failed";
  } else if (a.nvrtcCompileProgram(p, static_cast<int>(opts.size()), opts.data())) {
    error = "NVRTC: " + nvrtc_log(a, p);
  } else if (a.nvrtcGetLoweredName(p, name.c_str(), &lowered) || !lowered) {
    error = "nvrtcGetLoweredName failed";
  } else {
    size_t n = 0;
    std::string image;
    int rc = sass ? a.nvrtcGetCUBINSize(p, &n) : a.nvrtcGetPTXSize(p, &n);
    if (!rc) {
      image.resize(n);
      rc = sass ? a.nvrtcGetCUBIN(p, image.data()) : a.nvrtcGetPTX(p, image.data());
    }
    CUmodule mod = nullptr;  // kept for the process, as MLX keeps its modules
    std::string mangled = lowered;  // owned by the program
    if (rc) {
      error = "reading the compiled image failed";
    } else if (a.cuModuleLoadData(&mod, image.data())) {
      error = "cuModuleLoadData failed";
    } else if (a.cuModuleGetFunction(&fn, mod, mangled.c_str())) {
      error = "cuModuleGetFunction failed";
    } else if (smem > 48000 && a.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)) {
      error = "setting the dynamic shared memory failed";
    }
  }
  a.nvrtcDestroyProgram(&p);
  if (!error.empty()) throw std::runtime_error("direct launch of " + name + ": " + error);
  return fn;
}

// One compiled kernel per generated source, shared by every primitive (launch key) made from it. A
// source that does not compile (headers missing on this machine) is recorded as null: its launches
// take MLX's path, with one line on stderr saying so.
CUfunction kernel_for(const Api& a, const std::string& source, const std::string& name, int smem) {
  static std::mutex mu;
  static std::unordered_map<std::string, CUfunction> compiled;
  std::lock_guard<std::mutex> lock(mu);
  auto hit = compiled.find(source);
  if (hit != compiled.end()) return hit->second;
  CUfunction fn = nullptr;
  try {
    fn = compile(a, source, name, smem);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlx-bun: %s; this kernel keeps MLX's launch path\n", e.what());
  }
  compiled.emplace(source, fn);
  return fn;
}

// How MLX passes a kernel's shape, strides and ndim: MAX_NDIM (10) values, zero-padded.
struct ShapeArg {
  int32_t v[10];
};
struct StridesArg {
  int64_t v[10];
};

class DirectLaunch : public mx::Primitive {
 public:
  // `state`: the CustomKernel's state(), read once by direct_launch.
  template <class State>
  DirectLaunch(std::shared_ptr<mx::Primitive> inner, const Api& a, std::string source, const State& state)
      : mx::Primitive(inner->stream()), inner_(std::move(inner)), api_(a), source_(std::move(source)) {
    const auto& [name, mlx_source, grid, tg, shape_infos, contiguous, init, scalars, precompiled, smem, options] = state;
    name_ = "mlx::core::cu::" + name;
    shape_infos_ = shape_infos;
    contiguous_ = contiguous;
    smem_ = smem;
    auto [gx, gy, gz] = grid;
    auto [tx, ty, tz] = tg;
    // CustomKernel::eval_gpu's launch geometry: the grid counts threads.
    block_ = {static_cast<unsigned>(std::min(tx, gx)), static_cast<unsigned>(std::min(ty, gy)), static_cast<unsigned>(std::min(tz, gz))};
    grid_ = {static_cast<unsigned>((gx + tx - 1) / tx), static_cast<unsigned>((gy + ty - 1) / ty), static_cast<unsigned>((gz + tz - 1) / tz)};
  }

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("Custom kernels only run on GPU.");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (size_t i = 0; i < inputs.size(); i++) {
      // MLX copies such an input first; and it refuses more than MAX_NDIM dimensions, with its own error.
      if ((contiguous_ && !inputs[i].flags().row_contiguous) || inputs[i].ndim() > 10) return inner_->eval_gpu(inputs, outputs);
    }
    if (!compiled_) {
      fn_ = kernel_for(api_, source_, name_, smem_);
      compiled_ = true;
    }
    if (!fn_) return inner_->eval_gpu(inputs, outputs);
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    // Argument storage: every pointer, shape and stride the kernel takes, then their addresses.
    std::vector<void*> ptrs;
    std::vector<ShapeArg> shapes;
    std::vector<StridesArg> strides;
    std::vector<int32_t> ndims;
    ptrs.reserve(inputs.size() + outputs.size());
    shapes.reserve(inputs.size());
    strides.reserve(inputs.size());
    ndims.reserve(inputs.size());
    std::vector<void*> args;
    args.reserve(4 * inputs.size() + outputs.size());
    for (size_t i = 0; i < inputs.size(); i++) {
      const auto& in = inputs[i];
      ptrs.push_back(device_ptr(in));
      args.push_back(&ptrs.back());
      if (std::get<0>(shape_infos_[i])) {
        ShapeArg s{};
        for (size_t d = 0; d < in.ndim(); d++) s.v[d] = in.shape(d);
        shapes.push_back(s);
        args.push_back(&shapes.back());
      }
      if (std::get<1>(shape_infos_[i])) {
        StridesArg s{};
        for (size_t d = 0; d < in.ndim(); d++) s.v[d] = in.strides()[d];
        strides.push_back(s);
        args.push_back(&strides.back());
      }
      if (std::get<2>(shape_infos_[i])) {
        ndims.push_back(in.ndim());
        args.push_back(&ndims.back());
      }
    }
    for (auto& out : outputs) {
      ptrs.push_back(device_ptr(out));
      args.push_back(&ptrs.back());
    }
    void* enc = api_.get_command_encoder(stream());
    for (auto& in : inputs) api_.set_input_array(enc, in);
    for (auto& out : outputs) api_.set_output_array(enc, out);
    api_.add_kernel_node_raw(enc, fn_, grid_, block_, Dim3{1, 1, 1}, static_cast<unsigned>(smem_), args.data());
    direct_launches.fetch_add(1, std::memory_order_relaxed);
  }

  const char* name() const override {
    return "CustomKernel";
  }

 private:
  // MLX's gpu_ptr: a CUDA buffer begins with its device pointer.
  static void* device_ptr(const mx::array& a) {
    return static_cast<char*>(*static_cast<void* const*>(a.buffer().ptr())) + a.offset();
  }

  std::shared_ptr<mx::Primitive> inner_;
  const Api& api_;
  std::string source_;
  std::string name_;
  std::vector<std::tuple<bool, bool, bool>> shape_infos_;
  bool contiguous_ = true;
  int smem_ = 0;
  Dim3 grid_{}, block_{};
  CUfunction fn_ = nullptr;
  bool compiled_ = false;
};

std::atomic<int> direct_choice{-1};  // -1: the environment variable
}  // namespace

std::atomic<uint64_t> direct_launches{0};

bool direct_launch_enabled() {
  int c = direct_choice.load(std::memory_order_relaxed);
  if (c < 0) {
    static const int env = [] {
      const char* v = std::getenv("MLX_BUN_DIRECT_LAUNCH");
      return v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0) ? 0 : 1;
    }();
    c = env;
  }
  return c == 1 && api() != nullptr;
}

std::shared_ptr<mx::Primitive> direct_launch(std::shared_ptr<mx::Primitive> inner, const std::vector<mx::array>& inputs) {
  const Api* a = api();
  if (!a || !inner || std::strcmp(inner->name(), "CustomKernel") != 0) return nullptr;
  auto& ck = static_cast<mx::fast::CustomKernel&>(*inner);
  const auto& st = ck.state();
  // Initial values (a fill first), precompiled sources and scalar arguments stay MLX's.
  if (std::get<6>(st).has_value() || std::get<8>(st) || !std::get<7>(st).empty()) return nullptr;
  // A shape argument of a 0-d input is not in the generated signature (build_kernel), though MLX passes it.
  const auto& infos = std::get<4>(st);
  for (size_t i = 0; i < inputs.size() && i < infos.size(); i++) {
    if (inputs[i].ndim() == 0 && (std::get<0>(infos[i]) || std::get<1>(infos[i]) || std::get<2>(infos[i]))) return nullptr;
  }
  auto source = direct_source(std::get<1>(st));
  if (source.empty()) return nullptr;
  return std::make_shared<DirectLaunch>(std::move(inner), *a, std::move(source), st);
}
}  // namespace mlxb

// 1: direct launches on (where MLX's CUDA backend is loaded), 0: off, -1: MLX_BUN_DIRECT_LAUNCH (unset: on).
MLXB_API void mlxb_kernel_set_direct(int on) {
  mlxb::direct_choice.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed);
}

// Kernels launched directly so far in this process (a check that the path ran).
MLXB_API double mlxb_kernel_direct_launches(void) {
  return static_cast<double>(mlxb::direct_launches.load(std::memory_order_relaxed));
}

// Whether launches made now go direct.
MLXB_API int mlxb_kernel_direct_enabled(void) {
  MLXB_GUARD(-1, { return mlxb::direct_launch_enabled() ? 1 : 0; })
}
