// Elementwise ops: arithmetic, comparisons, logic, math functions, casts, and
// the mlx.nn activations composed exactly as mlx.nn composes them.
#include <cmath>

#include "ops_internal.h"

using namespace mlxb;

// arithmetic
MLXB_BINARY(add, mx::add(x, y, st))
MLXB_BINARY(subtract, mx::subtract(x, y, st))
MLXB_BINARY(multiply, mx::multiply(x, y, st))
MLXB_BINARY(divide, mx::divide(x, y, st))
MLXB_BINARY(power, mx::power(x, y, st))
MLXB_BINARY(remainder, mx::remainder(x, y, st))
MLXB_BINARY(floor_divide, mx::floor_divide(x, y, st))
MLXB_BINARY(maximum, mx::maximum(x, y, st))
MLXB_BINARY(minimum, mx::minimum(x, y, st))
MLXB_BINARY(logaddexp, mx::logaddexp(x, y, st))
MLXB_BINARY(arctan2, mx::arctan2(x, y, st))

// comparisons and logic
MLXB_BINARY(equal, mx::equal(x, y, st))
MLXB_BINARY(not_equal, mx::not_equal(x, y, st))
MLXB_BINARY(less, mx::less(x, y, st))
MLXB_BINARY(less_equal, mx::less_equal(x, y, st))
MLXB_BINARY(greater, mx::greater(x, y, st))
MLXB_BINARY(greater_equal, mx::greater_equal(x, y, st))
MLXB_BINARY(logical_and, mx::logical_and(x, y, st))
MLXB_BINARY(logical_or, mx::logical_or(x, y, st))

// bitwise (integer packing, masks)
MLXB_BINARY(bitwise_and, mx::bitwise_and(x, y, st))
MLXB_BINARY(bitwise_or, mx::bitwise_or(x, y, st))
MLXB_BINARY(bitwise_xor, mx::bitwise_xor(x, y, st))
MLXB_BINARY(left_shift, mx::left_shift(x, y, st))
MLXB_BINARY(right_shift, mx::right_shift(x, y, st))

// unary math
MLXB_UNARY(negative, mx::negative(x, st))
MLXB_UNARY(square, mx::square(x, st))
MLXB_UNARY(reciprocal, mx::reciprocal(x, st))
MLXB_UNARY(abs, mx::abs(x, st))
MLXB_UNARY(sign, mx::sign(x, st))
MLXB_UNARY(sqrt, mx::sqrt(x, st))
MLXB_UNARY(rsqrt, mx::rsqrt(x, st))
MLXB_UNARY(exp, mx::exp(x, st))
MLXB_UNARY(expm1, mx::expm1(x, st))
MLXB_UNARY(log, mx::log(x, st))
MLXB_UNARY(log2, mx::log2(x, st))
MLXB_UNARY(log10, mx::log10(x, st))
MLXB_UNARY(log1p, mx::log1p(x, st))
MLXB_UNARY(sin, mx::sin(x, st))
MLXB_UNARY(cos, mx::cos(x, st))
MLXB_UNARY(tan, mx::tan(x, st))
MLXB_UNARY(tanh, mx::tanh(x, st))
MLXB_UNARY(sigmoid, mx::sigmoid(x, st))
MLXB_UNARY(erf, mx::erf(x, st))
MLXB_UNARY(erfinv, mx::erfinv(x, st))
MLXB_UNARY(floor, mx::floor(x, st))
MLXB_UNARY(ceil, mx::ceil(x, st))
MLXB_UNARY(logical_not, mx::logical_not(x, st))
MLXB_UNARY(bitwise_invert, mx::bitwise_invert(x, st))
MLXB_UNARY(isnan, mx::isnan(x, st))
MLXB_UNARY(isinf, mx::isinf(x, st))
MLXB_UNARY(isfinite, mx::isfinite(x, st))
MLXB_UNARY(stop_gradient, mx::stop_gradient(x, st))

MLXB_API mlxb_array mlxb_round(mlxb_array a, int decimals, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::round(arr(a), decimals, stream_of(s))); })
}

MLXB_API mlxb_array mlxb_astype(mlxb_array a, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::astype(arr(a), dtype_from_code(dtype), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_where(mlxb_array c, mlxb_array a, mlxb_array b, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::where(arr(c), arr(a), arr(b), stream_of(s))); })
}

// Either bound may be NULL (no bound on that side).
MLXB_API mlxb_array mlxb_clip(mlxb_array a, mlxb_array lo, mlxb_array hi, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    std::optional<mx::array> l, h;
    if (lo) l = arr(lo);
    if (hi) h = arr(hi);
    return wrap(mx::clip(arr(a), l, h, stream_of(s)));
  })
}

namespace {
// A Python float next to array x, as MLX Python's weak scalars: float32-rounded,
// then x's dtype when x is floating (float32 otherwise).
mx::array weak_float(const mx::array& x, double v) {
  auto dt = mx::issubdtype(x.dtype(), mx::floating) ? x.dtype() : mx::float32;
  return mx::array(static_cast<float>(v), dt);
}
// A Python int next to array x: x's dtype (bool becomes int32).
mx::array weak_int(const mx::array& x, int64_t v) {
  return mx::array(v, x.dtype() == mx::bool_ ? mx::int32 : x.dtype());
}
}  // namespace

// mlx.nn activations: the same ops, operands and dtypes as mlx/nn/layers/activations.py,
// one FFI crossing each. Tests compare them bit-for-bit with mlx.nn.
//
// mlx.nn wraps each of these in mx.compile(shapeless=True), so on the default stream we call a
// compiled function of the same ops too: the graph (one Compiled primitive, fused on GPUs) is
// then the one mlx-lm builds, which matters for speed and for bit-equality on CUDA. On an
// explicit stream the plain composition runs (compiled functions take the default stream).
#define MLXB_UNARY_NN(name, expr)                                                     \
  static std::vector<mx::array> name##_nn(const std::vector<mx::array>& in) {         \
    const mx::array& x = in[0];                                                       \
    mx::StreamOrDevice st = {};                                                       \
    return {expr};                                                                    \
  }                                                                                   \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, mlxb_stream s) {                      \
    MLXB_GUARD(nullptr, {                                                             \
      auto& x = mlxb::arr(a);                                                         \
      if (!s) {                                                                       \
        static const auto compiled = mx::compile(name##_nn, /* shapeless */ true);    \
        return mlxb::wrap(compiled({x})[0]);                                          \
      }                                                                               \
      auto st = mlxb::stream_of(s);                                                   \
      return mlxb::wrap(expr);                                                        \
    })                                                                                \
  }

// gelu: x * (1 + mx.erf(x / math.sqrt(2))) / 2
MLXB_UNARY_NN(gelu, ([&] {
             auto t = mx::erf(mx::divide(x, weak_float(x, std::sqrt(2.0)), st), st);
             auto u = mx::multiply(x, mx::add(weak_int(x, 1), t, st), st);
             return mx::divide(u, weak_int(x, 2), st);
           }()))

// gelu_approx: 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
MLXB_UNARY_NN(gelu_approx, ([&] {
             auto cube = mx::power(x, weak_int(x, 3), st);
             auto inner = mx::add(x, mx::multiply(weak_float(x, 0.044715), cube, st), st);
             auto th = mx::tanh(mx::multiply(weak_float(x, std::sqrt(2.0 / M_PI)), inner, st), st);
             auto half_x = mx::multiply(weak_float(x, 0.5), x, st);
             return mx::multiply(half_x, mx::add(weak_int(x, 1), th, st), st);
           }()))

// gelu_fast_approx: x * mx.sigmoid(1.702 * x)
MLXB_UNARY_NN(gelu_fast_approx, mx::multiply(x, mx::sigmoid(mx::multiply(weak_float(x, 1.702), x, st), st), st))

// silu: x * mx.sigmoid(x)
MLXB_UNARY_NN(silu, mx::multiply(x, mx::sigmoid(x, st), st))

// softplus: mx.logaddexp(x, 0)
MLXB_UNARY_NN(softplus, mx::logaddexp(x, weak_int(x, 0), st))

// relu: mx.maximum(x, 0)
MLXB_UNARY_NN(relu, mx::maximum(x, weak_int(x, 0), st))
