// check_cuda_kernels.py --emulate: a CPU stand-in for MLX's unary functors (binary_ops.cuh says why).
#pragma once
#ifndef __CUDACC_RTC__
#include <cmath>
#endif

namespace mlx::core::cu {
struct Tanh {
  template <typename T>
  __device__ T operator()(T x) { return T(::tanhf(float(x))); }
};
}  // namespace mlx::core::cu
