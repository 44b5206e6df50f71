// MLX distributed (mlx::core::distributed): groups and collectives. A group is a heap
// mlx::core::distributed::Group behind an opaque handle (freed with mlxb_dist_group_free); arrays
// made by a collective keep their own reference to the group, so freeing the handle early is safe.
#include "mlx/distributed/distributed.h"
#include "mlx/distributed/ops.h"
#include "ops_internal.h"

using namespace mlxb;
namespace dist = mlx::core::distributed;

namespace {
dist::Group& group_of(void* g) {
  if (!g) throw std::invalid_argument("null distributed group handle");
  return *static_cast<dist::Group*>(g);
}
std::string backend_of(const char* b) { return b && *b ? std::string(b) : std::string("any"); }
// Peer ranks are checked here: a bad rank must be an error now, not a failure on an eval thread.
void check_peer(const dist::Group& g, int peer, const char* what) {
  if (peer < 0 || peer >= g.size()) {
    throw std::invalid_argument(std::string(what) + " rank " + std::to_string(peer) + " is outside the group (size " +
                                std::to_string(g.size()) + ")");
  }
  if (peer == g.rank()) throw std::invalid_argument(std::string(what) + " rank " + std::to_string(peer) + " is this process's own rank");
}
}  // namespace

// 1 when the backend ("ring", "mpi", "nccl", "jaccl", or NULL/"any") is compiled into this MLX.
MLXB_API int mlxb_dist_is_available(const char* backend) {
  MLXB_GUARD(-1, { return dist::is_available(backend_of(backend)) ? 1 : 0; })
}

// The group of all processes. strict = 0: a size-1 group when no backend can start.
MLXB_API void* mlxb_dist_init(int strict, const char* backend) {
  MLXB_GUARD(nullptr, { return new dist::Group(dist::init(strict != 0, backend_of(backend))); })
}

MLXB_API void mlxb_dist_group_free(void* g) { delete static_cast<dist::Group*>(g); }

MLXB_API int mlxb_dist_rank(void* g) {
  MLXB_GUARD(-1, { return group_of(g).rank(); })
}
MLXB_API int mlxb_dist_size(void* g) {
  MLXB_GUARD(-1, { return group_of(g).size(); })
}

// Processes passing the same color form a new group, ordered by key (key < 0: by current rank).
MLXB_API void* mlxb_dist_split(void* g, int color, int key) {
  MLXB_GUARD(nullptr, { return new dist::Group(group_of(g).split(color, key)); })
}

#define MLXB_COLLECTIVE(name)                                                       \
  MLXB_API mlxb_array mlxb_dist_##name(mlxb_array a, void* g, mlxb_stream s) {      \
    MLXB_GUARD(nullptr, { return wrap(dist::name(arr(a), group_of(g), stream_of(s))); }) \
  }

MLXB_COLLECTIVE(all_sum)
MLXB_COLLECTIVE(all_gather)
MLXB_COLLECTIVE(all_max)
MLXB_COLLECTIVE(all_min)
MLXB_COLLECTIVE(sum_scatter)

MLXB_API mlxb_array mlxb_dist_send(mlxb_array a, int dst, void* g, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& grp = group_of(g);
    check_peer(grp, dst, "send: destination");
    return wrap(dist::send(arr(a), dst, grp, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_dist_recv(const int32_t* shape, int ndim, int dtype, int src, void* g, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& grp = group_of(g);
    check_peer(grp, src, "recv: source");
    return wrap(dist::recv(shape_from(shape, ndim), dtype_from_code(dtype), src, grp, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_dist_recv_like(mlxb_array a, int src, void* g, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& grp = group_of(g);
    check_peer(grp, src, "recv: source");
    return wrap(dist::recv_like(arr(a), src, grp, stream_of(s)));
  })
}
