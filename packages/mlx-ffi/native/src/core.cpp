// Error slot, versions, dtype/shape/stream conversion shared by every entry point.
#include <cmath>
#include <limits>

#include "internal.h"

namespace mlxb {
namespace {
thread_local std::string last_error;
}
const char* last_error_cstr() { return last_error.c_str(); }
void clear_error() { last_error.clear(); }
std::atomic<int> live_handles{0};

void set_error(const char* fn, const std::string& msg) { last_error = msg.empty() ? std::string(fn) + " failed" : msg; }

mx::Dtype dtype_from_code(int code) {
  // Codes follow mlx::core::Dtype::Val order; docs/native-abi.md lists them.
  switch (code) {
    case 0: return mx::bool_;
    case 1: return mx::uint8;
    case 2: return mx::uint16;
    case 3: return mx::uint32;
    case 4: return mx::uint64;
    case 5: return mx::int8;
    case 6: return mx::int16;
    case 7: return mx::int32;
    case 8: return mx::int64;
    case 9: return mx::float16;
    case 10: return mx::float32;
    case 11: return mx::float64;
    case 12: return mx::bfloat16;
    case 13: return mx::complex64;
  }
  throw std::invalid_argument("unsupported dtype code " + std::to_string(code));
}
int dtype_code(mx::Dtype d) { return static_cast<int>(d.val()); }

mx::Shape shape_from(const int32_t* shape, int ndim) {
  if (ndim < 0) throw std::invalid_argument("negative ndim " + std::to_string(ndim));
  if (ndim > 0 && !shape) throw std::invalid_argument("null shape pointer");
  return mx::Shape(shape, shape + ndim);
}

size_t dense_nbytes(const mx::Shape& shape, mx::Dtype dt) {
  size_t count = 1;
  for (auto d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape");
    count *= static_cast<size_t>(d);
  }
  return count * dt.size();
}

mx::StreamOrDevice stream_of(mlxb_stream s) {
  if (!s) return {};
  return *static_cast<mx::Stream*>(s);
}
}  // namespace mlxb

using namespace mlxb;

MLXB_API const char* mlxb_last_error(void) { return mlxb::last_error_cstr(); }
MLXB_API void mlxb_clear_error(void) { mlxb::clear_error(); }
MLXB_API const char* mlxb_mlx_version(void) { return mx::version(); }
MLXB_API int mlxb_abi_version(void) { return MLXB_ABI_VERSION; }
