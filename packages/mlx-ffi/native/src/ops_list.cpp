// Array lists: the return value of ops with a variable number of outputs (no out-parameters).
#include "ops_internal.h"

using namespace mlxb;

MLXB_API void* mlxb_list_new(void) {
  MLXB_GUARD(nullptr, { return wrap_list({}); })
}
MLXB_API int mlxb_list_size(void* l) {
  MLXB_GUARD(-1, { return static_cast<int>(list_of(l).size()); })
}
// A new handle to element i (the list keeps its own reference until freed).
MLXB_API mlxb_array mlxb_list_get(void* l, int i) {
  MLXB_GUARD(nullptr, {
    auto& v = list_of(l);
    if (i < 0 || i >= static_cast<int>(v.size())) throw std::out_of_range("array list index " + std::to_string(i) + " out of range (size " + std::to_string(v.size()) + ")");
    return wrap(v[i]);
  })
}
// Append a reference to the array (the handle stays owned by the caller).
MLXB_API int mlxb_list_push(void* l, mlxb_array a) {
  MLXB_GUARD(-1, {
    list_of(l).push_back(arr(a));
    return 0;
  })
}
MLXB_API void mlxb_list_free(void* l) {
  delete static_cast<ArrayList*>(l);
}
