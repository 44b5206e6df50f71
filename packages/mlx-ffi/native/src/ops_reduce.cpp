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
