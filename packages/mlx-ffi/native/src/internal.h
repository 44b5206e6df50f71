// Shared helpers of the C ABI: the error slot, handle wrapping, stream lookup.
#pragma once
#include <atomic>
#include <string>

#include "mlx/mlx.h"
#include "mlxb.h"

namespace mlxb {
namespace mx = mlx::core;

void set_error(const char* fn, const std::string& msg);
const char* last_error_cstr();
void clear_error();
extern std::atomic<int> live_handles;

inline mx::array& arr(mlxb_array h) {
  if (!h) throw std::invalid_argument("null array handle");
  return *static_cast<mx::array*>(h);
}
inline mlxb_array wrap(mx::array a) {
  live_handles.fetch_add(1, std::memory_order_relaxed);
  return new mx::array(std::move(a));
}
mx::Dtype dtype_from_code(int code);
int dtype_code(mx::Dtype d);
mx::Shape shape_from(const int32_t* shape, int ndim);
// Bytes of a dense array of this shape and dtype; a negative dimension is an error.
size_t dense_nbytes(const mx::Shape& shape, mx::Dtype dt);
mx::StreamOrDevice stream_of(mlxb_stream s);
// Wait for a background async_eval (background.cpp) before evaluating, waiting or reading data.
void join_background();
// A size-1 array's value as a double (evaluates or waits first).
double item_as_double(mx::array& x);
}  // namespace mlxb

// Run a body; turn any exception into the thread-local error and a failure value.
#define MLXB_GUARD(fail, ...)                                   \
  try {                                                         \
    __VA_ARGS__                                                 \
  } catch (const std::exception& e) {                           \
    mlxb::set_error(__func__, e.what());                        \
    return fail;                                                \
  } catch (...) {                                               \
    mlxb::set_error(__func__, "unknown C++ exception");         \
    return fail;                                                \
  }
