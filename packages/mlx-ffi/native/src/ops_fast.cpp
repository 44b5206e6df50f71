// mx.fast: rms_norm, layer_norm, rope, scaled_dot_product_attention.
#include "ops_internal.h"

using namespace mlxb;

namespace {
// has_base = 0 means base is None (custom freqs are given instead).
std::optional<float> base_of(int has_base, double base) {
  if (!has_base) return std::nullopt;
  return static_cast<float>(base);
}
}  // namespace

MLXB_API mlxb_array mlxb_fast_rms_norm(mlxb_array x, mlxb_array w, double eps, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::fast::rms_norm(arr(x), opt_arr(w), static_cast<float>(eps), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_fast_layer_norm(mlxb_array x, mlxb_array w, mlxb_array b, double eps, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::fast::layer_norm(arr(x), opt_arr(w), opt_arr(b), static_cast<float>(eps), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_fast_rope(mlxb_array x, int dims, int traditional, int has_base, double base, double scale, int offset,
                                   mlxb_array freqs, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::fast::rope(arr(x), dims, traditional != 0, base_of(has_base, base), static_cast<float>(scale), offset,
                               opt_arr(freqs), stream_of(s)));
  })
}

// The offset as an array: a scalar, or one offset per batch row.
MLXB_API mlxb_array mlxb_fast_rope_offsets(mlxb_array x, int dims, int traditional, int has_base, double base, double scale,
                                           mlxb_array offset, mlxb_array freqs, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::fast::rope(arr(x), dims, traditional != 0, base_of(has_base, base), static_cast<float>(scale), arr(offset),
                               opt_arr(freqs), stream_of(s)));
  })
}

// mask_mode: 0 none, 1 "causal", 2 array (boolean or additive, in mask).
MLXB_API mlxb_array mlxb_fast_sdpa(mlxb_array q, mlxb_array k, mlxb_array v, double scale, int mask_mode, mlxb_array mask,
                                   mlxb_array sinks, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    const char* modes[] = {"", "causal", "array"};
    if (mask_mode < 0 || mask_mode > 2) throw std::invalid_argument("mask mode code must be 0..2");
    return wrap(mx::fast::scaled_dot_product_attention(arr(q), arr(k), arr(v), static_cast<float>(scale), modes[mask_mode], opt_arr(mask),
                                                       opt_arr(sinks), false, stream_of(s)));
  })
}
