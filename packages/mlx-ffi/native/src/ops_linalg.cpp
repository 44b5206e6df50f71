// Matrix products.
#include "ops_internal.h"

using namespace mlxb;

MLXB_BINARY(matmul, mx::matmul(x, y, st))
MLXB_BINARY(outer, mx::outer(x, y, st))
MLXB_BINARY(inner, mx::inner(x, y, st))

// D = beta * C + alpha * (A @ B); alpha/beta are float32 as in MLX.
MLXB_API mlxb_array mlxb_addmm(mlxb_array c, mlxb_array a, mlxb_array b, double alpha, double beta, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::addmm(arr(c), arr(a), arr(b), static_cast<float>(alpha), static_cast<float>(beta), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_tensordot(mlxb_array a, mlxb_array b, const int32_t* axes_a, const int32_t* axes_b, int n,
                                   mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (n < 0 || (n > 0 && (!axes_a || !axes_b))) throw std::invalid_argument("bad tensordot axes");
    return wrap(mx::tensordot(arr(a), arr(b), std::vector<int>(axes_a, axes_a + n), std::vector<int>(axes_b, axes_b + n),
                              stream_of(s)));
  })
}

// Masks may be NULL.
MLXB_API mlxb_array mlxb_block_masked_mm(mlxb_array a, mlxb_array b, int block_size, mlxb_array mask_out,
                                         mlxb_array mask_lhs, mlxb_array mask_rhs, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto opt = [](mlxb_array h) -> std::optional<mx::array> {
      if (!h) return std::nullopt;
      return arr(h);
    };
    return wrap(mx::block_masked_mm(arr(a), arr(b), block_size, opt(mask_out), opt(mask_lhs), opt(mask_rhs),
                                    stream_of(s)));
  })
}
