// Host side of one ping-pong kernel instantiation (kernels/wgmma_pingpong.cuh): its tensor maps
// (the cooperative kernel's, internal::ProblemTensorMaps), the dynamic-smem opt-in and the
// persistent grid. The instantiations are explicit (wgmma_pingpong_instances.cu: C of the input
// type; wgmma_pingpong_instances_f32out.cu: fp32 C), so that the registry's wgmma_variants.cu
// compiles none of the kernels; HGEMM_WGMMA_PP_INSTANCES names them all.
//
// Thread safety: LaunchWgmmaPingpong may be called from any thread.
#ifndef HGEMM_KERNELS_WGMMA_PINGPONG_LAUNCH_CUH_
#define HGEMM_KERNELS_WGMMA_PINGPONG_LAUNCH_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"
#include "kernels/registry.h"
#include "kernels/wgmma_launch.cuh"
#include "kernels/wgmma_pingpong.cuh"

namespace hgemm::kernels::internal {

// Enqueues C = op(A)·op(B) with WgmmaPingpongKernel<...> on `stream`: one launch for the whole
// batch, at most one block per SM, each block's tiles alternating between its two consumers.
// REQUIRES: CheckProblem passed for a ping-pong variant of this configuration, p.transpose_a ==
// TRANS_A, p.transpose_b == TRANS_B, p.ab_type the type T and p.c_type TC. Returns the CUDA
// error (cudaErrorInvalidValue if a tensor map could not be encoded).
// @tparam BN, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC  see detail::WgmmaPingpongKernel.
template <int BN, int K_STAGE, int GROUP_M, bool TRANS_A, bool TRANS_B, typename T, typename TC>
cudaError_t LaunchWgmmaPingpong(const GemmProblem& p, cudaStream_t stream) {
  using Cfg = detail::WgmmaPingpong<BN, K_STAGE, GROUP_M>;
  constexpr auto* kernel =
      &detail::WgmmaPingpongKernel<BN, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC>;
  int device = 0;
  HGEMM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  HGEMM_RETURN_IF_CUDA_ERROR(detail::OptInDynamicSmem<kernel>(device, Cfg::kSmemBytes));
  // No fused alpha/beta here (VariantInfo::fused_scale is false, so a scaled problem never
  // arrives): C_in's map is made and unused.
  CUtensorMap map_a, map_b, map_c, map_c_in;
  if (!ProblemTensorMaps<Cfg::BM, BN, TRANS_A, TRANS_B, T, TC>(p, p.batch, &map_a, &map_b, &map_c,
                                                               &map_c_in))
    return cudaErrorInvalidValue;
  int sms = 0;
  HGEMM_RETURN_IF_CUDA_ERROR(detail::SmCount(device, &sms));
  const long long tiles =
      (long long)((p.m + Cfg::BM - 1) / Cfg::BM) * ((p.n + BN - 1) / BN) * p.batch;
  const int grid = int(std::min<long long>(tiles, sms));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b, map_c, p.m, p.n, p.k,
                                                           int(tiles));
  return cudaGetLastError();
}

// Every instantiation, as X(BN, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC): the one kept
// configuration (wgmma_variants.cu) × the four layouts, for input type T and C type TC. One
// configuration only: each costs 16 kernels of nvcc time (docs/kernels_notes.md, "Ping-pong").
#define HGEMM_WGMMA_PP_LAYOUTS(X, BN, K_STAGE, GROUP_M, T, TC) \
  X(BN, K_STAGE, GROUP_M, false, false, T, TC)                 \
  X(BN, K_STAGE, GROUP_M, false, true, T, TC)                  \
  X(BN, K_STAGE, GROUP_M, true, false, T, TC)                  \
  X(BN, K_STAGE, GROUP_M, true, true, T, TC)
#define HGEMM_WGMMA_PP_INSTANCES(X, T, TC) HGEMM_WGMMA_PP_LAYOUTS(X, 128, 6, 8, T, TC)

#define HGEMM_WGMMA_PP_EXTERN(BN, S, G, TA, TB, T, TC)                                         \
  extern template cudaError_t LaunchWgmmaPingpong<BN, S, G, TA, TB, T, TC>(const GemmProblem&, \
                                                                           cudaStream_t);
#define HGEMM_WGMMA_PP_INSTANTIATE(BN, S, G, TA, TB, T, TC)                             \
  template cudaError_t LaunchWgmmaPingpong<BN, S, G, TA, TB, T, TC>(const GemmProblem&, \
                                                                    cudaStream_t);

HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_EXTERN, __half, __half)
HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_EXTERN, __nv_bfloat16, __nv_bfloat16)
HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_EXTERN, __half, float)
HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_EXTERN, __nv_bfloat16, float)

}  // namespace hgemm::kernels::internal

#endif  // HGEMM_KERNELS_WGMMA_PINGPONG_LAUNCH_CUH_
