// The instantiated members of the ldmatrix + mma.sync family, one line per variant. Names read
// mma_<BM>x<BN>_bk<BK>_s<K_STAGE>[_swz]; shared memory is always dynamic and XOR-swizzled.
#include <algorithm>
#include <type_traits>

#include "kernels/mma_stage.cuh"
#include "kernels/variant_lists.h"

namespace hgemm::kernels::internal {
namespace {

constexpr int kSwizzleStride = 2048;  // columns per swizzle band (a multiple of every BN here)

// One registered configuration; MIN_BLOCKS_FP16/FP32 are the blocks per SM each accumulator
// type's register allocation must allow (fp16 accumulators need half the registers);
// MIN_BLOCKS_FP32 == 0 registers the configuration for fp16 accumulation only (its fp32
// accumulators would not fit in registers).
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int K_STAGE, bool BLOCK_SWIZZLE,
          int MIN_BLOCKS_FP16, int MIN_BLOCKS_FP32, bool FRAG_DB = false>
struct Mma {
  static constexpr bool kFp32 = MIN_BLOCKS_FP32 > 0;
  template <typename AccT>
  using Cfg =
      detail::MmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, AccT,
                       std::is_same_v<AccT, half> ? MIN_BLOCKS_FP16 : (kFp32 ? MIN_BLOCKS_FP32 : 1),
                       FRAG_DB>;

  // fp16 accumulation past kFp16AccMaxK runs the fp32 accumulators (variant_lists.h).
  static cudaError_t Launch(const GemmProblem& p, int stride, cudaStream_t stream) {
    if (p.accumulation == Accumulation::kFp32 || p.k > kFp16AccMaxK) {
      if constexpr (kFp32)
        return detail::LaunchMmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, float,
                                      MIN_BLOCKS_FP32, FRAG_DB>(
            static_cast<const half*>(p.a), static_cast<const half*>(p.b), static_cast<half*>(p.c),
            p.m, p.n, p.k, stride, stream);
      return cudaErrorInvalidValue;
    }
    return detail::LaunchMmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, half,
                                  MIN_BLOCKS_FP16, FRAG_DB>(
        static_cast<const half*>(p.a), static_cast<const half*>(p.b), static_cast<half*>(p.c), p.m,
        p.n, p.k, stride, stream);
  }

  static bool CanImplement(int m, int n, int k) {
    return (kFp32 || k <= kFp16AccMaxK) && Vec16Shape(m, n, k, BM);
  }

  static VariantInfo Info(const char* name, const char* description) {
    return VariantInfo{name,
                       description,
                       /*fp16_acc=*/true,
                       kFp32,
                       Cfg<half>::kSmemBytes,
                       /*min_sm=*/90,
                       &CanImplement,
                       Vec16Constraints(/*fp16_only=*/!kFp32),
                       VariantKind::kKernel,
                       /*is_fallback=*/false,
                       BLOCK_SWIZZLE ? kSwizzleStride : 0,
                       BM,
                       BN,
                       K_STAGE,
                       /*inner=*/"",
                       &Launch};
  }
};

// Kept after two H200 runs (docs/kernels_notes.md has the variants that lost and why):
// 4-warp 128x128 blocks at 2 per SM beat 8-warp 128x256 blocks at 1 per SM by ~25%; capping
// registers for more blocks, 6 stages, 8 warps of 32x64 all lost 5-10%.
//                          BM   BN   BK warps stages swz  blocks/SM fp16 fp32
using M128S4 = Mma<128, 128, 32, 2, 2, 4, true, 1, 1>;
using M128Bk64S3 = Mma<128, 128, 64, 2, 2, 3, true, 2, 2>;
// fp16 only: 4 warps of 64x128 read 25% fewer shared bytes per MMA than 64x64 warp tiles.
using M128x256W4S4 = Mma<128, 256, 32, 2, 2, 4, true, 2, 0>;
// Double-buffered fragments (_db): ldmatrix of step kk+1 overlaps the MMAs of step kk. (BK=64
// fp32 and 64x128 warp tiles spill with a second fragment buffer, so only this one.)
using M128S4Db = Mma<128, 128, 32, 2, 2, 4, true, 2, 2, true>;

}  // namespace

std::vector<VariantInfo> MmaVariants() {
  return {
      M128x256W4S4::Info("mma_128x256_w4_bk32_s4_swz",
                         "ldmatrix+mma.sync 128x256x32, 4 warps of 64x128, 4 stages (fp16 acc)"),
      M128S4::Info("mma_128x128_bk32_s4_swz",
                   "ldmatrix+mma.sync 128x128x32, 4 warps of 64x64, 4 stages"),
      M128S4Db::Info(
          "mma_128x128_bk32_s4_db_swz",
          "ldmatrix+mma.sync 128x128x32, 4 warps of 64x64, 4 stages, double-buffered fragments"),
      M128Bk64S3::Info("mma_128x128_bk64_s3_swz",
                       "ldmatrix+mma.sync 128x128x64, 4 warps of 64x64, 3 stages"),
  };
}

}  // namespace hgemm::kernels::internal
