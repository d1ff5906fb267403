// The bf16 instantiations of the TMA + wgmma family (C of the input type): every kept configuration
// × layout (kernels/wgmma_launch.cuh).
#include "kernels/wgmma_launch.cuh"

namespace hgemm::kernels::internal {
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_INSTANTIATE, __nv_bfloat16, __nv_bfloat16)
}  // namespace hgemm::kernels::internal
