// Direct CUDA launches of custom kernels (docs/custom-kernels.md, "Direct launch").
#pragma once
#include <memory>

#include "internal.h"

namespace mlxb {
// Whether direct launches are on for the kernels that allow them: mlxb_kernel_set_direct's choice,
// else MLX_BUN_DIRECT_LAUNCH=1|0 (default on), and only where MLX's CUDA backend is loaded.
bool direct_launch_enabled();

// A primitive that launches the kernel of MLX's CustomKernel `inner` (its generated source, grid,
// threadgroup and shared memory) from a module it compiled once, adding the node to MLX's command
// encoder itself; calls it cannot take (an input to copy, an initial value, a source that includes
// MLX's JIT headers beyond utils.cuh) run `inner`. Null when `inner` is not a CUDA CustomKernel.
std::shared_ptr<mx::Primitive> direct_launch(std::shared_ptr<mx::Primitive> inner, const std::vector<mx::array>& inputs);
}  // namespace mlxb
