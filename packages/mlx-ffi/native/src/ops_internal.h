// Helpers and macros for the op entry points: each one a thin, exception-guarded call into
// mlx::core.
#pragma once
#include <optional>
#include <vector>

#include "internal.h"

namespace mlxb {
// A nullable array handle as std::optional.
inline std::optional<mx::array> opt_arr(mlxb_array h) {
  if (!h) return std::nullopt;
  return arr(h);
}
// Negative means "use the op's default" (std::nullopt).
inline std::optional<int> opt_int(int v) {
  if (v < 0) return std::nullopt;
  return v;
}
// Axes from (pointer, count); count < 0 means "all axes" and yields nullopt.
inline std::optional<std::vector<int>> axes_from(const int32_t* axes, int n) {
  if (n < 0) return std::nullopt;
  if (n > 0 && !axes) throw std::invalid_argument("null axes pointer");
  return std::vector<int>(axes, axes + n);
}
inline std::vector<mx::array> arrays_from(const uint64_t* hs, int n) {
  if (n < 0) throw std::invalid_argument("negative array count");
  std::vector<mx::array> v;
  v.reserve(n);
  for (int i = 0; i < n; i++) v.push_back(arr(reinterpret_cast<mlxb_array>(hs[i])));
  return v;
}
// A list of arrays, the return value of every op with several outputs (split, quantize,
// compiled functions, kernels). The caller reads it with mlxb_list_size / mlxb_list_get and
// frees it with mlxb_list_free: no handle is ever written into caller (JS) memory.
using ArrayList = std::vector<mx::array>;

inline void* wrap_list(std::vector<mx::array> v) {
  return new ArrayList(std::move(v));
}
inline ArrayList& list_of(void* l) {
  if (!l) throw std::invalid_argument("null array list handle");
  return *static_cast<ArrayList*>(l);
}
}  // namespace mlxb

#define MLXB_UNARY(name, expr)                                        \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, mlxb_stream s) {      \
    MLXB_GUARD(nullptr, {                                             \
      auto& x = mlxb::arr(a);                                         \
      auto st = mlxb::stream_of(s);                                   \
      return mlxb::wrap(expr);                                        \
    })                                                                \
  }

#define MLXB_BINARY(name, expr)                                                 \
  MLXB_API mlxb_array mlxb_##name(mlxb_array a, mlxb_array b, mlxb_stream s) {  \
    MLXB_GUARD(nullptr, {                                                       \
      auto& x = mlxb::arr(a);                                                   \
      auto& y = mlxb::arr(b);                                                   \
      auto st = mlxb::stream_of(s);                                             \
      return mlxb::wrap(expr);                                                  \
    })                                                                          \
  }
