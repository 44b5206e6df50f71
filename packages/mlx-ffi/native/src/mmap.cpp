// Read-only file mappings and arrays over byte ranges of them (restoring a KV snapshot without
// reading it into MLX buffers).
//
// A mapping is mmap(PROT_READ, MAP_PRIVATE) of the whole file, held by a shared reference. Each
// array made over it holds one more reference in its data deleter; munmap runs when the handle
// is closed and the last array over it (or view of one) is gone.
//
// How an array gets its bytes depends on the allocator MLX was built with:
// - CPU backend (MLX's no_gpu CommonAllocator): its Buffer points at a size_t size header that
//   sits right before the data. mx::array(void*, shape, dtype, deleter) copies there
//   (make_buffer is not overridden), so we build allocator::Data over `ptr - 8` instead:
//   the array then reads the mapped bytes in place. This needs the 8 bytes before the tensor to
//   hold its byte size (our mappable safetensors writer puts it there); the allocator layout is
//   probed once at run time, and a tensor without the header is copied instead.
//   Such Data is not owned by the allocator, so MLX never donates it to an op's output (the
//   mapping is never written) and it does not count in get_active_memory().
// - GPU backends (Metal, CUDA): mx::array(void*, shape, dtype, deleter), which wraps the pointer
//   without a copy where the allocator can (Metal: page-aligned ranges) and copies otherwise;
//   either way the result is correct. mlxb_mmap_is_mapped tells which happened.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "internal.h"

using namespace mlxb;

namespace {
std::atomic<int> live_mappings{0};

struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base && size) munmap(base, size);
    live_mappings.fetch_sub(1, std::memory_order_relaxed);
  }
};
using MapRef = std::shared_ptr<Mapping>;

MapRef& mapping(void* h) {
  if (!h) throw std::invalid_argument("null mapping handle");
  return *static_cast<MapRef*>(h);
}

// Whether allocator Buffers are MLX's CommonAllocator layout: ptr -> [size_t size][data...].
bool common_layout() {
  static const bool ok = [] {
    try {
      if (mx::is_available(mx::Device::gpu)) return false;
      auto d = mx::allocator::malloc(64);
      auto b = d.buffer();
      return b.ptr() != nullptr && b.raw_ptr() == static_cast<char*>(b.ptr()) + sizeof(size_t) &&
             *static_cast<const size_t*>(b.ptr()) == 64;
    } catch (...) {
      return false;
    }
  }();
  return ok;
}
}  // namespace

MLXB_API void* mlxb_mmap_open(const char* path) {
  MLXB_GUARD(nullptr, {
    if (!path) throw std::invalid_argument("null path");
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(std::string("open ") + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      throw std::runtime_error(std::string("fstat ") + path + ": " + std::strerror(e));
    }
    auto m = std::make_shared<Mapping>();
    live_mappings.fetch_add(1, std::memory_order_relaxed);
    m->size = static_cast<size_t>(st.st_size);
    if (m->size) {
      void* p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd);
        m->size = 0;
        throw std::runtime_error(std::string("mmap ") + path + ": " + std::strerror(e));
      }
      m->base = p;
    }
    ::close(fd);  // the mapping stays valid without the descriptor
    return static_cast<void*>(new MapRef(std::move(m)));
  })
}

MLXB_API int64_t mlxb_mmap_size(void* h) { MLXB_GUARD(-1, { return static_cast<int64_t>(mapping(h)->size); }) }

MLXB_API mlxb_array mlxb_mmap_array(void* h, uint64_t offset, const int32_t* shape, int ndim, int dtype) {
  MLXB_GUARD(nullptr, {
    MapRef m = mapping(h);
    auto dt = dtype_from_code(dtype);
    auto sh = shape_from(shape, ndim);
    size_t nbytes = dense_nbytes(sh, dt);
    if (offset > m->size || nbytes > m->size - offset)
      throw std::out_of_range("byte range [" + std::to_string(offset) + ", " + std::to_string(offset + nbytes) +
                              ") is past the end of the mapping (" + std::to_string(m->size) + " bytes)");
    char* p = static_cast<char*>(m->base) + offset;
    if (nbytes > 0 && common_layout() && offset >= sizeof(size_t) && reinterpret_cast<uintptr_t>(p) % alignof(size_t) == 0) {
      uint64_t header;
      std::memcpy(&header, p - sizeof(size_t), sizeof(header));
      if (header == nbytes) {
        // Never dereferenced for writing: the Data is not owned, so it is never donated or freed.
        mx::allocator::Buffer buf(p - sizeof(size_t));
        return wrap(mx::array(mx::allocator::Data(buf, [m](mx::allocator::Buffer) mutable { m.reset(); }), std::move(sh), dt));
      }
    }
    return wrap(mx::array(static_cast<void*>(p), std::move(sh), dt, [m](void*) mutable { m.reset(); }));
  })
}

MLXB_API void mlxb_mmap_close(void* h) { delete static_cast<MapRef*>(h); }

MLXB_API int mlxb_mmap_is_mapped(mlxb_array a, void* h) {
  MLXB_GUARD(-1, {
    auto& x = arr(a);
    auto& m = mapping(h);
    join_background();
    if (!x.is_available() || x.nbytes() == 0) return 0;
    auto p = reinterpret_cast<uintptr_t>(x.data<void>());
    auto b = reinterpret_cast<uintptr_t>(m->base);
    return p >= b && p < b + m->size ? 1 : 0;
  })
}

MLXB_API int mlxb_mmap_live(void) { return live_mappings.load(); }
