// Elementwise ops: arithmetic, comparisons, logic, math functions, casts.
#include "ops_internal.h"

using namespace mlxb;

MLXB_BINARY(add, mx::add(x, y, st))
MLXB_BINARY(subtract, mx::subtract(x, y, st))
MLXB_BINARY(multiply, mx::multiply(x, y, st))
MLXB_BINARY(divide, mx::divide(x, y, st))

MLXB_UNARY(exp, mx::exp(x, st))

MLXB_API mlxb_array mlxb_astype(mlxb_array a, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::astype(arr(a), dtype_from_code(dtype), stream_of(s))); })
}
