// Host side of one TMA + wgmma kernel instantiation (kernels/wgmma_stage.cuh): its tensor maps,
// the dynamic-smem opt-in and the persistent grid. The instantiations are explicit, one list per
// element type (wgmma_instances_fp16.cu, wgmma_instances_bf16.cu; fp32 C of either in
// wgmma_instances_f32out.cu), so that the registry's
// wgmma_variants.cu compiles none of the kernels; HGEMM_WGMMA_INSTANCES names them all.
//
// Thread safety: LaunchWgmmaGemm and TensorMap may be called from any thread.
#ifndef HGEMM_KERNELS_WGMMA_LAUNCH_CUH_
#define HGEMM_KERNELS_WGMMA_LAUNCH_CUH_

#include <cuda.h>  // CUtensorMap (the type only: nothing links libcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/launch.cuh"
#include "kernels/registry.h"
#include "kernels/wgmma_stage.cuh"

namespace hgemm::kernels::internal {

// The tensor map of `batch` row-major matrices of rows×cols elements of `type` (fp16, bf16 or
// fp32) whose rows lie `ld` elements apart and whose items lie `item_stride` elements apart (a
// 3-D map, the item outermost), read in boxes of box_rows×box_cols of one item (box_cols × the
// element size = 128 bytes, one swizzle row), 128-byte swizzle; from a process-wide cache or
// newly encoded (wgmma_variants.cu). Returns false if encoding failed.
bool TensorMap(const void* ptr, int rows, int cols, int ld, int batch, int64_t item_stride,
               int box_rows, int box_cols, CUtensorMapDataType type, CUtensorMap* out);

// Enqueues C = op(A)·op(B) with WgmmaGemmKernel<...> on `stream`: one launch for the whole
// batch.
// REQUIRES: CheckProblem passed for a wgmma variant of this configuration, p.transpose_a ==
// TRANS_A, p.transpose_b == TRANS_B, p.ab_type the type T and p.c_type TC. Returns the CUDA
// error (cudaErrorInvalidValue if a tensor map could not be encoded).
// @tparam BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC  see detail::WgmmaGemmKernel.
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M, bool TRANS_A, bool TRANS_B, typename T,
          typename TC>
cudaError_t LaunchWgmmaGemm(const GemmProblem& p, cudaStream_t stream) {
  using Cfg = detail::WgmmaStage<BN, CONSUMERS, K_STAGE, GROUP_M>;
  constexpr auto* kernel =
      &detail::WgmmaGemmKernel<BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC>;
  constexpr bool kFp32Out = std::is_same_v<TC, float>;
  constexpr CUtensorMapDataType kType = std::is_same_v<T, __nv_bfloat16>
                                            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  int device = 0;
  HGEMM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  HGEMM_RETURN_IF_CUDA_ERROR(detail::OptInDynamicSmem<kernel>(device, Cfg::kSmemBytes));
  // Stored extents: A is m×k (k×m transposed), B k×n (n×k transposed), C m×n; a batch's items
  // StridesOf apart.
  const int a_rows = TRANS_A ? p.k : p.m, a_cols = TRANS_A ? p.m : p.k;
  const int b_rows = TRANS_B ? p.n : p.k, b_cols = TRANS_B ? p.k : p.n;
  const BatchStrides strides = StridesOf(p);
  CUtensorMap map_a, map_b, map_c;
  if (!TensorMap(p.a, a_rows, a_cols, p.lda ? p.lda : a_cols, p.batch, strides.a,
                 TRANS_A ? 64 : Cfg::BM, 64, kType, &map_a) ||
      !TensorMap(p.b, b_rows, b_cols, p.ldb ? p.ldb : b_cols, p.batch, strides.b,
                 TRANS_B ? BN : 64, 64, kType, &map_b) ||
      !TensorMap(p.c, p.m, p.n, p.ldc ? p.ldc : p.n, p.batch, strides.c, 64, kFp32Out ? 32 : 64,
                 kFp32Out ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : kType, &map_c))
    return cudaErrorInvalidValue;
  int sms = 0;
  HGEMM_RETURN_IF_CUDA_ERROR(detail::SmCount(device, &sms));
  const long long tiles =
      (long long)((p.m + Cfg::BM - 1) / Cfg::BM) * ((p.n + BN - 1) / BN) * p.batch;
  const int grid = int(std::min<long long>(tiles, sms));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b, map_c, p.m, p.n, p.k,
                                                            p.batch);
  return cudaGetLastError();
}

// Every instantiation, as X(BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC): the kept
// configurations (wgmma_variants.cu) × the four layouts, for one input type T and C type TC.
#define HGEMM_WGMMA_LAYOUTS(X, BN, CONSUMERS, K_STAGE, GROUP_M, T, TC) \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, false, false, T, TC)              \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, false, true, T, TC)               \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, true, false, T, TC)               \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, true, true, T, TC)
#define HGEMM_WGMMA_INSTANCES(X, T, TC)         \
  HGEMM_WGMMA_LAYOUTS(X, 256, 2, 4, 8, T, TC) \
  HGEMM_WGMMA_LAYOUTS(X, 128, 2, 6, 8, T, TC) \
  HGEMM_WGMMA_LAYOUTS(X, 128, 1, 8, 8, T, TC)

#define HGEMM_WGMMA_EXTERN(BN, C, S, G, TA, TB, T, TC)                                       \
  extern template cudaError_t LaunchWgmmaGemm<BN, C, S, G, TA, TB, T, TC>(const GemmProblem&, \
                                                                          cudaStream_t);
#define HGEMM_WGMMA_INSTANTIATE(BN, C, S, G, TA, TB, T, TC) \
  template cudaError_t LaunchWgmmaGemm<BN, C, S, G, TA, TB, T, TC>(const GemmProblem&, cudaStream_t);

HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __half, __half)
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __nv_bfloat16, __nv_bfloat16)
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __half, float)
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __nv_bfloat16, float)

}  // namespace hgemm::kernels::internal

#endif  // HGEMM_KERNELS_WGMMA_LAUNCH_CUH_
