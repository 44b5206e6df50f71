
#include "mlx/backend/cuda/device/binary_ops.cuh"
#include "mlx/backend/cuda/device/ternary_ops.cuh"
#include "mlx/backend/cuda/device/unary_ops.cuh"
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>
namespace mlx::core::cu {

namespace cg = cooperative_groups;

template <typename IdxT = uint32_t, int work_per_thread = 1>
__global__ void GV2IBroadcastABHV2IBroadcastBAIV2IMultiplyGHJV2IBroadcastBEKV2IBroadcastEBLV2IAddJKMV2IBroadcastDLNV2IBroadcastLDOV2IMultiplyMNPV2ITanhOQV2IBroadcastCPRV2IBroadcastPCSV2IAddQRTV2IBroadcastISUV2IBroadcastSIVV2IMultiplyTUWV2IBroadcastVFXV2IBroadcastFVYV2OMultiplyWX_CVCCVV_V2V2V2_1912437575056202914_contiguous(
    const __nv_bfloat16* A,
    const __nv_bfloat16* B,
    const __nv_bfloat16* C,
    __nv_bfloat16* D,
    IdxT size) {
  IdxT index = cg::this_grid().thread_rank() * work_per_thread;
  if (index >= size) {
    return;
  }
  auto vec_A = load_vector<work_per_thread, __nv_bfloat16>(A + index, 0, size - index, 0);
  auto vec_B = load_vector<work_per_thread, __nv_bfloat16>(B + index, 0, size - index, 0);
  auto vec_C = load_vector<work_per_thread, __nv_bfloat16>(C + index, 0, size - index, 0);
  AlignedVector<__nv_bfloat16, work_per_thread> vec_D;

  #pragma unroll
  for (int i = 0; i < work_per_thread; i++) {
    __nv_bfloat16 tmp_E = static_cast<__nv_bfloat16>(0.5);
    __nv_bfloat16 tmp_A = vec_A[i];
    __nv_bfloat16 tmp_F = static_cast<__nv_bfloat16>(1);
    __nv_bfloat16 tmp_G = static_cast<__nv_bfloat16>(0.796875);
    __nv_bfloat16 tmp_B = vec_B[i];
    __nv_bfloat16 tmp_C = vec_C[i];
    __nv_bfloat16 tmp_H = static_cast<__nv_bfloat16>(tmp_E);
    __nv_bfloat16 tmp_I = static_cast<__nv_bfloat16>(tmp_A);
    __nv_bfloat16 tmp_J = Multiply{}(tmp_H, tmp_I);
    __nv_bfloat16 tmp_K = static_cast<__nv_bfloat16>(tmp_A);
    __nv_bfloat16 tmp_L = static_cast<__nv_bfloat16>(tmp_B);
    __nv_bfloat16 tmp_M = Add{}(tmp_K, tmp_L);
    __nv_bfloat16 tmp_N = static_cast<__nv_bfloat16>(tmp_G);
    __nv_bfloat16 tmp_O = static_cast<__nv_bfloat16>(tmp_M);
    __nv_bfloat16 tmp_P = Multiply{}(tmp_N, tmp_O);
    __nv_bfloat16 tmp_Q = Tanh{}(tmp_P);
    __nv_bfloat16 tmp_R = static_cast<__nv_bfloat16>(tmp_F);
    __nv_bfloat16 tmp_S = static_cast<__nv_bfloat16>(tmp_Q);
    __nv_bfloat16 tmp_T = Add{}(tmp_R, tmp_S);
    __nv_bfloat16 tmp_U = static_cast<__nv_bfloat16>(tmp_J);
    __nv_bfloat16 tmp_V = static_cast<__nv_bfloat16>(tmp_T);
    __nv_bfloat16 tmp_W = Multiply{}(tmp_U, tmp_V);
    __nv_bfloat16 tmp_X = static_cast<__nv_bfloat16>(tmp_W);
    __nv_bfloat16 tmp_Y = static_cast<__nv_bfloat16>(tmp_C);
    __nv_bfloat16 tmp_D = Multiply{}(tmp_X, tmp_Y);
    vec_D[i] = tmp_D;
  }
  store_vector(D + index, 0, vec_D, size - index);
}

template <int NDIM, typename IdxT = uint32_t, int work_per_thread = 1>
__global__ void GV2IBroadcastABHV2IBroadcastBAIV2IMultiplyGHJV2IBroadcastBEKV2IBroadcastEBLV2IAddJKMV2IBroadcastDLNV2IBroadcastLDOV2IMultiplyMNPV2ITanhOQV2IBroadcastCPRV2IBroadcastPCSV2IAddQRTV2IBroadcastISUV2IBroadcastSIVV2IMultiplyTUWV2IBroadcastVFXV2IBroadcastFVYV2OMultiplyWX_CVCCVV_V2V2V2_1912437575056202914_strided(
    const __nv_bfloat16* A,
    const __grid_constant__ cuda::std::array<int64_t, NDIM> A_strides,
    const __nv_bfloat16* B,
    const __grid_constant__ cuda::std::array<int64_t, NDIM> B_strides,
    const __nv_bfloat16* C,
    const __grid_constant__ cuda::std::array<int64_t, NDIM> C_strides,
    __nv_bfloat16* D,
    const __grid_constant__ cuda::std::array<int32_t, NDIM> shape,
    IdxT size) {
  IdxT index = cg::this_grid().thread_rank() * work_per_thread;
  if (index >= size) {
    return;
  }
  IdxT A_idx = 0;
  IdxT B_idx = 0;
  IdxT C_idx = 0;
  {
    IdxT loc = index;
    #pragma unroll
    for (int i = NDIM - 1; i >= 0; i--) {
      A_idx += (loc % shape[i]) * IdxT(A_strides[i]);
      B_idx += (loc % shape[i]) * IdxT(B_strides[i]);
      C_idx += (loc % shape[i]) * IdxT(C_strides[i]);
      loc /= shape[i];
    }
  }
  AlignedVector<__nv_bfloat16, work_per_thread> vec_D;

  for (int i = 0; i < work_per_thread && index < size; i++) {
    __nv_bfloat16 tmp_E = static_cast<__nv_bfloat16>(0.5);
    __nv_bfloat16 tmp_A = A[A_idx];
    __nv_bfloat16 tmp_F = static_cast<__nv_bfloat16>(1);
    __nv_bfloat16 tmp_G = static_cast<__nv_bfloat16>(0.796875);
    __nv_bfloat16 tmp_B = B[B_idx];
    __nv_bfloat16 tmp_C = C[C_idx];
    __nv_bfloat16 tmp_H = static_cast<__nv_bfloat16>(tmp_E);
    __nv_bfloat16 tmp_I = static_cast<__nv_bfloat16>(tmp_A);
    __nv_bfloat16 tmp_J = Multiply{}(tmp_H, tmp_I);
    __nv_bfloat16 tmp_K = static_cast<__nv_bfloat16>(tmp_A);
    __nv_bfloat16 tmp_L = static_cast<__nv_bfloat16>(tmp_B);
    __nv_bfloat16 tmp_M = Add{}(tmp_K, tmp_L);
    __nv_bfloat16 tmp_N = static_cast<__nv_bfloat16>(tmp_G);
    __nv_bfloat16 tmp_O = static_cast<__nv_bfloat16>(tmp_M);
    __nv_bfloat16 tmp_P = Multiply{}(tmp_N, tmp_O);
    __nv_bfloat16 tmp_Q = Tanh{}(tmp_P);
    __nv_bfloat16 tmp_R = static_cast<__nv_bfloat16>(tmp_F);
    __nv_bfloat16 tmp_S = static_cast<__nv_bfloat16>(tmp_Q);
    __nv_bfloat16 tmp_T = Add{}(tmp_R, tmp_S);
    __nv_bfloat16 tmp_U = static_cast<__nv_bfloat16>(tmp_J);
    __nv_bfloat16 tmp_V = static_cast<__nv_bfloat16>(tmp_T);
    __nv_bfloat16 tmp_W = Multiply{}(tmp_U, tmp_V);
    __nv_bfloat16 tmp_X = static_cast<__nv_bfloat16>(tmp_W);
    __nv_bfloat16 tmp_Y = static_cast<__nv_bfloat16>(tmp_C);
    __nv_bfloat16 tmp_D = Multiply{}(tmp_X, tmp_Y);
    vec_D[i] = tmp_D;

    A_idx += A_strides[NDIM - 1];
    B_idx += B_strides[NDIM - 1];
    C_idx += C_strides[NDIM - 1];
  }
  store_vector(D + index, 0, vec_D, size - index);
}

} // namespace mlx::core::cu
