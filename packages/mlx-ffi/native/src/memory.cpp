// MLX allocator statistics and limits, in bytes.
#include "internal.h"

using namespace mlxb;

MLXB_API int64_t mlxb_active_memory(void) { MLXB_GUARD(-1, {
  join_background();
  return static_cast<int64_t>(mx::get_active_memory());
}) }
MLXB_API int64_t mlxb_peak_memory(void) { MLXB_GUARD(-1, {
  join_background();
  return static_cast<int64_t>(mx::get_peak_memory());
}) }
MLXB_API int64_t mlxb_cache_memory(void) { MLXB_GUARD(-1, {
  join_background();
  return static_cast<int64_t>(mx::get_cache_memory());
}) }
MLXB_API int64_t mlxb_memory_limit(void) { MLXB_GUARD(-1, { return static_cast<int64_t>(mx::get_memory_limit()); }) }
MLXB_API int mlxb_reset_peak_memory(void) {
  MLXB_GUARD(-1, {
    join_background();
    mx::reset_peak_memory();
    return 0;
  })
}
MLXB_API int64_t mlxb_set_memory_limit(int64_t bytes) {
  MLXB_GUARD(-1, {
    if (bytes < 0) throw std::invalid_argument("memory limit must be >= 0");
    return static_cast<int64_t>(mx::set_memory_limit(static_cast<size_t>(bytes)));
  })
}
MLXB_API int64_t mlxb_set_cache_limit(int64_t bytes) {
  MLXB_GUARD(-1, {
    if (bytes < 0) throw std::invalid_argument("cache limit must be >= 0");
    return static_cast<int64_t>(mx::set_cache_limit(static_cast<size_t>(bytes)));
  })
}
MLXB_API int mlxb_clear_cache(void) {
  MLXB_GUARD(-1, {
    join_background();
    mx::clear_cache();
    return 0;
  })
}
