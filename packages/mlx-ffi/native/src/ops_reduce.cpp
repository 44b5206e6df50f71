// Reductions, scans and sorting.
#include "ops_internal.h"

using namespace mlxb;

// Reductions take (axes, naxes); naxes < 0 reduces over all axes.
#define MLXB_REDUCE(name, fn)                                                                         \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, const int32_t* axes, int naxes, int keepdims, mlxb_stream s) { \
    MLXB_GUARD(nullptr, {                                                                             \
      auto ax = axes_from(axes, naxes);                                                               \
      if (!ax) return wrap(mx::fn(arr(a), keepdims != 0, stream_of(s)));                              \
      return wrap(mx::fn(arr(a), *ax, keepdims != 0, stream_of(s)));                                  \
    })                                                                                                \
  }

MLXB_REDUCE(sum, sum)
MLXB_REDUCE(mean, mean)
MLXB_REDUCE(max, max)
MLXB_REDUCE(min, min)
MLXB_REDUCE(prod, prod)
MLXB_REDUCE(all, all)
MLXB_REDUCE(any, any)
MLXB_REDUCE(logsumexp, logsumexp)

// var / std with delta degrees of freedom.
#define MLXB_REDUCE_DDOF(name, fn)                                                                          \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, const int32_t* axes, int naxes, int keepdims, int ddof,     \
                                  mlxb_stream s) {                                                          \
    MLXB_GUARD(nullptr, {                                                                                   \
      auto ax = axes_from(axes, naxes);                                                                     \
      if (!ax) return wrap(mx::fn(arr(a), keepdims != 0, ddof, stream_of(s)));                              \
      return wrap(mx::fn(arr(a), *ax, keepdims != 0, ddof, stream_of(s)));                                  \
    })                                                                                                      \
  }
MLXB_REDUCE_DDOF(var, var)
MLXB_REDUCE_DDOF(std, std)

// argmax / argmin over one axis; flat != 0 means over the flattened array.
#define MLXB_ARGREDUCE(name)                                                                          \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, int axis, int flat, int keepdims, mlxb_stream s) {    \
    MLXB_GUARD(nullptr, {                                                                             \
      if (flat) return wrap(mx::name(arr(a), keepdims != 0, stream_of(s)));                           \
      return wrap(mx::name(arr(a), axis, keepdims != 0, stream_of(s)));                               \
    })                                                                                                \
  }
MLXB_ARGREDUCE(argmax)
MLXB_ARGREDUCE(argmin)

MLXB_API mlxb_array mlxb_softmax(mlxb_array a, const int32_t* axes, int naxes, int precise, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto ax = axes_from(axes, naxes);
    if (!ax) return wrap(mx::softmax(arr(a), precise != 0, stream_of(s)));
    return wrap(mx::softmax(arr(a), *ax, precise != 0, stream_of(s)));
  })
}

// Scans: flat != 0 scans the flattened array.
#define MLXB_SCAN(name)                                                                                          \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, int axis, int flat, int reverse, int inclusive, mlxb_stream s) { \
    MLXB_GUARD(nullptr, {                                                                                        \
      auto& x = arr(a);                                                                                          \
      if (flat) return wrap(mx::name(mx::reshape(x, {-1}, stream_of(s)), 0, reverse != 0, inclusive != 0, stream_of(s))); \
      return wrap(mx::name(x, axis, reverse != 0, inclusive != 0, stream_of(s)));                                \
    })                                                                                                           \
  }
MLXB_SCAN(cumsum)
MLXB_SCAN(cumprod)
MLXB_SCAN(cummax)
MLXB_SCAN(cummin)
MLXB_SCAN(logcumsumexp)

// Sorting: flat != 0 sorts the flattened array.
#define MLXB_SORT(name)                                                                    \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, int axis, int flat, mlxb_stream s) {       \
    MLXB_GUARD(nullptr, {                                                                  \
      if (flat) return wrap(mx::name(arr(a), stream_of(s)));                               \
      return wrap(mx::name(arr(a), axis, stream_of(s)));                                   \
    })                                                                                     \
  }
MLXB_SORT(sort)
MLXB_SORT(argsort)

#define MLXB_KSORT(name)                                                                          \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, int k, int axis, int flat, mlxb_stream s) {       \
    MLXB_GUARD(nullptr, {                                                                         \
      if (flat) return wrap(mx::name(arr(a), k, stream_of(s)));                                   \
      return wrap(mx::name(arr(a), k, axis, stream_of(s)));                                       \
    })                                                                                            \
  }
MLXB_KSORT(partition)
MLXB_KSORT(argpartition)
MLXB_KSORT(topk)
