// Helpers shared by the part-B op files (quantized, fast, compile, kernels, TurboQuant).
#pragma once
#include <cmath>
#include <optional>
#include <vector>

#include "ops_internal.h"

namespace mlxb {
// A nullable array handle as std::optional.
inline std::optional<mx::array> opt_arr(mlxb_array h) {
  if (!h) return std::nullopt;
  return arr(h);
}
// Negative means "use the mode's default" (std::nullopt).
inline std::optional<int> opt_int(int v) {
  if (v < 0) return std::nullopt;
  return v;
}
// Quantization modes by code: the TS side passes an int on the hot path, not a string.
inline std::string quant_mode(int code) {
  switch (code) {
    case 0: return "affine";
    case 1: return "mxfp4";
    case 2: return "mxfp8";
    case 3: return "nvfp4";
  }
  throw std::invalid_argument("unknown quantization mode code " + std::to_string(code));
}
}  // namespace mlxb
