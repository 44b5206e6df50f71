// A CPU stand-in for the little of CUDA that the mlx-bun kernel bodies use, so
// check_cuda_kernels.py --emulate can compile a body with g++ exactly as MLX's cuda_kernel
// wraps it (same generated signature) and run it on a machine without a GPU. Every thread of a
// block is a fiber (ucontext); blocks are spread over a few OS threads. __syncthreads parks a
// thread until every live thread of the block has arrived. __shfl_xor_sync / __shfl_sync are a
// two-phase exchange: write the lane's slot, yield, read the partner's, yield. The scheduler
// runs every live lane of a warp once per round, so lanes must reach each shuffle together (as
// on a GPU, where all 32 lanes are named in the mask); a lane that does not is reported.
// It checks the arithmetic, indexing and control flow of a body, not its speed or its memory
// model beyond warp-synchronous shuffles and __syncthreads (__shared__ is per-block storage).
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __grid_constant__
// One copy per OS worker, which runs its blocks one after another: per-block shared memory.
#define __shared__ static thread_local

namespace cuda {
namespace std {
using ::std::numeric_limits;
}
}  // namespace cuda

constexpr int MAX_NDIM = 10;
using Shape = std::array<int32_t, MAX_NDIM>;
using Strides = std::array<int64_t, MAX_NDIM>;

struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) {  // round to nearest even, as __float2bfloat16
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = 0x7fc0;
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = (uint16_t)(u >> 16);
  }
  operator float() const {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// bf16 pairs and the fused bf16 arithmetic mlxb_qmv_exact uses (HFMA2.BF16 and HADD2.BF16: one
// rounding to nearest even of the exact result, modelled here from a double and its TwoSum error).
namespace emu {
inline uint16_t bf16_round_exact(double hi, double lo) {
  if (std::isnan(hi)) return 0x7fc0;
  if (std::isinf(hi)) return hi > 0 ? 0x7f80 : 0xff80;
  const bool neg = hi < 0 || (hi == 0 && std::signbit(hi));
  double a = std::fabs(hi), e = neg ? -lo : lo;
  if (a == 0) return neg ? 0x8000 : 0;
  int ex;
  std::frexp(a, &ex);                        // a = m · 2^ex, m in [0.5, 1)
  const int q = std::max(ex - 8, -133);      // bf16: 8 significant bits, subnormals down to 2^-133
  const double ulp = std::ldexp(1.0, q);
  const double units = a / ulp;              // exact (a power-of-two scale)
  double fl = std::floor(units);
  const double frac = units - fl;
  if (frac > 0.5 || (frac == 0.5 && (e > 0 || (e == 0 && std::fmod(fl, 2.0) == 1.0)))) fl += 1;
  const float r = (float)(fl * ulp);         // representable in bf16 (or overflows to inf)
  uint32_t u;
  std::memcpy(&u, &r, 4);
  if ((u & 0x7fffffffu) > 0x7f7f0000u) u = 0x7f800000u;  // past the largest bf16: infinity
  return (uint16_t)((u >> 16) | (neg ? 0x8000u : 0u));
}
/** The exact a·b + c as a double and the error of that double (TwoSum; a·b is exact for bf16). */
inline uint16_t bf16_fma(float a, float b, float c) {
  const double p = (double)a * (double)b, s = p + (double)c, bb = s - p;
  const double err = (p - (s - bb)) + ((double)c - bb);
  return bf16_round_exact(s, err);
}
}  // namespace emu

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;  // x: the low half
};
inline __nv_bfloat16 emu_bf16_bits(uint16_t b) {
  __nv_bfloat16 r;
  r.bits = b;
  return r;
}
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return {a, b}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline float __low2float(__nv_bfloat162 v) { return (float)v.x; }
inline float __high2float(__nv_bfloat162 v) { return (float)v.y; }
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return {emu_bf16_bits(emu::bf16_fma(a.x, b.x, c.x)), emu_bf16_bits(emu::bf16_fma(a.y, b.y, c.y))};
}
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {emu_bf16_bits(emu::bf16_fma(a.x, b.x, 0.0f)), emu_bf16_bits(emu::bf16_fma(a.y, b.y, 0.0f))};
}
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {emu_bf16_bits(emu::bf16_fma(a.x, 1.0f, b.x)), emu_bf16_bits(emu::bf16_fma(a.y, 1.0f, b.y))};
}
// Scalar bf16 arithmetic with one rounding (the _rn forms the fused norms use, which never contract).
inline float __bfloat162float(__nv_bfloat16 v) { return (float)v; }
inline __nv_bfloat16 __hmul_rn(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_bits(emu::bf16_fma(a, b, 0.0f)); }
inline __nv_bfloat16 __hadd_rn(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_bits(emu::bf16_fma(a, 1.0f, b)); }
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {emu_bf16_bits(emu::bf16_fma(a.x, 1.0f, -(float)b.x)), emu_bf16_bits(emu::bf16_fma(a.y, 1.0f, -(float)b.y))};
}

struct __half {
  _Float16 v;
  __half() = default;
  __half(float f) : v((_Float16)f) {}
  operator float() const { return (float)v; }
};

// Vector types and the few bit intrinsics the quantized matvec (mlxb_qmv) uses.
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
/** __byte_perm(x, y, s): byte i of the result is byte ((s >> 4i) & 7) of the 8 bytes {x, y}. */
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const uint64_t v = (uint64_t)x | ((uint64_t)y << 32);
  unsigned int r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

namespace emu {
struct Fiber {
  ucontext_t ctx;
  bool done = false;
  bool at_barrier = false;
  long syncs = 0;
};
struct Block {
  ucontext_t sched;
  std::vector<Fiber> fibers;
  std::vector<float> slots;
};
inline thread_local Block* block = nullptr;
inline thread_local int tid = 0;
inline void yield() {
  Fiber& f = block->fibers[tid];
  ++f.syncs;
  swapcontext(&f.ctx, &block->sched);
}
}  // namespace emu

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

/** Wait until every live thread of the block is here. */
inline void __syncthreads() {
  emu::block->fibers[emu::tid].at_barrier = true;
  emu::yield();
}

inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int warp = emu::tid & ~31;
  emu::block->slots[emu::tid] = v;
  emu::yield();
  float r = emu::block->slots[warp + ((emu::tid & 31) ^ off)];
  emu::yield();
  return r;
}

/** Lane `src` of the warp's `v`, the same two-phase exchange. */
inline float __shfl_sync(unsigned, float v, int src) {
  const int warp = emu::tid & ~31;
  emu::block->slots[emu::tid] = v;
  emu::yield();
  float r = emu::block->slots[warp + (src & 31)];
  emu::yield();
  return r;
}

namespace cooperative_groups {
struct grid_group {
  unsigned long long thread_rank() const {
    unsigned long long block = ((unsigned long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned long long n = (unsigned long long)blockDim.x * blockDim.y * blockDim.z;
    return block * n + ((unsigned long long)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  }
};
inline grid_group this_grid() { return {}; }
}  // namespace cooperative_groups

using ::fmaxf;
using ::fmaf;
// IEEE round-to-nearest float arithmetic, never contracted (g++ builds the bodies without -ffast-math).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
// MUFU.RSQ is an approximation the emulator cannot reproduce: 1/sqrt in float32 stands in, as in
// the checker's models, and a GPU run decides equality with MLX.
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// cosf / sinf / exp2f: the C library's (CUDA's differ in the last bits; the checker's model calls
// the same C functions, and a GPU run decides equality with MLX).
using ::cosf;
using ::exp2f;
using ::sinf;
using ::expf;
using ::tanhf;
// CUDA's __expf is a fast approximation (ex2.approx): the C library's here, so emulated results
// match a model that calls expf; on a GPU they differ in the last bits of a float32.
inline float __expf(float x) { return ::expf(x); }

namespace emu {
template <class F>
struct Entry {
  static inline thread_local F* body = nullptr;
  static void run() {
    (*body)();
    block->fibers[tid].done = true;
    swapcontext(&block->fibers[tid].ctx, &block->sched);
  }
};
}  // namespace emu

/** Run `body()` for every thread of a grid of `grid` blocks of `block` threads. */
template <class F>
void emu_launch(dim3 grid, dim3 block, F body) {
  gridDim = grid;
  blockDim = block;
  const int n = (int)(block.x * block.y * block.z);
  const long nblocks = (long)grid.x * grid.y * grid.z;
  const int workers = (int)std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  constexpr size_t STACK = 128 * 1024;
  auto work = [&](int w) {
    emu::Block b;
    b.fibers.resize(n);
    b.slots.assign(n, 0.0f);
    std::vector<char> stacks((size_t)n * STACK);
    emu::block = &b;
    F local = body;
    emu::Entry<F>::body = &local;
    for (long id = w; id < nblocks; id += workers) {
      blockIdx = {(unsigned)(id % grid.x), (unsigned)((id / grid.x) % grid.y), (unsigned)(id / ((long)grid.x * grid.y))};
      for (int t = 0; t < n; ++t) {
        emu::Fiber& f = b.fibers[t];
        f.done = false;
        f.syncs = 0;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stacks.data() + (size_t)t * STACK;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, &emu::Entry<F>::run, 0);
      }
      for (bool live = true; live;) {
        live = false;
        // A barrier opens once every live thread waits at it.
        bool all = true;
        for (const auto& f : b.fibers) all = all && (f.done || f.at_barrier);
        if (all)
          for (auto& f : b.fibers) f.at_barrier = false;
        for (int t = 0; t < n; ++t) {
          emu::Fiber& f = b.fibers[t];
          if (f.done) continue;
          if (f.at_barrier) {
            live = true;
            continue;
          }
          emu::tid = t;
          threadIdx = {(unsigned)(t % block.x), (unsigned)((t / block.x) % block.y), (unsigned)(t / (block.x * block.y))};
          swapcontext(&b.sched, &f.ctx);
          live = live || !f.done;
        }
        // Lanes of a warp that are still running must have reached the same shuffle.
        for (int t = 0; t < n; ++t) {
          const emu::Fiber& f = b.fibers[t];
          const emu::Fiber& first = b.fibers[t & ~31];
          const bool split = f.done != first.done && (f.done ? first.syncs > f.syncs : f.syncs > first.syncs);
          if ((!f.done && !first.done && f.syncs != first.syncs) || split) {
            std::fprintf(stderr, "cuda_emu: lanes %d and %d of a warp diverged at a shuffle\n", t & ~31, t);
            std::abort();
          }
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back(work, w);
  for (auto& th : pool) th.join();
}
