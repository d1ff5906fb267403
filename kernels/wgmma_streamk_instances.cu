// The stream-K instantiations of the TMA + wgmma family (STREAM_K: a last, partial wave cut
// along K over the blocks), fp16 and bf16 with C of the input type (kernels/wgmma_launch.cuh).
#include "kernels/wgmma_launch.cuh"

namespace hgemm::kernels::internal {
HGEMM_WGMMA_STREAMK_INSTANCES(HGEMM_WGMMA_STREAMK_INSTANTIATE, __half)
HGEMM_WGMMA_STREAMK_INSTANCES(HGEMM_WGMMA_STREAMK_INSTANTIATE, __nv_bfloat16)
}  // namespace hgemm::kernels::internal
