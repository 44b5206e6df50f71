// safetensors load (lazy, with metadata) and save.
#include "internal.h"

using namespace mlxb;

namespace {
struct Loaded {
  std::vector<std::string> names;
  std::vector<mx::array> arrays;
  std::vector<std::pair<std::string, std::string>> meta;
};
struct Writer {
  std::unordered_map<std::string, mx::array> arrays;
  std::unordered_map<std::string, std::string> meta;
};
Loaded& loaded(mlxb_st h) {
  if (!h) throw std::invalid_argument("null safetensors handle");
  return *static_cast<Loaded*>(h);
}
Writer& writer(mlxb_st h) {
  if (!h) throw std::invalid_argument("null safetensors writer");
  return *static_cast<Writer*>(h);
}
template <class V>
auto& at(V& v, int i) {
  if (i < 0 || static_cast<size_t>(i) >= v.size()) throw std::out_of_range("index " + std::to_string(i) + " out of range");
  return v[i];
}
}  // namespace

MLXB_API mlxb_st mlxb_st_load(const char* path, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto [tensors, metadata] = mx::load_safetensors(std::string(path), stream_of(s));
    auto* out = new Loaded();
    // Sorted names make the listing order deterministic.
    for (auto& kv : tensors) out->names.push_back(kv.first);
    std::sort(out->names.begin(), out->names.end());
    for (auto& n : out->names) out->arrays.push_back(tensors.at(n));
    for (auto& kv : metadata) out->meta.emplace_back(kv.first, kv.second);
    std::sort(out->meta.begin(), out->meta.end());
    return static_cast<mlxb_st>(out);
  })
}
MLXB_API int mlxb_st_count(mlxb_st h) { MLXB_GUARD(-1, { return static_cast<int>(loaded(h).names.size()); }) }
MLXB_API const char* mlxb_st_name(mlxb_st h, int i) { MLXB_GUARD(nullptr, { return at(loaded(h).names, i).c_str(); }) }
MLXB_API mlxb_array mlxb_st_array(mlxb_st h, int i) { MLXB_GUARD(nullptr, { return wrap(at(loaded(h).arrays, i)); }) }
MLXB_API int mlxb_st_meta_count(mlxb_st h) { MLXB_GUARD(-1, { return static_cast<int>(loaded(h).meta.size()); }) }
MLXB_API const char* mlxb_st_meta_key(mlxb_st h, int i) { MLXB_GUARD(nullptr, { return at(loaded(h).meta, i).first.c_str(); }) }
MLXB_API const char* mlxb_st_meta_value(mlxb_st h, int i) { MLXB_GUARD(nullptr, { return at(loaded(h).meta, i).second.c_str(); }) }
MLXB_API void mlxb_st_free(mlxb_st h) { delete static_cast<Loaded*>(h); }

MLXB_API mlxb_st mlxb_st_writer_new(void) { MLXB_GUARD(nullptr, { return static_cast<mlxb_st>(new Writer()); }) }
MLXB_API int mlxb_st_writer_add(mlxb_st w, const char* name, mlxb_array a) {
  MLXB_GUARD(-1, {
    auto& wr = writer(w);
    if (!wr.arrays.emplace(name, arr(a)).second) throw std::invalid_argument(std::string("duplicate tensor name '") + name + "'");
    return 0;
  })
}
MLXB_API int mlxb_st_writer_meta(mlxb_st w, const char* key, const char* value) {
  MLXB_GUARD(-1, {
    writer(w).meta[key] = value;
    return 0;
  })
}
MLXB_API int mlxb_st_writer_save(mlxb_st w, const char* path) {
  MLXB_GUARD(-1, {
    auto& wr = writer(w);
    join_background();
    mx::save_safetensors(std::string(path), wr.arrays, wr.meta);
    return 0;
  })
}
MLXB_API void mlxb_st_writer_free(mlxb_st w) { delete static_cast<Writer*>(w); }
