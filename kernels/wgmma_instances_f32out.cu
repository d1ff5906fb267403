// The fp32-C instantiations of the TMA + wgmma family: fp16 and bf16 inputs, every kept
// configuration × layout (kernels/wgmma_launch.cuh).
#include "kernels/wgmma_launch.cuh"

namespace hgemm::kernels::internal {
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_INSTANTIATE, __half, float)
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_INSTANTIATE, __nv_bfloat16, float)
}  // namespace hgemm::kernels::internal
