// Quantization: quantize / dequantize, quantized matmul, gather_qmm and gather_mm (MoE).
// Group size or bits < 0 means the mode's default; modes are int codes (see quant_mode()).
#include "ops_internal.h"

using namespace mlxb;
namespace {
// Quantization modes by code: the TS side passes an int on the hot path, not a string.
std::string quant_mode(int code) {
  switch (code) {
    case 0: return "affine";
    case 1: return "mxfp4";
    case 2: return "mxfp8";
    case 3: return "nvfp4";
  }
  throw std::invalid_argument("unknown quantization mode code " + std::to_string(code));
}
}  // namespace

// Returns a list: [wq, scales] or [wq, scales, biases] (affine).
MLXB_API void* mlxb_quantize(mlxb_array w, int group_size, int bits, int mode, mlxb_array global_scale, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap_list(mx::quantize(arr(w), opt_int(group_size), opt_int(bits), quant_mode(mode), opt_arr(global_scale), stream_of(s)));
  })
}

// dtype < 0: MLX's default (the scales' dtype for affine, bfloat16 for the fp modes).
MLXB_API mlxb_array mlxb_dequantize(mlxb_array w, mlxb_array scales, mlxb_array biases, int group_size, int bits, int mode,
                                    mlxb_array global_scale, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    std::optional<mx::Dtype> dt;
    if (dtype >= 0) dt = dtype_from_code(dtype);
    return wrap(mx::dequantize(arr(w), arr(scales), opt_arr(biases), opt_int(group_size), opt_int(bits), quant_mode(mode),
                               opt_arr(global_scale), dt, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_quantized_matmul(mlxb_array x, mlxb_array w, mlxb_array scales, mlxb_array biases, int transpose,
                                          int group_size, int bits, int mode, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::quantized_matmul(arr(x), arr(w), arr(scales), opt_arr(biases), transpose != 0, opt_int(group_size),
                                     opt_int(bits), quant_mode(mode), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_gather_qmm(mlxb_array x, mlxb_array w, mlxb_array scales, mlxb_array biases, mlxb_array lhs,
                                    mlxb_array rhs, int transpose, int group_size, int bits, int mode,
                                    mlxb_array global_scale, int sorted, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::gather_qmm(arr(x), arr(w), arr(scales), opt_arr(biases), opt_arr(lhs), opt_arr(rhs), transpose != 0,
                               opt_int(group_size), opt_int(bits), quant_mode(mode), opt_arr(global_scale), sorted != 0,
                               stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_gather_mm(mlxb_array a, mlxb_array b, mlxb_array lhs, mlxb_array rhs, int sorted, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::gather_mm(arr(a), arr(b), opt_arr(lhs), opt_arr(rhs), sorted != 0, stream_of(s)));
  })
}
