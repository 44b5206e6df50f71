// Shape and indexing ops, and `a[...]` indexing with MLX Python's semantics.
#include <algorithm>
#include <numeric>

#include "ops_internal.h"

using namespace mlxb;

namespace {
std::vector<int> ints_from(const int32_t* p, int n) {
  if (n < 0) throw std::invalid_argument("negative count");
  if (n > 0 && !p) throw std::invalid_argument("null int pointer");
  return std::vector<int>(p, p + n);
}
}  // namespace

MLXB_API mlxb_array mlxb_reshape(mlxb_array a, const int32_t* shape, int ndim, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::reshape(arr(a), shape_from(shape, ndim), stream_of(s))); })
}

// naxes < 0 reverses the axes.
MLXB_API mlxb_array mlxb_transpose(mlxb_array a, const int32_t* axes, int naxes, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto ax = axes_from(axes, naxes);
    if (!ax) return wrap(mx::transpose(arr(a), stream_of(s)));
    return wrap(mx::transpose(arr(a), *ax, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_swapaxes(mlxb_array a, int a1, int a2, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::swapaxes(arr(a), a1, a2, stream_of(s))); })
}

MLXB_API mlxb_array mlxb_moveaxis(mlxb_array a, int src, int dst, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::moveaxis(arr(a), src, dst, stream_of(s))); })
}

// naxes < 0 squeezes every size-one axis.
MLXB_API mlxb_array mlxb_squeeze(mlxb_array a, const int32_t* axes, int naxes, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto ax = axes_from(axes, naxes);
    if (!ax) return wrap(mx::squeeze(arr(a), stream_of(s)));
    return wrap(mx::squeeze(arr(a), *ax, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_expand_dims(mlxb_array a, const int32_t* axes, int naxes, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::expand_dims(arr(a), ints_from(axes, naxes), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_broadcast_to(mlxb_array a, const int32_t* shape, int ndim, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::broadcast_to(arr(a), shape_from(shape, ndim), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_flatten(mlxb_array a, int start_axis, int end_axis, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::flatten(arr(a), start_axis, end_axis, stream_of(s))); })
}

MLXB_API mlxb_array mlxb_unflatten(mlxb_array a, int axis, const int32_t* shape, int ndim, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::unflatten(arr(a), axis, shape_from(shape, ndim), stream_of(s))); })
}

MLXB_API mlxb_array mlxb_contiguous(mlxb_array a, int allow_col_major, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::contiguous(arr(a), allow_col_major != 0, stream_of(s))); })
}

// flat != 0 concatenates the flattened arrays (axis=None).
MLXB_API mlxb_array mlxb_concatenate(const uint64_t* hs, int n, int axis, int flat, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (flat) return wrap(mx::concatenate(arrays_from(hs, n), stream_of(s)));
    return wrap(mx::concatenate(arrays_from(hs, n), axis, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_stack(const uint64_t* hs, int n, int axis, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::stack(arrays_from(hs, n), axis, stream_of(s))); })
}

// split into `sections` equal parts; returns an array list.
MLXB_API void* mlxb_split_sections(mlxb_array a, int sections, int axis, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap_list(mx::split(arr(a), sections, axis, stream_of(s))); })
}

// split at the given indices (nidx + 1 parts); returns an array list.
MLXB_API void* mlxb_split_indices(mlxb_array a, const int32_t* idx, int nidx, int axis, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap_list(mx::split(arr(a), shape_from(idx, nidx), axis, stream_of(s))); })
}

MLXB_API mlxb_array mlxb_slice(mlxb_array a, const int32_t* start, const int32_t* stop, const int32_t* strides, int n,
                               mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::slice(arr(a), shape_from(start, n), shape_from(stop, n), shape_from(strides, n), stream_of(s)));
  })
}

// mx.slice(a, start_indices: array, axes, slice_size)
MLXB_API mlxb_array mlxb_slice_dynamic(mlxb_array a, mlxb_array start, const int32_t* axes, int naxes,
                                       const int32_t* size, int nsize, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::slice(arr(a), arr(start), ints_from(axes, naxes), shape_from(size, nsize), stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_slice_update(mlxb_array src, mlxb_array upd, const int32_t* start, const int32_t* stop,
                                      const int32_t* strides, int n, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::slice_update(arr(src), arr(upd), shape_from(start, n), shape_from(stop, n), shape_from(strides, n),
                                 stream_of(s)));
  })
}

// mx.slice_update(a, update, start_indices: array, axes)
MLXB_API mlxb_array mlxb_slice_update_dynamic(mlxb_array src, mlxb_array upd, mlxb_array start, const int32_t* axes,
                                              int naxes, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    return wrap(mx::slice_update(arr(src), arr(upd), arr(start), ints_from(axes, naxes), stream_of(s)));
  })
}

// flat != 0: over the flattened array (axis=None).
MLXB_API mlxb_array mlxb_take(mlxb_array a, mlxb_array idx, int axis, int flat, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (flat) return wrap(mx::take(arr(a), arr(idx), stream_of(s)));
    return wrap(mx::take(arr(a), arr(idx), axis, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_take_int(mlxb_array a, int index, int axis, int flat, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (flat) return wrap(mx::take(arr(a), index, stream_of(s)));
    return wrap(mx::take(arr(a), index, axis, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_take_along_axis(mlxb_array a, mlxb_array idx, int axis, int flat, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto st = stream_of(s);
    if (flat) return wrap(mx::take_along_axis(mx::reshape(arr(a), {-1}, st), mx::reshape(arr(idx), {-1}, st), 0, st));
    return wrap(mx::take_along_axis(arr(a), arr(idx), axis, st));
  })
}

MLXB_API mlxb_array mlxb_put_along_axis(mlxb_array a, mlxb_array idx, mlxb_array values, int axis, int flat,
                                        mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto st = stream_of(s);
    auto& x = arr(a);
    if (flat) {
      auto out = mx::put_along_axis(mx::reshape(x, {-1}, st), mx::reshape(arr(idx), {-1}, st),
                                    mx::reshape(arr(values), {-1}, st), 0, st);
      return wrap(mx::reshape(out, x.shape(), st));
    }
    return wrap(mx::put_along_axis(x, arr(idx), arr(values), axis, st));
  })
}

// pad: one (low, high) pair per axis in axes; mode 0 constant, 1 edge, 2 reflect, 3 symmetric.
MLXB_API mlxb_array mlxb_pad(mlxb_array a, const int32_t* axes, const int32_t* low, const int32_t* high, int n,
                             mlxb_array value, int mode, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    static const char* modes[] = {"constant", "edge", "reflect", "symmetric"};
    if (mode < 0 || mode > 3) throw std::invalid_argument("unknown pad mode " + std::to_string(mode));
    return wrap(mx::pad(arr(a), ints_from(axes, n), shape_from(low, n), shape_from(high, n), arr(value), modes[mode],
                        stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_repeat(mlxb_array a, int repeats, int axis, int flat, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (flat) return wrap(mx::repeat(arr(a), repeats, stream_of(s)));
    return wrap(mx::repeat(arr(a), repeats, axis, stream_of(s)));
  })
}

MLXB_API mlxb_array mlxb_tile(mlxb_array a, const int32_t* reps, int n, mlxb_stream s) {
  MLXB_GUARD(nullptr, { return wrap(mx::tile(arr(a), ints_from(reps, n), stream_of(s))); })
}

// naxes < 0 flips every axis.
MLXB_API mlxb_array mlxb_flip(mlxb_array a, const int32_t* axes, int naxes, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto ax = axes_from(axes, naxes);
    if (!ax) return wrap(mx::flip(arr(a), stream_of(s)));
    auto out = arr(a);
    for (int axis : *ax) out = mx::flip(out, axis, stream_of(s));
    return wrap(out);
  })
}

// ---------------------------------------------------------------------------
// a[...] indexing. Entries come as 4 int32 each: (kind, v0, v1, v2).
//   kind & 7 == 0: integer v0
//   kind & 7 == 1: slice v0:v1:v2; bit 8/16/32 of kind = start/stop/step given
//   kind & 7 == 2: array, v0 = position in the arrays list
//   kind & 7 == 3: None (new axis)
//   kind & 7 == 4: Ellipsis
// The result follows MLX Python's __getitem__ (python/src/indexing.cpp):
// integers and arrays are gathered together (their result dims go first when
// they are not adjacent), slices are static, None adds a size-one axis.
namespace {
enum Kind { K_INT = 0, K_SLICE = 1, K_ARRAY = 2, K_NONE = 3, K_ELLIPSIS = 4 };
struct Entry {
  int kind;
  int v[3];
  bool has[3];
  bool gathered() const { return kind == K_INT || kind == K_ARRAY; }
};

Entry full_slice() { return Entry{K_SLICE, {0, 0, 1}, {false, false, false}}; }

// numpy defaults for a slice over an axis of size n.
void slice_params(const Entry& e, int n, int& start, int& stop, int& step) {
  step = e.has[2] ? e.v[2] : 1;
  if (step == 0) throw std::invalid_argument("slice step cannot be zero");
  start = e.has[0] ? e.v[0] : (step < 0 ? n - 1 : 0);
  stop = e.has[1] ? e.v[1] : (step < 0 ? -n - 1 : n);
}

// The indices a slice selects, as a uint32 vector (numpy clamping).
mx::array slice_indices(const Entry& e, int n, mx::StreamOrDevice st) {
  int start, stop, step;
  slice_params(e, n, start, stop, step);
  auto norm = [&](int v, bool is_stop) {
    if (v < 0) v += n;
    if (step > 0) return std::clamp(v, 0, n);
    return std::clamp(v, -1, n - 1);
  };
  start = norm(start, false);
  stop = norm(stop, true);
  return mx::arange(static_cast<double>(start), static_cast<double>(stop), static_cast<double>(step), mx::uint32, st);
}

int norm_index(int v, int n) {
  int i = v < 0 ? v + n : v;
  if (i < 0 || i >= n)
    throw std::invalid_argument("index " + std::to_string(v) + " is out of bounds for axis of size " + std::to_string(n));
  return i;
}

mx::array int_index(int v, int n) { return mx::array(static_cast<uint32_t>(norm_index(v, n)), mx::uint32); }

mx::array index_nd(const mx::array& src_in, std::vector<Entry> entries, const std::vector<mx::array>& arrays,
                   mx::StreamOrDevice st) {
  mx::array src = src_in;
  if (entries.empty()) return src;

  // 1. Expand the ellipsis into full slices.
  int n_ell = 0, n_real = 0;
  for (auto& e : entries) {
    n_ell += e.kind == K_ELLIPSIS;
    n_real += e.kind != K_NONE && e.kind != K_ELLIPSIS;
  }
  if (n_ell > 1) throw std::invalid_argument("an index can only have a single ellipsis (...)");
  if (n_real > static_cast<int>(src.ndim()))
    throw std::invalid_argument("too many indices (" + std::to_string(n_real) + ") for array with " +
                                std::to_string(src.ndim()) + " dimensions");
  std::vector<Entry> idx;
  for (auto& e : entries) {
    if (e.kind == K_ELLIPSIS) {
      for (int k = 0; k < static_cast<int>(src.ndim()) - n_real; k++) idx.push_back(full_slice());
    } else
      idx.push_back(e);
  }

  // 1b. No array entries: MLX Python turns a lone integer into take(src, i, 0), and integers mixed
  // with slices/None into one-element slices, squeezed after (Slice, Squeeze, ExpandDims): the
  // same nodes here, so the graph equals Python's (no gather, no arange of slice indices).
  bool any_array = false, any_int = false;
  for (auto& e : idx) {
    any_array |= e.kind == K_ARRAY;
    any_int |= e.kind == K_INT;
  }
  if (!any_array && any_int) {
    if (entries.size() == 1) return mx::take(src, int_index(idx[0].v[0], src.shape(0)), 0, st);
    mx::Shape starts(src.ndim(), 0), stops = src.shape(), strides(src.ndim(), 1);
    std::vector<int> squeeze_axes, none_axes;
    int axis = 0, out_axis = 0;  // axis of src; axis of the result (Nones included)
    for (auto& e : idx) {
      if (e.kind == K_NONE) {
        none_axes.push_back(out_axis++);
        continue;
      }
      if (e.kind == K_INT) {
        int i = norm_index(e.v[0], src.shape(axis));
        starts[axis] = i;
        stops[axis] = i + 1;
        squeeze_axes.push_back(axis);
      } else {
        slice_params(e, stops[axis], starts[axis], stops[axis], strides[axis]);
        out_axis++;
      }
      axis++;
    }
    src = mx::slice(src, starts, stops, strides, st);
    src = mx::squeeze(src, squeeze_axes, st);
    if (!none_axes.empty()) src = mx::expand_dims(src, none_axes, st);
    return src;
  }

  // 2. Gather the integer/array entries (with the slices before the last one).
  int last = -1;
  for (int i = 0; i < static_cast<int>(idx.size()); i++)
    if (idx[i].gathered()) last = i;

  std::vector<Entry> rest;  // what remains after the gather: slices and Nones over the gathered result
  if (last >= 0) {
    // Result dims of the gather go first when gathered entries are split by a slice or None.
    bool seen = false, gap = false, gather_first = false;
    for (int i = 0; i <= last; i++) {
      if (idx[i].gathered()) {
        if (gap) gather_first = true;
        seen = true;
      } else if (seen)
        gap = true;
    }
    std::vector<Entry> g;
    for (int i = 0; i <= last; i++)
      if (idx[i].kind != K_NONE) g.push_back(idx[i]);

    int max_dims = 0, n_slices = 0;
    std::vector<mx::array> gi;
    std::vector<bool> is_slice;
    for (size_t i = 0; i < g.size(); i++) {
      int n = src.shape(static_cast<int>(i));
      if (g[i].kind == K_SLICE) {
        gi.push_back(slice_indices(g[i], n, st));
        is_slice.push_back(true);
        n_slices++;
      } else if (g[i].kind == K_INT) {
        gi.push_back(int_index(g[i].v[0], n));
        is_slice.push_back(false);
      } else {
        auto& a = arrays.at(g[i].v[0]);
        if (a.dtype() == mx::bool_) throw std::invalid_argument("boolean indices are not supported");
        max_dims = std::max(max_dims, static_cast<int>(a.ndim()));
        gi.push_back(a);
        is_slice.push_back(false);
      }
    }
    // Lay out index shapes so they broadcast to [array dims..., slice dims...]
    // (gather_first) or [slice dims..., array dims...].
    int si = 0;
    for (size_t i = 0; i < gi.size(); i++) {
      if (is_slice[i]) {
        mx::Shape sh(max_dims + n_slices, 1);
        sh[gather_first ? max_dims + si : si] = gi[i].shape(0);
        gi[i] = mx::reshape(gi[i], sh, st);
        si++;
      } else if (gather_first) {
        auto sh = gi[i].shape();
        sh.insert(sh.end(), n_slices, 1);
        gi[i] = mx::reshape(gi[i], sh, st);
      }
    }
    std::vector<int> axes(g.size());
    std::iota(axes.begin(), axes.end(), 0);
    auto sizes = src.shape();
    std::fill(sizes.begin(), sizes.begin() + g.size(), 1);
    src = mx::gather(src, gi, axes, sizes, st);
    // Drop the size-one slice dims of the gathered axes.
    int lead = max_dims + n_slices;
    mx::Shape out(src.shape().begin(), src.shape().begin() + lead);
    out.insert(out.end(), src.shape().begin() + lead + g.size(), src.shape().end());
    src = mx::reshape(src, out, st);

    if (gather_first) {
      for (int i = 0; i < max_dims; i++) rest.push_back(full_slice());
      for (int i = 0; i < last; i++)
        if (idx[i].kind == K_NONE)
          rest.push_back(idx[i]);
        else if (idx[i].kind == K_SLICE)
          rest.push_back(full_slice());
    } else {
      for (int i = 0; i <= last && !idx[i].gathered(); i++)
        rest.push_back(idx[i].kind == K_NONE ? idx[i] : full_slice());
      for (int i = 0; i < max_dims; i++) rest.push_back(full_slice());
    }
    for (size_t i = last + 1; i < idx.size(); i++) rest.push_back(idx[i]);
    if (rest.empty()) return src;
  } else
    rest = idx;

  // 3. Static slices over what is left.
  mx::Shape starts(src.ndim(), 0), stops = src.shape(), strides(src.ndim(), 1);
  int axis = 0;
  bool any_slice = false;
  for (auto& e : rest) {
    if (e.kind == K_NONE) continue;
    slice_params(e, stops[axis], starts[axis], stops[axis], strides[axis]);
    any_slice |= e.has[0] || e.has[1] || e.has[2];
    axis++;
  }
  if (any_slice) src = mx::slice(src, starts, stops, strides, st);

  // 4. New axes.
  if (std::any_of(rest.begin(), rest.end(), [](const Entry& e) { return e.kind == K_NONE; })) {
    mx::Shape out;
    int ax = 0;
    for (auto& e : rest) out.push_back(e.kind == K_NONE ? 1 : src.shape(ax++));
    for (; ax < static_cast<int>(src.ndim()); ax++) out.push_back(src.shape(ax));
    src = mx::reshape(src, out, st);
  }
  return src;
}
}  // namespace

MLXB_API mlxb_array mlxb_index(mlxb_array a, const int32_t* spec, int nentries, const uint64_t* hs, int narrays,
                               mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& x = arr(a);
    auto st = stream_of(s);
    if (nentries < 0 || (nentries > 0 && !spec)) throw std::invalid_argument("bad index spec");
    auto arrays = arrays_from(hs, narrays);
    std::vector<Entry> entries;
    for (int i = 0; i < nentries; i++) {
      const int32_t* q = spec + 4 * i;
      Entry e{q[0] & 7, {q[1], q[2], q[3]}, {(q[0] & 8) != 0, (q[0] & 16) != 0, (q[0] & 32) != 0}};
      if (e.kind > K_ELLIPSIS) throw std::invalid_argument("bad index entry kind");
      if (e.kind == K_ARRAY && (e.v[0] < 0 || e.v[0] >= narrays)) throw std::invalid_argument("bad index array slot");
      entries.push_back(e);
    }
    if (x.ndim() == 0 && !entries.empty()) {
      bool only_new = std::all_of(entries.begin(), entries.end(),
                                  [](const Entry& e) { return e.kind == K_NONE || e.kind == K_ELLIPSIS; });
      if (!only_new) throw std::invalid_argument("too many indices for array: array is 0-dimensional");
    }
    // A lone entry: as MLX Python, a[i] and a[idx] take along axis 0.
    if (entries.size() == 1) {
      auto& e = entries[0];
      if (e.kind == K_INT) return wrap(mx::take(x, int_index(e.v[0], x.shape(0)), 0, st));
      if (e.kind == K_ARRAY) {
        auto& ia = arrays[e.v[0]];
        if (ia.dtype() == mx::bool_) throw std::invalid_argument("boolean indices are not supported");
        return wrap(mx::take(x, ia, 0, st));
      }
    }
    return wrap(index_nd(x, entries, arrays, st));
  })
}

// has_axis == 0 rolls the flattened array (MLX Python's default).
MLXB_API mlxb_array mlxb_roll(mlxb_array a, int shift, int axis, int has_axis, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    if (has_axis) return wrap(mx::roll(arr(a), shift, axis, stream_of(s)));
    return wrap(mx::roll(arr(a), shift, stream_of(s)));
  })
}
