// Internal: the per-family variant lists that registry.cc concatenates into Variants().
// Each list is defined next to the instantiations it names (one line per variant).
#ifndef HGEMM_KERNELS_VARIANT_LISTS_H_
#define HGEMM_KERNELS_VARIANT_LISTS_H_

#include <vector>

#include "kernels/registry.h"

namespace hgemm::kernels::internal {

// The staged WMMA family (kernels/wmma_stage.cuh), fallback included (last, is_fallback set).
std::vector<VariantInfo> WmmaVariants();

// The ldmatrix + mma.sync family (kernels/mma_stage.cuh).
std::vector<VariantInfo> MmaVariants();

// The TMA + wgmma family (kernels/wgmma_stage.cuh), sm_90a: empty on a machine whose devices
// are all of another compute capability.
std::vector<VariantInfo> WgmmaVariants();

// Shape predicates shared by the lists. REQUIRES nothing; true if the kernel can take the shape.
// `block_m` bounds M through the grid's y extent (65535 tiles).
bool ShapeFitsGrid(int m, int n, int k, int block_m);
inline bool Vec16Shape(int m, int n, int k, int block_m) {
  return ShapeFitsGrid(m, n, k, block_m) && n % 8 == 0 && k % 8 == 0;
}

}  // namespace hgemm::kernels::internal

#endif  // HGEMM_KERNELS_VARIANT_LISTS_H_
