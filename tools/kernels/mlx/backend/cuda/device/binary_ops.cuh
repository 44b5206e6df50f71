// A stand-in for the MLX functors a kernel body includes from MLX's JIT headers
// (mlx/backend/cuda/device/binary_ops.cuh, which MLX's NVRTC serves on a GPU), for
// check_cuda_kernels.py --emulate (g++ on cuda_emu.h) and ptxas_regs.py (NVRTC without MLX): each
// op of a bf16 pair in float, rounded once to bf16. The emulator checks data flow; a GPU, MLX's bits.
#pragma once
#ifndef __CUDACC_RTC__
#include <cmath>
#endif

namespace mlx::core::cu {
struct Add {
  template <typename T>
  __device__ T operator()(T x, T y) { return T(float(x) + float(y)); }
};
struct Multiply {
  template <typename T>
  __device__ T operator()(T x, T y) { return T(float(x) * float(y)); }
};
struct Power {
  template <typename T>
  __device__ T operator()(T base, T exp) { return T(::powf(float(base), float(exp))); }
};
}  // namespace mlx::core::cu
