// The ping-pong instantiations with C of the input type: fp16 and bf16, every layout
// (kernels/wgmma_pingpong_launch.cuh).
#include "kernels/wgmma_pingpong_launch.cuh"

namespace hgemm::kernels::internal {
HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_INSTANTIATE, __half, __half)
HGEMM_WGMMA_PP_INSTANCES(HGEMM_WGMMA_PP_INSTANTIATE, __nv_bfloat16, __nv_bfloat16)
}  // namespace hgemm::kernels::internal
