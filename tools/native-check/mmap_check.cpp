// Backend check of the native file mapping (packages/mlx-ffi/native/src/mmap.cpp) without Bun:
// maps a file laid out as saveMappableSafetensors does, runs ops over the mapped arrays on the
// default device (GPU where the MLX build has one), and reports which arrays were read in place.
// Run it against a CUDA or Metal libmlx to see whether that backend maps or copies.
//
//   N=packages/mlx-ffi/native; MLX=<prefix holding include/ and lib/libmlx.*>
//   g++ -std=c++20 -O1 -I $N/include -I $MLX/include $N/src/{mmap,core,array,device,eval,memory}.cpp \
//       tools/native-check/mmap_check.cpp -L $MLX/lib -lmlx -Wl,-rpath,$MLX/lib -o /tmp/mmap_check && /tmp/mmap_check
//
// CPU wheel (mlx-cpu 0.32.4): all three arrays computed correctly; "small" and "page-aligned" read
// in place, "unprefixed" (no size header before it) copied; the mapping is unmapped after the
// last array is freed.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "mlx/mlx.h"
#include "mlxb.h"

namespace mx = mlx::core;
extern "C" {
void* mlxb_mmap_open(const char*);
mlxb_array mlxb_mmap_array(void*, uint64_t, const int32_t*, int, int);
void mlxb_mmap_close(void*);
int mlxb_mmap_is_mapped(mlxb_array, void*);
int mlxb_mmap_live(void);
}

static int fails = 0;
#define CHECK(c)                                                                     \
  do {                                                                               \
    if (!(c)) {                                                                      \
      printf("FAIL %s:%d %s (%s)\n", __FILE__, __LINE__, #c, mlxb_last_error());     \
      fails++;                                                                       \
    }                                                                                \
  } while (0)

int main() {
  printf("gpu available %d, default device %s\n", (int)mx::is_available(mx::Device::gpu),
         mx::default_device() == mx::Device::gpu ? "gpu" : "cpu");
  const char* path = "/tmp/mlxb-mmap-check.bin";
  // [64-byte pad, last 8 bytes = nbytes][float32 x N at 64] ... [pad to 16384, last 8 = nbytes][float32 x M at 16384]
  const int N = 1000, M = 1 << 20;
  std::vector<char> buf(16384 + static_cast<size_t>(M) * 4, 0);
  uint64_t nb = N * 4;
  memcpy(&buf[56], &nb, 8);
  for (int i = 0; i < N; i++) {
    float v = i * 0.5f;
    memcpy(&buf[64 + 4 * i], &v, 4);
  }
  uint64_t mb = static_cast<uint64_t>(M) * 4;
  memcpy(&buf[16384 - 8], &mb, 8);
  for (int i = 0; i < M; i++) {
    float v = (i % 7) * 1.0f;
    memcpy(&buf[16384 + 4 * static_cast<size_t>(i)], &v, 4);
  }
  FILE* f = fopen(path, "wb");
  fwrite(buf.data(), 1, buf.size(), f);
  fclose(f);

  void* m = mlxb_mmap_open(path);
  CHECK(m != nullptr);
  int32_t sn[1] = {N}, sm[1] = {M};
  mlxb_array a = mlxb_mmap_array(m, 64, sn, 1, 10);     // float32 = dtype code 10
  mlxb_array b = mlxb_mmap_array(m, 16384, sm, 1, 10);  // page-aligned
  mlxb_array c = mlxb_mmap_array(m, 4, sn, 1, 10);      // no size header before it: the fallback path
  CHECK(a && b && c);
  printf("in place: small %d, page-aligned %d, unprefixed %d; live mappings %d\n", mlxb_mmap_is_mapped(a, m),
         mlxb_mmap_is_mapped(b, m), mlxb_mmap_is_mapped(c, m), mlxb_mmap_live());
  mlxb_mmap_close(m);  // the arrays keep the mapping alive
  {
    auto& A = *static_cast<mx::array*>(a);
    auto& B = *static_cast<mx::array*>(b);
    auto& C = *static_cast<mx::array*>(c);
    auto sa = mx::sum(mx::add(mx::multiply(A, mx::array(2.0f)), mx::array(1.0f)));
    auto sb = mx::sum(B);
    // A write into a mapped array must make a new buffer, never touch the (read-only) mapping.
    auto upd = mx::slice_update(A, mx::zeros({10}, mx::float32), mx::Shape{0}, mx::Shape{10});
    auto u = mx::sum(mx::slice(upd, {0}, {10}));
    auto a10 = mx::sum(mx::slice(A, {0}, {10}));
    auto c0 = mx::slice(C, {0}, {1});
    mx::eval(std::vector<mx::array>{sa, sb, u, a10, c0});
    double wantA = 0, wantB = 0;
    for (int i = 0; i < N; i++) wantA += 2 * (i * 0.5) + 1;
    for (int i = 0; i < M; i++) wantB += i % 7;
    float c0want;
    memcpy(&c0want, &buf[4], 4);
    printf("sum(a*2+1) = %.1f (want %.1f), sum(b) = %.1f (want %.1f), sum(upd[0:10]) = %g (want 0), sum(a[0:10]) = %g (want 22.5)\n",
           sa.item<float>(), wantA, sb.item<float>(), wantB, u.item<float>(), a10.item<float>());
    CHECK(sa.item<float>() == static_cast<float>(wantA));
    CHECK(sb.item<float>() == static_cast<float>(wantB));
    CHECK(u.item<float>() == 0.0f);
    CHECK(a10.item<float>() == 22.5f);
    CHECK(memcmp(&c0want, &buf[4], 4) == 0 && c0.item<float>() == c0want);
  }
  mlxb_array_free(a);
  mlxb_array_free(b);
  mlxb_array_free(c);
  mx::synchronize();
  printf("after free: live mappings %d\n", mlxb_mmap_live());
  CHECK(mlxb_mmap_live() == 0);
  unlink(path);
  printf(fails ? "FAILED %d\n" : "OK\n", fails);
  return fails ? 1 : 0;
}
