// eval / async_eval of many arrays in one crossing.
#include <fstream>

#include "mlx/graph_utils.h"
#include "internal.h"

using namespace mlxb;

static std::vector<mx::array> gather(const uint64_t* hs, int n) {
  if (n < 0) throw std::invalid_argument("negative array count");
  std::vector<mx::array> v;
  v.reserve(n);
  for (int i = 0; i < n; i++) v.push_back(arr(reinterpret_cast<mlxb_array>(hs[i])));
  return v;
}

MLXB_API int mlxb_eval(const uint64_t* arrays, int n) {
  MLXB_GUARD(-1, {
    join_background();
    mx::eval(gather(arrays, n));
    return 0;
  })
}
MLXB_API int mlxb_async_eval(const uint64_t* arrays, int n) {
  MLXB_GUARD(-1, {
    join_background();
    mx::async_eval(gather(arrays, n));
    return 0;
  })
}

// The unevaluated graph behind some arrays as Graphviz text (mx.export_to_dot), written to `path`:
// a tool for comparing the graphs two implementations build for the same step.
MLXB_API int mlxb_export_to_dot(const char* path, const uint64_t* arrays, int n) {
  MLXB_GUARD(-1, {
    if (!path) throw std::invalid_argument("null path");
    join_background();
    std::ofstream os(path);
    if (!os) throw std::runtime_error(std::string("cannot open ") + path + " for writing");
    mx::export_to_dot(os, gather(arrays, n));
    return 0;
  })
}
