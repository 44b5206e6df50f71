// Array handles: creation from host bytes and scalars, metadata, read-back.
#include <cstring>

#include "internal.h"

using namespace mlxb;

MLXB_API mlxb_array mlxb_array_from_bytes(const void* data, size_t nbytes, const int32_t* shape, int ndim, int dtype) {
  MLXB_GUARD(nullptr, {
    auto dt = dtype_from_code(dtype);
    auto sh = shape_from(shape, ndim);
    size_t want = dense_nbytes(sh, dt);
    if (want != nbytes)
      throw std::invalid_argument("buffer holds " + std::to_string(nbytes) + " bytes but shape and dtype need " +
                                  std::to_string(want));
    if (want > 0 && !data) throw std::invalid_argument("null data pointer");
    // Copy into an MLX-allocated buffer so the array never aliases JS memory
    // and counts in MLX's active memory.
    auto buf = mx::allocator::malloc(want);
    if (want) std::memcpy(buf.buffer().raw_ptr(), data, want);
    return wrap(mx::array(std::move(buf), std::move(sh), dt));
  })
}

MLXB_API mlxb_array mlxb_array_scalar(double value, int dtype) {
  MLXB_GUARD(nullptr, {
    auto dt = dtype_from_code(dtype);
    if (dt == mx::complex64) return wrap(mx::array(std::complex<float>(static_cast<float>(value), 0.0f)));
    if (dt == mx::float64) return wrap(mx::array(value, mx::float64));
    // Converted on the host, as MLX Python converts a Python float (to float, then to the dtype):
    // a constant, not an AsType node — on a GPU a CPU-side cast in every step's graph would be a
    // cross-device dependency for each scalar.
    return wrap(mx::array(static_cast<float>(value), dt));
  })
}

MLXB_API mlxb_array mlxb_array_scalar_int(int64_t value, int dtype) {
  MLXB_GUARD(nullptr, { return wrap(mx::array(value, dtype_from_code(dtype))); })
}

MLXB_API mlxb_array mlxb_array_retain(mlxb_array a) { MLXB_GUARD(nullptr, { return wrap(arr(a)); }) }

MLXB_API void mlxb_array_free(mlxb_array a) {
  if (!a) return;
  live_handles.fetch_sub(1, std::memory_order_relaxed);
  delete static_cast<mx::array*>(a);
}

MLXB_API int mlxb_array_ndim(mlxb_array a) { MLXB_GUARD(-1, { return static_cast<int>(arr(a).ndim()); }) }
MLXB_API int mlxb_array_dim(mlxb_array a, int axis) { MLXB_GUARD(-1, { return arr(a).shape(axis); }) }
MLXB_API int mlxb_array_dtype(mlxb_array a) { MLXB_GUARD(-1, { return dtype_code(arr(a).dtype()); }) }
MLXB_API int64_t mlxb_array_size(mlxb_array a) { MLXB_GUARD(-1, { return static_cast<int64_t>(arr(a).size()); }) }
MLXB_API int64_t mlxb_array_nbytes(mlxb_array a) { MLXB_GUARD(-1, { return static_cast<int64_t>(arr(a).nbytes()); }) }
MLXB_API int mlxb_array_itemsize(mlxb_array a) { MLXB_GUARD(-1, { return static_cast<int>(arr(a).itemsize()); }) }

MLXB_API mlxb_array mlxb_array_host_view(mlxb_array a) {
  MLXB_GUARD(nullptr, {
    // Evaluated and row-major (a strided or broadcast view is copied first),
    // so the host can read nbytes() from mlxb_array_data_ptr of the result.
    join_background();
    mx::array c = arr(a);
    c.eval();
    if (!c.flags().row_contiguous || c.data_size() != c.size()) {
      c = mx::contiguous(c, false, mx::Device::cpu);
      c.eval();
    }
    return wrap(std::move(c));
  })
}

MLXB_API void* mlxb_array_data_ptr(mlxb_array a) {
  MLXB_GUARD(nullptr, {
    join_background();
    auto& x = arr(a);
    if (!x.is_available() || !x.flags().row_contiguous)
      throw std::invalid_argument("data_ptr needs an evaluated row-contiguous array (use mlxb_array_host_view)");
    return x.data<void>();
  })
}

namespace mlxb {
double item_as_double(mx::array& x) {
  if (x.size() != 1) throw std::invalid_argument("item() needs an array of size 1, got size " + std::to_string(x.size()));
  // Wait on the array itself and convert on the host: a cast op would queue behind whatever
  // work is already scheduled on the stream (and break the decode pipeline).
  x.eval();
  switch (x.dtype().val()) {
    case mx::Dtype::Val::bool_: return x.item<bool>() ? 1.0 : 0.0;
    case mx::Dtype::Val::uint8: return x.item<uint8_t>();
    case mx::Dtype::Val::uint16: return x.item<uint16_t>();
    case mx::Dtype::Val::uint32: return x.item<uint32_t>();
    case mx::Dtype::Val::uint64: return static_cast<double>(x.item<uint64_t>());
    case mx::Dtype::Val::int8: return x.item<int8_t>();
    case mx::Dtype::Val::int16: return x.item<int16_t>();
    case mx::Dtype::Val::int32: return x.item<int32_t>();
    case mx::Dtype::Val::int64: return static_cast<double>(x.item<int64_t>());
    case mx::Dtype::Val::float16: return static_cast<float>(x.item<mx::float16_t>());
    case mx::Dtype::Val::bfloat16: return static_cast<float>(x.item<mx::bfloat16_t>());
    case mx::Dtype::Val::float32: return x.item<float>();
    case mx::Dtype::Val::float64: return x.item<double>();
    case mx::Dtype::Val::complex64: return x.item<mx::complex64_t>().real();
  }
  throw std::invalid_argument("item(): unsupported dtype");
}
}  // namespace mlxb

MLXB_API double mlxb_array_item_f64(mlxb_array a) {
  MLXB_GUARD(std::nan(""), {
    join_background();
    return item_as_double(arr(a));
  })
}

MLXB_API int mlxb_array_is_available(mlxb_array a) { MLXB_GUARD(-1, {
  join_background();
  return arr(a).is_available() ? 1 : 0;
}) }
MLXB_API int mlxb_array_wait(mlxb_array a) {
  MLXB_GUARD(-1, {
    join_background();
    arr(a).wait();
    return 0;
  })
}
MLXB_API int mlxb_live_handles(void) { return live_handles.load(); }
