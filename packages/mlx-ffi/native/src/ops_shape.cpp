// Shape and indexing ops.
#include "ops_internal.h"

using namespace mlxb;

MLXB_API mlxb_array mlxb_reshape(mlxb_array a, const int32_t* shape, int ndim, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::reshape(arr(a), shape_from(shape, ndim), stream_of(s))); })
}
