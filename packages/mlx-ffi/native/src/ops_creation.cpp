// Array creation: zeros/ones/full, ranges, identity and triangular matrices.
#include "ops_internal.h"

using namespace mlxb;

MLXB_API mlxb_array mlxb_zeros(const int32_t* shape, int ndim, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::zeros(shape_from(shape, ndim), dtype_from_code(dtype), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_ones(const int32_t* shape, int ndim, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::ones(shape_from(shape, ndim), dtype_from_code(dtype), stream_of(s))); })
}

// dtype < 0: the dtype of vals.
MLXB_API mlxb_array mlxb_full(const int32_t* shape, int ndim, mlxb_array vals, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (dtype < 0) return wrap(mx::full(shape_from(shape, ndim), arr(vals), stream_of(s)));
    return wrap(mx::full(shape_from(shape, ndim), arr(vals), dtype_from_code(dtype), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_zeros_like(mlxb_array a, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (dtype < 0) return wrap(mx::zeros_like(arr(a), stream_of(s)));
    return wrap(mx::zeros_like(arr(a), dtype_from_code(dtype), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_ones_like(mlxb_array a, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (dtype < 0) return wrap(mx::ones_like(arr(a), stream_of(s)));
    return wrap(mx::ones_like(arr(a), dtype_from_code(dtype), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_full_like(mlxb_array a, mlxb_array vals, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto dt = dtype < 0 ? arr(a).dtype() : dtype_from_code(dtype);
    return wrap(mx::full_like(arr(a), arr(vals), dt, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_arange(double start, double stop, double step, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::arange(start, stop, step, dtype_from_code(dtype), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_linspace(double start, double stop, int num, int endpoint, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::linspace(start, stop, num, endpoint != 0, dtype_from_code(dtype), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_eye(int n, int m, int k, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::eye(n, m, k, dtype_from_code(dtype), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_tri(int n, int m, int k, int dtype, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::tri(n, m, k, dtype_from_code(dtype), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_tril(mlxb_array a, int k, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::tril(arr(a), k, stream_of(s))); })
}

MLXB_API mlxb_array mlxb_triu(mlxb_array a, int k, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::triu(arr(a), k, stream_of(s))); })
}

MLXB_API mlxb_array mlxb_copy(mlxb_array a, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::copy(arr(a), stream_of(s))); })
}
