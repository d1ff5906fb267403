// The cluster-pair instantiations of the TMA + wgmma family (CLUSTER_M = 2: two blocks sharing
// B by TMA multicast), fp16 and bf16 with C of the input type (kernels/wgmma_launch.cuh).
#include "kernels/wgmma_launch.cuh"

namespace hgemm::kernels::internal {
HGEMM_WGMMA_CLUSTER_INSTANCES(HGEMM_WGMMA_CLUSTER_INSTANTIATE, __half)
HGEMM_WGMMA_CLUSTER_INSTANCES(HGEMM_WGMMA_CLUSTER_INSTANTIATE, __nv_bfloat16)
}  // namespace hgemm::kernels::internal
