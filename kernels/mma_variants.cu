// The instantiated members of the ldmatrix + mma.sync family, one line per variant. Names read
// mma_<BM>x<BN>_bk<BK>_s<K_STAGE>[_swz]; shared memory is always dynamic and XOR-swizzled.
#include <algorithm>

#include "kernels/mma_stage.cuh"
#include "kernels/variant_lists.h"

namespace hgemm::kernels::internal {
namespace {

constexpr int kSwizzleStride = 2048;  // columns per swizzle band (a multiple of every BN here)

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int K_STAGE, bool BLOCK_SWIZZLE>
struct Mma {
  template <typename AccT>
  using Cfg = detail::MmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, AccT>;

  static cudaError_t Launch(const GemmProblem& p, int stride, cudaStream_t stream) {
    if (p.accumulation == Accumulation::kFp32)
      return detail::LaunchMmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, float>(
          p.a, p.b, p.c, p.m, p.n, p.k, stride, stream);
    return detail::LaunchMmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, half>(
        p.a, p.b, p.c, p.m, p.n, p.k, stride, stream);
  }

  static bool CanImplement(int m, int n, int k) { return Vec16Shape(m, n, k, BM); }

  static VariantInfo Info(const char* name, const char* description) {
    return VariantInfo{name,
                       description,
                       /*fp16_acc=*/true,
                       /*fp32_acc=*/true,
                       Cfg<float>::kSmemBytes,
                       /*min_sm=*/90,
                       &CanImplement,
                       "n % 8 == 0, k % 8 == 0, 16-byte aligned a, b, c",
                       VariantKind::kKernel,
                       /*is_fallback=*/false,
                       BLOCK_SWIZZLE ? kSwizzleStride : 0,
                       BM,
                       BN,
                       K_STAGE,
                       &Launch};
  }
};

//                     BM   BN   BK warps stages swz
using M128x256S4 = Mma<128, 256, 32, 2, 4, 4, true>;
using M128x256S3 = Mma<128, 256, 32, 2, 4, 3, true>;
using M128x128S4 = Mma<128, 128, 32, 2, 2, 4, true>;
using M256x128S3 = Mma<256, 128, 32, 4, 2, 3, true>;

}  // namespace

std::vector<VariantInfo> MmaVariants() {
  return {
      M128x256S4::Info("mma_128x256_bk32_s4_swz", "ldmatrix+mma.sync 128x256x32, 8 warps of 64x64, 4 stages"),
      M128x256S3::Info("mma_128x256_bk32_s3_swz", "ldmatrix+mma.sync 128x256x32, 8 warps of 64x64, 3 stages"),
      M256x128S3::Info("mma_256x128_bk32_s3_swz", "ldmatrix+mma.sync 256x128x32, 8 warps of 64x64, 3 stages"),
      M128x128S4::Info("mma_128x128_bk32_s4_swz", "ldmatrix+mma.sync 128x128x32, 4 warps of 64x64, 4 stages"),
  };
}

}  // namespace hgemm::kernels::internal
