// PRNG with explicit keys (mx.random.*). A NULL key uses MLX's global key
// sequence. Each entry point calls the same mlx::core::random overload that
// MLX Python calls, so a key gives the same bits as in Python.
#include "ops_internal.h"

using namespace mlxb;

namespace {
std::optional<mx::array> key_of(mlxb_array k) {
  if (!k) return std::nullopt;
  return arr(k);
}
}  // namespace

MLXB_API mlxb_array mlxb_random_key(uint64_t seed) { MLXB_GUARD(nullptr, { return wrap(mx::random::key(seed)); }) }

MLXB_API int mlxb_random_seed(uint64_t seed) {
  MLXB_GUARD(-1, {
    mx::random::seed(seed);
    return 0;
  })
}

MLXB_API mlxb_array mlxb_random_split(mlxb_array key, int num, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::random::split(arr(key), num, stream_of(s))); })
}

MLXB_API mlxb_array mlxb_random_uniform(mlxb_array low, mlxb_array high, const int32_t* shape, int ndim, int dtype,
                                        mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::random::uniform(arr(low), arr(high), shape_from(shape, ndim), dtype_from_code(dtype), key_of(key),
                                    stream_of(s)));
  })
}

// loc/scale are float32, as MLX Python passes them.
MLXB_API mlxb_array mlxb_random_normal(const int32_t* shape, int ndim, int dtype, double loc, double scale,
                                       mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::random::normal(shape_from(shape, ndim), dtype_from_code(dtype), static_cast<float>(loc),
                                   static_cast<float>(scale), key_of(key), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_random_randint(mlxb_array low, mlxb_array high, const int32_t* shape, int ndim, int dtype,
                                        mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::random::randint(arr(low), arr(high), shape_from(shape, ndim), dtype_from_code(dtype), key_of(key),
                                    stream_of(s)));
  })
}

// ndim < 0: the shape of p.
MLXB_API mlxb_array mlxb_random_bernoulli(mlxb_array p, const int32_t* shape, int ndim, mlxb_array key,
                                          mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (ndim < 0) return wrap(mx::random::bernoulli(arr(p), key_of(key), stream_of(s)));
    return wrap(mx::random::bernoulli(arr(p), shape_from(shape, ndim), key_of(key), stream_of(s)));
  })
}

// ndim < 0: the shape of lower/upper broadcast.
MLXB_API mlxb_array mlxb_random_truncated_normal(mlxb_array lower, mlxb_array upper, const int32_t* shape, int ndim,
                                                 int dtype, mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto dt = dtype_from_code(dtype);
    if (ndim < 0) return wrap(mx::random::truncated_normal(arr(lower), arr(upper), dt, key_of(key), stream_of(s)));
    return wrap(
        mx::random::truncated_normal(arr(lower), arr(upper), shape_from(shape, ndim), dt, key_of(key), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_random_gumbel(const int32_t* shape, int ndim, int dtype, mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::random::gumbel(shape_from(shape, ndim), dtype_from_code(dtype), key_of(key), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_random_laplace(const int32_t* shape, int ndim, int dtype, double loc, double scale,
                                        mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::random::laplace(shape_from(shape, ndim), dtype_from_code(dtype), static_cast<float>(loc),
                                    static_cast<float>(scale), key_of(key), stream_of(s)));
  })
}

// mode 0: one sample per distribution; 1: `shape` (ndim entries); 2: num_samples = n.
MLXB_API mlxb_array mlxb_random_categorical(mlxb_array logits, int axis, int mode, const int32_t* shape, int ndim,
                                            int num_samples, mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& l = arr(logits);
    if (mode == 1) return wrap(mx::random::categorical(l, axis, shape_from(shape, ndim), key_of(key), stream_of(s)));
    if (mode == 2) return wrap(mx::random::categorical(l, axis, num_samples, key_of(key), stream_of(s)));
    return wrap(mx::random::categorical(l, axis, key_of(key), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_random_permutation(mlxb_array x, int axis, mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::random::permutation(arr(x), axis, key_of(key), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_random_permutation_n(int n, mlxb_array key, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::random::permutation(n, key_of(key), stream_of(s))); })
}
