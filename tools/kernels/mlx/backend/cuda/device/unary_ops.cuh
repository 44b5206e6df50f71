// check_cuda_kernels.py --emulate: a CPU stand-in for MLX's unary functors (binary_ops.cuh says why).
#pragma once
#include <cmath>

namespace mlx::core::cu {
struct Tanh {
  template <typename T>
  T operator()(T x) { return T(::tanhf(float(x))); }
};
}  // namespace mlx::core::cu
