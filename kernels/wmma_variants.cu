// The instantiated members of the staged WMMA family, one line per variant. Names read
// wmma_<BM>x<BN>[_bk<BK>]_s<K_STAGE>_<ssmem|dsmem>[_nopad][_swz]; BK is 16 unless named; padding
// is 8 halves on A and B unless _nopad.
#include <algorithm>

#include "kernels/variant_lists.h"
#include "kernels/wmma_stage.cuh"

namespace hgemm::kernels::internal {
namespace {

constexpr int kSwizzleStride = 2048;  // columns per swizzle band (a multiple of every BN here)

// One registered configuration: the template arguments of detail::WmmaStage (16x16x16 WMMA) and
// whether it is instantiated with fp32 accumulators (256x256 tiles would spill: 128 accumulator
// registers per thread with 512 threads per block, so they are fp16-only).
template <int WMMA_TILE_M, int WMMA_TILE_N, int WARP_TILE_M, int WARP_TILE_N, int BK, int A_PAD,
          int B_PAD, int K_STAGE, bool BLOCK_SWIZZLE, bool DYNAMIC_SMEM, bool VEC16, bool FP32_ACC>
struct Wmma {
  template <typename AccT>
  using Cfg = detail::WmmaStage<16, 16, 16, WMMA_TILE_M, WMMA_TILE_N, WARP_TILE_M, WARP_TILE_N, BK,
                                A_PAD, B_PAD, K_STAGE, BLOCK_SWIZZLE, DYNAMIC_SMEM, VEC16, AccT>;

  template <typename AccT>
  static cudaError_t Run(const GemmProblem& p, int stride, cudaStream_t stream) {
    return detail::LaunchWmmaStage<WMMA_TILE_M, WMMA_TILE_N, WARP_TILE_M, WARP_TILE_N, BK, A_PAD,
                                   B_PAD, K_STAGE, BLOCK_SWIZZLE, DYNAMIC_SMEM, VEC16, AccT>(
        static_cast<const half*>(p.a), static_cast<const half*>(p.b), static_cast<half*>(p.c), p.m,
        p.n, p.k, stride, stream);
  }

  // fp16 accumulation past kFp16AccMaxK runs the fp32 accumulators (variant_lists.h).
  static cudaError_t Launch(const GemmProblem& p, int stride, cudaStream_t stream) {
    if (p.accumulation == Accumulation::kFp32 || p.k > kFp16AccMaxK) {
      if constexpr (FP32_ACC) return Run<float>(p, stride, stream);
      return cudaErrorInvalidValue;
    }
    return Run<half>(p, stride, stream);
  }

  static bool CanImplement(int m, int n, int k) {
    if (!FP32_ACC && k > kFp16AccMaxK) return false;
    return VEC16 ? Vec16Shape(m, n, k, Cfg<half>::BM) : ShapeFitsGrid(m, n, k, Cfg<half>::BM);
  }

  static VariantInfo Info(const char* name, const char* description) {
    const size_t smem =
        FP32_ACC ? std::max(Cfg<half>::kSmemBytes, Cfg<float>::kSmemBytes) : Cfg<half>::kSmemBytes;
    return VariantInfo{name,
                       description,
                       /*fp16_acc=*/true,
                       FP32_ACC,
                       smem,
                       /*min_sm=*/90,
                       &CanImplement,
                       VEC16 ? Vec16Constraints(/*fp16_only=*/!FP32_ACC) : "any m, n, k >= 1",
                       VariantKind::kKernel,
                       /*is_fallback=*/!VEC16,
                       BLOCK_SWIZZLE ? kSwizzleStride : 0,
                       Cfg<half>::BM,
                       Cfg<half>::BN,
                       K_STAGE,
                       /*inner=*/"",
                       &Launch};
  }
};

//                     warps  frags   BK  pads  stages swz    dsmem  vec16  fp32
using W128S2 = Wmma<4, 2, 2, 4, 16, 8, 8, 2, false, false, true, true>;
using W128S3Nopad = Wmma<4, 2, 2, 4, 16, 0, 0, 3, true, false, true, true>;
using W128S3 = Wmma<4, 2, 2, 4, 16, 8, 8, 3, true, false, true, true>;
using W128S4 = Wmma<4, 2, 2, 4, 16, 8, 8, 4, true, true, true, true>;
using W128S5 = Wmma<4, 2, 2, 4, 16, 8, 8, 5, true, true, true, true>;
using W128Bk32S3 = Wmma<4, 2, 2, 4, 32, 8, 8, 3, true, true, true, true>;
using W128Bk32S4 = Wmma<4, 2, 2, 4, 32, 8, 8, 4, true, true, true, true>;
using W128Bk32S6 = Wmma<4, 2, 2, 4, 32, 8, 8, 6, true, true, true, true>;
using W256S3 = Wmma<4, 4, 4, 4, 16, 8, 8, 3, true, true, true, false>;
using W256Bk32S3 = Wmma<4, 4, 4, 4, 32, 8, 8, 3, true, true, true, false>;
using W128x256S3 = Wmma<2, 4, 4, 4, 32, 8, 8, 3, true, true, true, true>;
using W64Unaligned = Wmma<2, 2, 2, 2, 16, 8, 8, 2, false, false, false, true>;

}  // namespace

std::vector<VariantInfo> WmmaVariants() {
  return {
      W128x256S3::Info("wmma_128x256_bk32_s3_dsmem_swz",
                       "WMMA 128x256x32 tile, 8 warps of 64x64, 3 stages"),
      W256Bk32S3::Info("wmma_256x256_bk32_s3_dsmem_swz",
                       "WMMA 256x256x32 tile, 16 warps, 3 stages (fp16 acc)"),
      W128Bk32S4::Info("wmma_128x128_bk32_s4_dsmem_swz",
                       "WMMA 128x128x32 tile, 4 stages, swizzled"),
      W128Bk32S3::Info("wmma_128x128_bk32_s3_dsmem_swz",
                       "WMMA 128x128x32 tile, 3 stages, swizzled"),
      W128Bk32S6::Info("wmma_128x128_bk32_s6_dsmem_swz",
                       "WMMA 128x128x32 tile, 6 stages, swizzled"),
      W128S4::Info("wmma_128x128_s4_dsmem_swz", "WMMA 128x128x16 tile, 4 stages, swizzled"),
      W128S5::Info("wmma_128x128_s5_dsmem_swz", "WMMA 128x128x16 tile, 5 stages, swizzled"),
      W128S3::Info("wmma_128x128_s3_ssmem_swz",
                   "WMMA 128x128x16 tile, 3 stages, static smem, swizzled"),
      W256S3::Info("wmma_256x256_s3_dsmem_swz",
                   "WMMA 256x256x16 tile, 16 warps, 3 stages (fp16 acc)"),
      W128S2::Info("wmma_128x128_s2_ssmem",
                   "WMMA 128x128x16 tile, double buffer, static smem (the reference's kernel)"),
      W128S3Nopad::Info("wmma_128x128_s3_ssmem_nopad_swz",
                        "as s3_ssmem_swz without smem padding (3x slower: bank conflicts)"),
      W64Unaligned::Info("wmma_64x64_s2_ssmem_unaligned",
                         "fallback: WMMA 64x64x16, guarded scalar loads, any shape and alignment"),
  };
}

}  // namespace hgemm::kernels::internal
