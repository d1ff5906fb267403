// The instantiated members of the TMA + wgmma family (kernels/wgmma_stage.cuh), one line per
// variant, and their host side: tensor maps (cuTensorMapEncodeTiled through
// cudaGetDriverEntryPointByVersion, so nothing links libcuda) cached per (pointer, shape), the
// dynamic-smem opt-in and the persistent grid. Names read
// wgmma_<BM>x<BN>_s<K_STAGE>_g<GROUP_M>.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/launch.cuh"
#include "kernels/variant_lists.h"
#include "kernels/wgmma_stage.cuh"

namespace hgemm::kernels::internal {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 EncodeFn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A row-major fp16 matrix of rows×cols, read in boxes of box_rows×box_cols (box_cols = 64
// halves = one 128-byte swizzle row).
using MapKey = std::tuple<const void*, int, int, int, int>;

std::mutex& MapMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<MapKey, CUtensorMap>& MapCache() {  // guarded by MapMutex()
  static auto* cache = new std::map<MapKey, CUtensorMap>;
  return *cache;
}
constexpr size_t kMaxCachedMaps = 4096;

// The tensor map for the key, from the cache or newly encoded; false if encoding failed.
bool TensorMap(const void* ptr, int rows, int cols, int box_rows, int box_cols, CUtensorMap* out) {
  const MapKey key{ptr, rows, cols, box_rows, box_cols};
  std::lock_guard<std::mutex> lock(MapMutex());
  auto& cache = MapCache();
  if (auto it = cache.find(key); it != cache.end()) {
    *out = it->second;
    return true;
  }
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeFn();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUtensorMap map;
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(ptr), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return false;
  if (cache.size() >= kMaxCachedMaps) cache.clear();
  cache.emplace(key, map);
  *out = map;
  return true;
}

// @tparam BN, CONSUMERS, K_STAGE, GROUP_M  see detail::WgmmaStage.
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M>
struct Wgmma {
  using Cfg = detail::WgmmaStage<BN, CONSUMERS, K_STAGE, GROUP_M>;

  // Both accumulations run the fp32-accumulating kernel (wgmma_stage.cuh says why).
  static cudaError_t Launch(const GemmProblem& p, int /*swizzle_stride*/, cudaStream_t stream) {
    constexpr auto* kernel = &detail::WgmmaGemmKernel<BN, CONSUMERS, K_STAGE, GROUP_M>;
    int device = 0;
    HGEMM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
    HGEMM_RETURN_IF_CUDA_ERROR(detail::OptInDynamicSmem<kernel>(device, Cfg::kSmemBytes));
    CUtensorMap map_a, map_b, map_c;
    if (!TensorMap(p.a, p.m, p.k, Cfg::BM, 64, &map_a) ||
        !TensorMap(p.b, p.k, p.n, 64, 64, &map_b) || !TensorMap(p.c, p.m, p.n, 64, 64, &map_c))
      return cudaErrorInvalidValue;
    int sms = 0;
    HGEMM_RETURN_IF_CUDA_ERROR(detail::SmCount(device, &sms));
    const long long tiles = (long long)((p.m + Cfg::BM - 1) / Cfg::BM) * ((p.n + BN - 1) / BN);
    const int grid = int(std::min<long long>(tiles, sms));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b, map_c, p.m, p.n, p.k);
    return cudaGetLastError();
  }

  // The tile count must fit in int (the kernel's tile index).
  static bool CanImplement(int m, int n, int k) {
    return m >= 1 && n >= 8 && k >= 8 && n % 8 == 0 && k % 8 == 0 &&
           (long long)((m + Cfg::BM - 1) / Cfg::BM) * ((n + BN - 1) / BN) < (1ll << 31);
  }

  static VariantInfo Info(const char* name, const char* description) {
    return VariantInfo{name,
                       description,
                       /*fp16_acc=*/true,
                       /*fp32_acc=*/true,
                       Cfg::kSmemBytes,
                       /*min_sm=*/90,
                       &CanImplement,
                       Vec16Constraints(/*fp16_only=*/false) + "; sm_90",
                       VariantKind::kKernel,
                       /*is_fallback=*/false,
                       /*swizzle_stride=*/0,
                       Cfg::BM,
                       BN,
                       K_STAGE,
                       /*inner=*/"",
                       &Launch};
  }
};

// Kept after H200 runs 4-6 (docs/kernels_notes.md): 128x256 for large outputs, 128x128 where
// 128x256 tiles leave SMs idle, 64x128 for M <= 128.
//                     BN  consumers stages group_m
using W128x256S4    = Wgmma<256, 2, 4, 8>;
using W128x128S6    = Wgmma<128, 2, 6, 8>;
using W64x128S8     = Wgmma<128, 1, 8, 8>;

// sm_90a machine code runs on compute capability 9.0 only. True if a device of that capability
// is visible, or if no device is (so that the registry's contracts stay testable without one).
bool ListOnThisMachine() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the "no device" error
    return true;
  }
  for (int dev = 0; dev < count; ++dev) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
        major == 9 && minor == 0)
      return true;
  }
  return false;
}

}  // namespace

std::vector<VariantInfo> WgmmaVariants() {
  if (!ListOnThisMachine()) return {};
  return {
      W128x256S4::Info("wgmma_128x256_s4_g8", "TMA + wgmma m64n256k16, 2 consumer warpgroups, 4 stages, persistent, TMA-store epilogue"),
      W128x128S6::Info("wgmma_128x128_s6_g8", "TMA + wgmma m64n128k16, 2 consumer warpgroups, 6 stages, persistent, TMA-store epilogue"),
      W64x128S8::Info("wgmma_64x128_s8_g8", "TMA + wgmma m64n128k16, 1 consumer warpgroup, 8 stages, persistent, TMA-store epilogue (small M)"),
  };
}

}  // namespace hgemm::kernels::internal
