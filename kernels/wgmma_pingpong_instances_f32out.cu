// The ping-pong instantiations with fp32 C: fp16 and bf16 inputs, every layout
// (kernels/wgmma_pingpong_launch.cuh).
#include "kernels/wgmma_pingpong_launch.cuh"

namespace hgemm::kernels::internal {
HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_INSTANTIATE, __half, float)
HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_INSTANTIATE, __nv_bfloat16, float)
}  // namespace hgemm::kernels::internal
