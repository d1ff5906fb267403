// Internal: the per-family variant lists that registry.cc concatenates into Variants().
// Each list is defined next to the instantiations it names (one line per variant).
#ifndef HGEMM_KERNELS_VARIANT_LISTS_H_
#define HGEMM_KERNELS_VARIANT_LISTS_H_

#include <string>
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

// skinny_m16 (kernels/skinny_stream.cu): M <= 16, split-K reduced in the launch.
std::vector<VariantInfo> SkinnyVariants();

// splitk<s>_<inner> over a wgmma kernel (kernels/split_k.cu): the inner's layouts, types and
// strides, m up to 256, s·m·n fp32 partials of at most 64 MiB.
VariantInfo SplitKVariant(const VariantInfo& inner, int s);

// Runs a splitk variant (Launch's kSplitK case). REQUIRES: CheckProblem passed, batch 1.
// Returns "" or the error.
std::string LaunchSplitK(const VariantInfo& v, const GemmProblem& p, LaunchContext& ctx);

// The longest K the mma.sync and WMMA families accumulate in fp16 registers: up to it their
// error is cuBLAS's fp16-compute error (2.35e-3 for both at 4096^3, docs/kernels_notes.md run 4);
// beyond it fp16 rounding of the running sums grows past twice that (8e-2 at K = 65536).
// Longer fp16-accumulation requests run the same tiles with fp32 accumulators (docs/kernels.md,
// "What fp16 accumulation means"); variants instantiated for fp16 only do not take such K.
constexpr int kFp16AccMaxK = 4096;

// The constraints text of the 16-byte kernels (VariantInfo::constraints); `fp16_only`: the
// configuration has no fp32 accumulators, so it takes K up to kFp16AccMaxK only.
inline std::string Vec16Constraints(bool fp16_only) {
  return std::string("n % 8 == 0, k % 8 == 0, ") +
         (fp16_only ? "k <= " + std::to_string(kFp16AccMaxK) + ", " : "") +
         "16-byte aligned a, b, c";
}

// Shape predicates shared by the lists. REQUIRES nothing; true if the kernel can take the shape.
// `block_m` bounds M through the grid's y extent (65535 tiles).
bool ShapeFitsGrid(int m, int n, int k, int block_m);
inline bool Vec16Shape(int m, int n, int k, int block_m) {
  return ShapeFitsGrid(m, n, k, block_m) && n % 8 == 0 && k % 8 == 0;
}

}  // namespace hgemm::kernels::internal

#endif  // HGEMM_KERNELS_VARIANT_LISTS_H_
