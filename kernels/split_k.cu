// splitk<s>_<inner>: C = op(A)·op(B) for skinny M by splitting K. K is cut into at
// most s slices, run as the problems of ONE grouped launch of the inner wgmma kernel (slice i:
// op(A)'s columns and op(B)'s rows [i·Ks, (i+1)·Ks), read in place through the tensor maps at
// an offset with the full row stride; C_i an fp32 partial in the LaunchContext's
// kSplitKScratch), then SplitKReduce sums the partials and rounds once to C's type. At M ≤ 64
// the inner kernel alone makes only N/128 tiles (64 of 132 SMs stream B at N = 8192); s slices
// make s times as many (docs/kernels_notes.md, "Skinny M by split-K").
//
// Thread safety: as Launch (the LaunchContext belongs to one thread).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/registry.h"
#include "kernels/scale_epilogue.h"
#include "kernels/variant_lists.h"

namespace hgemm::kernels::internal {
namespace {

// Split-K pays where a row of tiles leaves SMs idle: M up to two 128-row tiles. It also bounds
// the partials (s·m·n·4 bytes), the scratch the wrapper holds per LaunchContext.
constexpr int kSplitKMaxM = 256;
constexpr size_t kSplitKMaxPartialBytes = size_t{64} << 20;
// The wgmma family's K tile: slices of whole tiles leave no half-empty tile but the last one.
constexpr int kSliceAlignK = 64;

template <int S>
bool SplitKShape(int m, int n, int k) {
  return Vec16Shape(m, n, k, /*block_m=*/64) && n >= 8 && k >= 8 && m <= kSplitKMaxM &&
         size_t(S) * size_t(m) * size_t(n) * sizeof(float) <= kSplitKMaxPartialBytes;
}

bool (*ShapeFor(int s))(int, int, int) {
  switch (s) {
    case 2:
      return &SplitKShape<2>;
    case 4:
      return &SplitKShape<4>;
    case 8:
      return &SplitKShape<8>;
  }
  return nullptr;
}

}  // namespace

VariantInfo SplitKVariant(const VariantInfo& inner, int s) {
  VariantInfo v = inner;
  v.name = "splitk" + std::to_string(s) + "_" + inner.name;
  v.description = "K in " + std::to_string(s) + " slices as one grouped launch of " + inner.name +
                  " into fp32 partials, then a reduce (skinny M; applies alpha/beta)";
  v.can_implement = ShapeFor(s);
  v.constraints = "m <= " + std::to_string(kSplitKMaxM) + ", " + Vec16Constraints(false) +
                  ", s·m·n·4 <= " + std::to_string(kSplitKMaxPartialBytes >> 20) +
                  " MiB of partials; m % 8 == 0 if transpose_a; lda, ldb, ldc % 8 == 0; sm_90";
  v.kind = VariantKind::kSplitK;
  v.is_fallback = false;
  v.inner = inner.name;
  v.launch = nullptr;
  v.batched = false;           // a batch: one split launch per item
  v.launch_grouped = nullptr;  // a group: one split launch per problem
  v.split_k = s;
  v.fused_scale = true;  // SplitKReduce applies alpha and beta
  // Not yet measured on a GPU: out of auto until tools/gpu_e2e.sh skinny has checked and
  // measured it on one (docs/kernels.md, "Experimental variants").
  v.experimental = true;
  v.description += "; experimental (not in auto until measured on a GPU)";
  return v;  // layouts, types, strides and check_layout: the inner kernel's (it reads in place)
}

std::string LaunchSplitK(const VariantInfo& v, const GemmProblem& p, LaunchContext& ctx) {
  const VariantInfo* inner = FindVariant(v.inner);
  if (inner == nullptr || inner->kind != VariantKind::kKernel)
    return "bad inner variant " + v.inner;
  const KSlices slices = SliceK(p.k, v.split_k);
  const int64_t slice_elements = int64_t(p.m) * p.n;
  std::string error;
  auto* partials = static_cast<float*>(
      ctx.Scratch(LaunchContext::kSplitKScratch,
                  size_t(slices.count) * slice_elements * sizeof(float), &error));
  if (partials == nullptr) return error;
  const std::vector<GemmProblem> parts = SplitKProblems(p, v.split_k, partials);
  if (std::string e = LaunchGrouped(*inner, parts, ctx); !e.empty()) return inner->name + ": " + e;
  const int ldc = p.ldc != 0 ? p.ldc : p.n;
  // α/β applied in the reduce (fused_scale): C_in read there with beta != 0, in place allowed.
  if (cudaError_t e = SplitKReduce(partials, slices.count, slice_elements, p.m, p.n, p.c_in, p.c,
                                   ldc, p.alpha, p.beta, p.c_type, ctx.stream());
      e != cudaSuccess)
    return CudaErrorText("split-K reduce", e);
  return "";
}

}  // namespace hgemm::kernels::internal

namespace hgemm::kernels {

KSlices SliceK(int k, int s) {
  constexpr int64_t kAlign = internal::kSliceAlignK;
  const int64_t per_slice = (int64_t(k) + s - 1) / s;
  const int64_t depth = (per_slice + kAlign - 1) / kAlign * kAlign;  // int64: k near 2^31
  return {int((k + depth - 1) / depth), int(std::min<int64_t>(depth, k))};
}

std::vector<GemmProblem> SplitKProblems(const GemmProblem& p, int s, float* partials) {
  const KSlices slices = SliceK(p.k, s);
  const int64_t slice_elements = int64_t(p.m) * p.n;
  // Stored row strides: slices keep the whole matrix's, so a slice is a window of it.
  const int lda = p.lda != 0 ? p.lda : (p.transpose_a ? p.m : p.k);
  const int ldb = p.ldb != 0 ? p.ldb : (p.transpose_b ? p.k : p.n);
  const int64_t element_bytes = int64_t(DataTypeBytes(p.ab_type));
  std::vector<GemmProblem> parts;
  for (int i = 0; i < slices.count; ++i) {
    const int64_t k0 = int64_t(i) * slices.depth;
    GemmProblem q = p;
    q.k = i + 1 < slices.count ? slices.depth : int(p.k - k0);
    // op(A)'s columns k0... are stored A's columns (N) or rows (T); op(B)'s rows k0... are
    // stored B's rows (N) or columns (T).
    q.a = static_cast<const char*>(p.a) + (p.transpose_a ? k0 * lda : k0) * element_bytes;
    q.b = static_cast<const char*>(p.b) + (p.transpose_b ? k0 : k0 * ldb) * element_bytes;
    q.lda = lda;
    q.ldb = ldb;
    q.c = partials + i * slice_elements;
    q.ldc = 0;
    q.c_type = DataType::kFp32;
    q.accumulation = Accumulation::kFp32;  // fp32 partials (the wgmma family's accumulators)
    q.alpha = 1.0f;                        // the reduce scales the sum
    q.beta = 0.0f;
    q.c_in = nullptr;
    parts.push_back(q);
  }
  return parts;
}

}  // namespace hgemm::kernels
