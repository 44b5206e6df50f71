// check_cuda_kernels.py --emulate: a CPU stand-in for the MLX functors a kernel body includes from
// MLX's JIT headers (mlx/backend/cuda/device/binary_ops.cuh on a GPU). Each op of a bf16 pair in
// float, rounded once to bf16 (the emulator checks the dataflow; a GPU checks MLX's own bits).
#pragma once
#include <cmath>

namespace mlx::core::cu {
struct Add {
  template <typename T>
  T operator()(T x, T y) { return T(float(x) + float(y)); }
};
struct Multiply {
  template <typename T>
  T operator()(T x, T y) { return T(float(x) * float(y)); }
};
struct Power {
  template <typename T>
  T operator()(T base, T exp) { return T(::powf(float(base), float(exp))); }
};
}  // namespace mlx::core::cu
