// TurboQuant primitives: orthonormal randomized Walsh-Hadamard transform, Lloyd-Max codebook
// lookup, and bit-packing of 1-8-bit indices into uint8. Each entry point is one fused
// composition of plain MLX ops (it runs on every backend and stays lazy).
#include "ops_internal.h"

using namespace mlxb;

namespace {
bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

void check_bits(int bits) {
  if (bits < 1 || bits > 8) throw std::invalid_argument("bits must be in 1..8, got " + std::to_string(bits));
}

// Shape with the last dimension replaced.
mx::Shape with_last(const mx::array& a, int last) {
  auto s = a.shape();
  s.back() = last;
  return s;
}

// Bit offsets k*step for k in [0, count), as uint64 (the packing works on 64-bit words).
mx::array offsets(int count, int step, const mx::StreamOrDevice& st) {
  return mx::arange(0.0, static_cast<double>(count) * step, static_cast<double>(step), mx::uint64, st);
}

mx::array slice_last(const mx::array& a, int stop, const mx::StreamOrDevice& st) {
  mx::Shape start(a.ndim(), 0);
  return mx::slice(a, start, a.shape().size() ? with_last(a, stop) : a.shape(), st);
}

mx::array pad_last(const mx::array& a, int extra, const mx::StreamOrDevice& st) {
  if (extra == 0) return a;
  return mx::pad(a, {static_cast<int>(a.ndim()) - 1}, mx::Shape{0}, mx::Shape{extra}, mx::array(0, a.dtype()), "constant", st);
}
}  // namespace

// Forward: y = H (s ⊙ x) / sqrt(n); inverse: x = s ⊙ (H y / sqrt(n)). H is the Sylvester
// Hadamard matrix (symmetric, H·H = n·I), so each direction is orthonormal and the other's
// inverse. signs: ±1 of shape [n] (any dtype; cast to x's), or null for no sign flips.
MLXB_API mlxb_array mlxb_tq_fwht(mlxb_array x, mlxb_array signs, int inverse, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& a = arr(x);
    auto st = stream_of(s);
    if (a.ndim() < 1) throw std::invalid_argument("needs at least one dimension");
    int n = a.shape(-1);
    if (!is_pow2(n)) throw std::invalid_argument("last dimension " + std::to_string(n) + " is not a power of two");
    if (!mx::issubdtype(a.dtype(), mx::floating)) throw std::invalid_argument("needs a floating-point input");
    std::optional<mx::array> sg;
    if (signs) {
      auto& sa = arr(signs);
      if (sa.ndim() != 1 || sa.shape(0) != n) {
        throw std::invalid_argument("signs must have shape [" + std::to_string(n) + "]");
      }
      sg = mx::astype(sa, a.dtype(), st);
    }
    // MLX's default scale is 1/sqrt(n): the orthonormal transform.
    std::optional<float> scale;
    if (!inverse) {
      auto in = sg ? mx::multiply(a, *sg, st) : a;
      return wrap(mx::hadamard_transform(in, scale, st));
    }
    auto out = mx::hadamard_transform(a, scale, st);
    return wrap(sg ? mx::multiply(out, *sg, st) : out);
  })
}

// Index of the codebook cell of each element: the number of boundaries strictly below it
// (boundaries sorted ascending, one fewer than the codebook entries). Returns uint8.
MLXB_API mlxb_array mlxb_tq_codebook_quantize(mlxb_array x, mlxb_array boundaries, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& a = arr(x);
    auto& b = arr(boundaries);
    auto st = stream_of(s);
    if (b.ndim() != 1 || b.shape(0) > 255) throw std::invalid_argument("boundaries must be 1-D with at most 255 entries");
    auto above = mx::greater(mx::expand_dims(a, -1, st), mx::astype(b, a.dtype(), st), st);
    return wrap(mx::astype(mx::sum(above, -1, false, st), mx::uint8, st));
  })
}

// codebook[indices], in the codebook's dtype.
MLXB_API mlxb_array mlxb_tq_codebook_dequantize(mlxb_array indices, mlxb_array codebook, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    auto& c = arr(codebook);
    if (c.ndim() != 1) throw std::invalid_argument("codebook must be 1-D");
    return wrap(mx::take(c, arr(indices), stream_of(s)));
  })
}

// Pack the low `bits` bits of each element along the last axis into a little-endian bit
// stream: element i of a row takes bits [i*bits, (i+1)*bits), byte j holds bits [8j, 8j+8),
// least significant first. A row of n elements packs into ceil(n*bits/8) bytes (zero-filled).
// Done in chunks of 8 elements = `bits` bytes = one 64-bit word.
MLXB_API mlxb_array mlxb_tq_pack(mlxb_array x, int bits, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    check_bits(bits);
    auto& a = arr(x);
    auto st = stream_of(s);
    if (a.ndim() < 1) throw std::invalid_argument("needs at least one dimension");
    if (!mx::issubdtype(a.dtype(), mx::integer) && a.dtype() != mx::bool_) throw std::invalid_argument("needs integer indices");
    int n = a.shape(-1);
    int chunks = (n + 7) / 8;
    int nbytes = (n * bits + 7) / 8;
    auto v = pad_last(mx::astype(a, mx::uint64, st), chunks * 8 - n, st);
    auto shape = a.shape();
    shape.back() = chunks;
    shape.push_back(8);
    v = mx::bitwise_and(mx::reshape(v, shape, st), mx::array(static_cast<uint64_t>((1u << bits) - 1), mx::uint64), st);
    auto word = mx::sum(mx::left_shift(v, offsets(8, bits, st), st), -1, false, st);
    auto bytes = mx::right_shift(mx::expand_dims(word, -1, st), offsets(bits, 8, st), st);
    bytes = mx::astype(mx::bitwise_and(bytes, mx::array(static_cast<uint64_t>(0xff), mx::uint64), st), mx::uint8, st);
    auto flat = mx::reshape(bytes, with_last(a, chunks * bits), st);
    return wrap(nbytes == chunks * bits ? flat : slice_last(flat, nbytes, st));
  })
}

// Inverse of mlxb_tq_pack: n elements per row (uint8 out); the last axis must hold
// ceil(n*bits/8) bytes.
MLXB_API mlxb_array mlxb_tq_unpack(mlxb_array p, int bits, int n, mlxb_stream s) {
  MLXB_GUARD(nullptr, {
    check_bits(bits);
    auto& a = arr(p);
    auto st = stream_of(s);
    if (a.ndim() < 1) throw std::invalid_argument("needs at least one dimension");
    if (a.dtype() != mx::uint8) throw std::invalid_argument("needs uint8 packed data");
    if (n < 0) throw std::invalid_argument("negative element count");
    int nbytes = (n * bits + 7) / 8;
    if (a.shape(-1) != nbytes) {
      throw std::invalid_argument("last dimension " + std::to_string(a.shape(-1)) + " is not ceil(" + std::to_string(n) + "*" +
                                  std::to_string(bits) + "/8) = " + std::to_string(nbytes));
    }
    int chunks = (n + 7) / 8;
    auto b = pad_last(mx::astype(a, mx::uint64, st), chunks * bits - nbytes, st);
    auto shape = a.shape();
    shape.back() = chunks;
    shape.push_back(bits);
    b = mx::reshape(b, shape, st);
    auto word = mx::sum(mx::left_shift(b, offsets(bits, 8, st), st), -1, false, st);
    auto v = mx::right_shift(mx::expand_dims(word, -1, st), offsets(8, bits, st), st);
    v = mx::astype(mx::bitwise_and(v, mx::array(static_cast<uint64_t>((1u << bits) - 1), mx::uint64), st), mx::uint8, st);
    auto flat = mx::reshape(v, with_last(a, chunks * 8), st);
    return wrap(n == chunks * 8 ? flat : slice_last(flat, n, st));
  })
}
