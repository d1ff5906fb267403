// The instantiated members of the TMA + wgmma family (kernels/wgmma_stage.cuh), one line per
// variant, and their host side: tensor maps (cuTensorMapEncodeTiled through
// cudaGetDriverEntryPointByVersion, so nothing links libcuda) cached per (pointer, shape), the
// dynamic-smem opt-in and the persistent grid. Names read
// wgmma_<BM>x<BN>_s<K_STAGE>[_c<CLUSTER>]_g<GROUP_M>[_ts] (_ts: TMA-store epilogue).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

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

// @tparam BN, CONSUMERS, K_STAGE, CLUSTER, GROUP_M, TMA_STORE  see detail::WgmmaStage.
template <int BN, int CONSUMERS, int K_STAGE, int CLUSTER, int GROUP_M, bool TMA_STORE,
          int EXP = 0>
struct Wgmma {
  using Cfg = detail::WgmmaStage<BN, CONSUMERS, K_STAGE, CLUSTER, GROUP_M, TMA_STORE, EXP>;

  // Blocks of the persistent grid on the current device: one per SM, or as many whole
  // clusters as fit at once (a GPC's SMs may not all pair up). Cached per device.
  static cudaError_t GridBlocks(int device, int* blocks) {
    static std::atomic<int> cached[64] = {};
    if (device < 64 && cached[device].load(std::memory_order_relaxed) > 0) {
      *blocks = cached[device].load(std::memory_order_relaxed);
      return cudaSuccess;
    }
    int n = 0;
    if (cudaError_t e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
        e != cudaSuccess)
      return e;
    if constexpr (CLUSTER > 1) {
      cudaLaunchConfig_t config = {};
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = CLUSTER;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      config.gridDim = dim3(n / CLUSTER * CLUSTER);
      config.blockDim = dim3(Cfg::kThreads);
      config.dynamicSmemBytes = Cfg::kSmemBytes;
      config.attrs = &attr;
      config.numAttrs = 1;
      int clusters = 0;
      if (cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, Kernel(), &config);
          e != cudaSuccess)
        return e;
      if (clusters <= 0) return cudaErrorInvalidConfiguration;
      n = std::min(n / CLUSTER, clusters) * CLUSTER;
    }
    if (device < 64) cached[device].store(n, std::memory_order_relaxed);
    *blocks = n;
    return cudaSuccess;
  }

  static auto Kernel() {
    return detail::WgmmaGemmKernel<BN, CONSUMERS, K_STAGE, CLUSTER, GROUP_M, TMA_STORE, EXP>;
  }

  // Both accumulations run the fp32-accumulating kernel (wgmma_stage.cuh says why).
  static cudaError_t Launch(const GemmProblem& p, int /*swizzle_stride*/, cudaStream_t stream) {
    auto kernel = Kernel();
    static std::atomic<uint64_t> opted_in{0};  // devices with the > 48 KB opt-in done
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
    if (bit == 0 || !(opted_in.load(std::memory_order_acquire) & bit)) {
      cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Cfg::kSmemBytes));
      if (e != cudaSuccess) return e;
      opted_in.fetch_or(bit, std::memory_order_acq_rel);
    }
    CUtensorMap map_a, map_b, map_c{};
    if (!TensorMap(p.a, p.m, p.k, Cfg::BM, 64, &map_a) || !TensorMap(p.b, p.k, p.n, 64, 64, &map_b))
      return cudaErrorInvalidValue;
    if (TMA_STORE && !TensorMap(p.c, p.m, p.n, 64, 64, &map_c)) return cudaErrorInvalidValue;
    int blocks = 0;
    if (cudaError_t e = GridBlocks(device, &blocks); e != cudaSuccess) return e;
    const long long tiles_m = (p.m + Cfg::BM - 1) / Cfg::BM;
    const long long units = (tiles_m + CLUSTER - 1) / CLUSTER * ((p.n + BN - 1) / BN);
    const int grid = int(std::min<long long>(units * CLUSTER, blocks));
    if constexpr (CLUSTER > 1) {
      cudaLaunchConfig_t config = {};
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = CLUSTER;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      config.gridDim = dim3(grid);
      config.blockDim = dim3(Cfg::kThreads);
      config.dynamicSmemBytes = Cfg::kSmemBytes;
      config.stream = stream;
      config.attrs = &attr;
      config.numAttrs = 1;
      return cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_c, p.c, p.m, p.n, p.k);
    }
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b, map_c, p.c, p.m, p.n,
                                                             p.k);
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
                       "n % 8 == 0, k % 8 == 0, 16-byte aligned a, b, c; sm_90",
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

// Cluster experiment (docs/kernels_notes.md run 8): the TMA-store 128x256 kernel alone, in
// clusters of 2 with EXP knobs: 1 test_wait polling, 2 relaxed remote arrive, 4 no multicast.
//                         BN  consumers stages cluster group_m tma_store exp
using W128x256          = Wgmma<256, 2, 4, 1, 8, true>;
using W128x256C2        = Wgmma<256, 2, 4, 2, 8, true, 0>;
using W128x256C2Spin    = Wgmma<256, 2, 4, 2, 8, true, 1>;
using W128x256C2Relax   = Wgmma<256, 2, 4, 2, 8, true, 2>;
using W128x256C2NoMc    = Wgmma<256, 2, 4, 2, 8, true, 4>;
using W128x128          = Wgmma<128, 2, 6, 1, 8, true>;
using W64x128           = Wgmma<128, 1, 8, 1, 8, true>;

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
      W128x256::Info("wgmma_128x256_s4_g8", "TMA + wgmma m64n256k16, 2 consumer warpgroups, 4 stages, persistent, TMA-store epilogue"),
      W128x128::Info("wgmma_128x128_s6_g8", "TMA + wgmma m64n128k16, 2 consumer warpgroups, 6 stages, persistent, TMA-store epilogue"),
      W64x128::Info("wgmma_64x128_s8_g8", "TMA + wgmma m64n128k16, 1 consumer warpgroup, 8 stages, persistent, TMA-store epilogue (small M)"),
      W128x256C2::Info("wgmma_128x256_s4_c2_g8", "experiment: clusters of 2, B multicast"),
      W128x256C2Spin::Info("wgmma_128x256_s4_c2_g8_spin", "experiment: clusters of 2, B multicast, test_wait polling"),
      W128x256C2Relax::Info("wgmma_128x256_s4_c2_g8_relax", "experiment: clusters of 2, B multicast, relaxed remote arrive"),
      W128x256C2NoMc::Info("wgmma_128x256_s4_c2_g8_nomc", "experiment: clusters of 2, cross-block releases, no multicast"),
  };
}

}  // namespace hgemm::kernels::internal
