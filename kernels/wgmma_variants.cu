// The members of the TMA + wgmma family (kernels/wgmma_stage.cuh), one line per variant, and
// their host side: the dispatch of a problem's layout and element type to the instantiation
// (kernels/wgmma_launch.cuh; compiled in wgmma_instances_*.cu) and the tensor maps
// (cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion, so nothing links libcuda)
// cached per (pointer, shape, strides, batch, box, type). Names read
// wgmma_<BM>x<BN>_s<K_STAGE>_g<GROUP_M>; each variant takes the four layouts (NN, NT, TN, TT), fp16
// or bf16 (C of the input type or fp32), and a strided batch or a group of shapes in one launch.
// wgmma_pp_<BM>x<BN>_... are the ping-pong kernels (wgmma_pingpong.cuh; BM×BN is each consumer's
// tile): the same forms and batches, a group as one launch per problem, experimental (not in auto)
// until measured. A _cluster2 suffix: clusters of two blocks along M sharing B (wgmma_stage.cuh,
// CLUSTER_M), C of the input type only, a group as one launch per problem, experimental. A _sk
// suffix: a stream-K tail (STREAM_K), C of the input type only, experimental.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/launch.cuh"
#include "kernels/variant_lists.h"
#include "kernels/wgmma_launch.cuh"
#include "kernels/wgmma_pingpong_launch.cuh"

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

// TensorMap's arguments: pointer, rows, cols, ld, batch, item stride, box rows, box cols, type.
using MapKey = std::tuple<const void*, int, int, int, int, int64_t, int, int, int>;

std::mutex& MapMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<MapKey, CUtensorMap>& MapCache() {  // guarded by MapMutex()
  static auto* cache = new std::map<MapKey, CUtensorMap>;
  return *cache;
}
constexpr size_t kMaxCachedMaps = 4096;

}  // namespace

bool TensorMap(const void* ptr, int rows, int cols, int ld, int batch, int64_t item_stride,
               int box_rows, int box_cols, CUtensorMapDataType type, CUtensorMap* out) {
  const MapKey key{ptr, rows, cols, ld, batch, item_stride, box_rows, box_cols, int(type)};
  std::lock_guard<std::mutex> lock(MapMutex());
  auto& cache = MapCache();
  if (auto it = cache.find(key); it != cache.end()) {
    *out = it->second;
    return true;
  }
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeFn();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(batch)};
  const cuuint64_t elem_bytes = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 2;
  const cuuint64_t strides[2] = {cuuint64_t(ld) * elem_bytes, cuuint64_t(item_stride) * elem_bytes};
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  CUtensorMap map;
  if (encode(&map, type, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return false;
  if (cache.size() >= kMaxCachedMaps) cache.clear();
  cache.emplace(key, map);
  *out = map;
  return true;
}

namespace {

// @tparam BN, CONSUMERS, K_STAGE, GROUP_M  see detail::WgmmaStage.
// @tparam CLUSTER_M  see detail::WgmmaGemmKernel: 2 is instantiated for C of the input type
//                    only and runs a group as one launch per problem.
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M, int CLUSTER_M = 1>
struct Wgmma {
  using Cfg = detail::WgmmaStage<BN, CONSUMERS, K_STAGE, GROUP_M>;

  // Both accumulations run the fp32-accumulating kernel (wgmma_stage.cuh says why).
  template <typename T, typename TC>
  static cudaError_t Run(const GemmProblem& p, cudaStream_t stream) {
    constexpr int G = GROUP_M, CM = CLUSTER_M;
    if (p.transpose_a)
      return p.transpose_b
                 ? LaunchWgmmaGemm<BN, CONSUMERS, K_STAGE, G, true, true, T, TC, CM>(p, stream)
                 : LaunchWgmmaGemm<BN, CONSUMERS, K_STAGE, G, true, false, T, TC, CM>(p, stream);
    return p.transpose_b
               ? LaunchWgmmaGemm<BN, CONSUMERS, K_STAGE, G, false, true, T, TC, CM>(p, stream)
               : LaunchWgmmaGemm<BN, CONSUMERS, K_STAGE, G, false, false, T, TC, CM>(p, stream);
  }
  static cudaError_t Launch(const GemmProblem& p, int /*swizzle_stride*/, cudaStream_t stream) {
    const bool fp32_c = p.c_type == DataType::kFp32;
    if constexpr (CLUSTER_M > 1) {  // Info's types: C of the input type
      if (fp32_c) return cudaErrorNotSupported;
      return p.ab_type == DataType::kBf16 ? Run<__nv_bfloat16, __nv_bfloat16>(p, stream)
                                          : Run<__half, __half>(p, stream);
    } else {
      if (p.ab_type == DataType::kBf16)
        return fp32_c ? Run<__nv_bfloat16, float>(p, stream)
                      : Run<__nv_bfloat16, __nv_bfloat16>(p, stream);
      return fp32_c ? Run<__half, float>(p, stream) : Run<__half, __half>(p, stream);
    }
  }

  template <typename T, typename TC>
  static std::string RunGrouped(const std::vector<GemmProblem>& ps, LaunchContext& ctx) {
    const GemmProblem& p = ps.front();
    if (p.transpose_a)
      return p.transpose_b
                 ? LaunchWgmmaGrouped<BN, CONSUMERS, K_STAGE, GROUP_M, true, true, T, TC>(ps, ctx)
                 : LaunchWgmmaGrouped<BN, CONSUMERS, K_STAGE, GROUP_M, true, false, T, TC>(ps, ctx);
    return p.transpose_b
               ? LaunchWgmmaGrouped<BN, CONSUMERS, K_STAGE, GROUP_M, false, true, T, TC>(ps, ctx)
               : LaunchWgmmaGrouped<BN, CONSUMERS, K_STAGE, GROUP_M, false, false, T, TC>(ps, ctx);
  }
  // The registry passes problems of one layout and type pair (the first's).
  static std::string LaunchGrouped(const std::vector<GemmProblem>& ps, LaunchContext& ctx) {
    const bool fp32_c = ps.front().c_type == DataType::kFp32;
    if (ps.front().ab_type == DataType::kBf16)
      return fp32_c ? RunGrouped<__nv_bfloat16, float>(ps, ctx)
                    : RunGrouped<__nv_bfloat16, __nv_bfloat16>(ps, ctx);
    return fp32_c ? RunGrouped<__half, float>(ps, ctx) : RunGrouped<__half, __half>(ps, ctx);
  }

  // The tile count must fit in int (the kernel's tile index).
  static bool CanImplement(int m, int n, int k) {
    return m >= 1 && n >= 8 && k >= 8 && n % 8 == 0 && k % 8 == 0 &&
           (long long)((m + Cfg::BM - 1) / Cfg::BM) * ((n + BN - 1) / BN) < (1ll << 31);
  }

  // TMA's global row strides are 16-byte multiples: a transposed A's stored rows are m long.
  static std::string CheckLayout(const GemmProblem& p) {
    if (p.transpose_a && p.m % 8 != 0)
      return "transpose_a needs m % 8 == 0 (A is stored k×m; TMA row strides are 16-byte "
             "multiples), got m = " +
             std::to_string(p.m);
    for (auto [name, ld] :
         {std::pair{"lda", p.lda}, std::pair{"ldb", p.ldb}, std::pair{"ldc", p.ldc}})
      if (ld % 8 != 0)
        return std::string(name) + " must be a multiple of 8 (16-byte TMA row strides), got " +
               std::to_string(ld);
    if (p.batch > 1) {
      // The item is the tensor maps' outermost dimension: its stride obeys TMA's stride rules.
      const BatchStrides s = StridesOf(p);
      const int64_t c_bytes = int64_t(DataTypeBytes(p.c_type));
      for (auto [name, stride, bytes] :
           {std::tuple{"stride_a", s.a, int64_t(2)}, std::tuple{"stride_b", s.b, int64_t(2)},
            std::tuple{"stride_c", s.c, c_bytes}}) {
        if (stride % 8 != 0)
          return std::string(name) + " must be a multiple of 8 (16-byte TMA strides), got " +
                 std::to_string(stride);
        if (stride >= (int64_t(1) << 40) / bytes)
          return std::string(name) + " " + std::to_string(stride) +
                 " reaches 2^40 bytes, TMA's largest stride";
      }
      const long long tiles = (long long)((p.m + Cfg::BM - 1) / Cfg::BM) * ((p.n + BN - 1) / BN);
      if (tiles * p.batch >= (1ll << 31))
        return "batch " + std::to_string(p.batch) + " × " + std::to_string(tiles) +
               " tiles reaches 2^31 (the kernel's tile index)";
    }
    return "";
  }

  static VariantInfo Info(const char* name, const char* description) {
    VariantInfo v{name,
                  description,
                  /*fp16_acc=*/true,
                  /*fp32_acc=*/true,
                  Cfg::kSmemBytes,
                  /*min_sm=*/90,
                  &CanImplement,
                  Vec16Constraints(/*fp16_only=*/false) +
                      "; m % 8 == 0 if transpose_a; lda, ldb, ldc % 8 == 0; batch strides "
                      "% 8 == 0; sm_90",
                  VariantKind::kKernel,
                  /*is_fallback=*/false,
                  /*swizzle_stride=*/0,
                  Cfg::BM,
                  BN,
                  K_STAGE,
                  /*inner=*/"",
                  &Launch,
                  kAllLayouts,
                  kAllTypes,
                  /*strided=*/true,
                  &CheckLayout,
                  /*batched=*/true,
                  /*launch_grouped=*/nullptr,
                  /*split_k=*/0,
                  /*fused_scale=*/true};
    if constexpr (CLUSTER_M > 1) {
      v.types =
          TypesBit(DataType::kFp16, DataType::kFp16) | TypesBit(DataType::kBf16, DataType::kBf16);
      v.experimental = true;
    } else {
      v.launch_grouped = &LaunchGrouped;
    }
    return v;
  }
};

// The stream-K tail (wgmma_stage.cuh, STREAM_K; kernels/stream_k.h) on a configuration's tile:
// the plain kernel's shape rules, its launch through the LaunchContext (the tail's scratch), C
// of the input type only; a group runs as the plain kernel's one launch. Experimental.
// @tparam BN, CONSUMERS, K_STAGE, GROUP_M  see detail::WgmmaStage.
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M>
struct WgmmaSk {
  using Plain = Wgmma<BN, CONSUMERS, K_STAGE, GROUP_M>;

  template <typename T>
  static std::string Run(const GemmProblem& p, LaunchContext& ctx) {
    constexpr int C = CONSUMERS, S = K_STAGE, G = GROUP_M;
    if (p.transpose_a)
      return p.transpose_b ? LaunchWgmmaStreamK<BN, C, S, G, true, true, T, T>(p, ctx)
                           : LaunchWgmmaStreamK<BN, C, S, G, true, false, T, T>(p, ctx);
    return p.transpose_b ? LaunchWgmmaStreamK<BN, C, S, G, false, true, T, T>(p, ctx)
                         : LaunchWgmmaStreamK<BN, C, S, G, false, false, T, T>(p, ctx);
  }
  static std::string Launch(const GemmProblem& p, LaunchContext& ctx) {
    if (p.c_type != p.ab_type) return "C of the input type only";  // Info's types
    return p.ab_type == DataType::kBf16 ? Run<__nv_bfloat16>(p, ctx) : Run<__half>(p, ctx);
  }

  static VariantInfo Info(const char* name, const char* description) {
    VariantInfo v = Plain::Info(name, description);
    v.launch = nullptr;
    v.launch_with_context = &Launch;
    v.types =
        TypesBit(DataType::kFp16, DataType::kFp16) | TypesBit(DataType::kBf16, DataType::kBf16);
    v.experimental = true;
    return v;
  }
};

// The ping-pong schedule (kernels/wgmma_pingpong.cuh): each of the two consumer warpgroups
// owns a BM×BN tile. The shape rules are the cooperative kernel's of the same output tile
// (Wgmma<BN, 2, ...>: BM = 128); a group runs as a loop of launches (launch_grouped nullptr).
// Experimental: explicit requests only, until an H200 run has measured it.
// @tparam BN, K_STAGE, GROUP_M  see detail::WgmmaPingpong.
template <int BN, int K_STAGE, int GROUP_M>
struct WgmmaPp {
  using Cfg = detail::WgmmaPingpong<BN, K_STAGE, GROUP_M>;
  using SameTile = Wgmma<BN, 2, K_STAGE, GROUP_M>;
  static_assert(SameTile::Cfg::BM == Cfg::BM, "the shape rules are those of the same tile");

  template <typename T, typename TC>
  static cudaError_t Run(const GemmProblem& p, cudaStream_t stream) {
    if (p.transpose_a)
      return p.transpose_b
                 ? LaunchWgmmaPingpong<BN, K_STAGE, GROUP_M, true, true, T, TC>(p, stream)
                 : LaunchWgmmaPingpong<BN, K_STAGE, GROUP_M, true, false, T, TC>(p, stream);
    return p.transpose_b
               ? LaunchWgmmaPingpong<BN, K_STAGE, GROUP_M, false, true, T, TC>(p, stream)
               : LaunchWgmmaPingpong<BN, K_STAGE, GROUP_M, false, false, T, TC>(p, stream);
  }
  static cudaError_t Launch(const GemmProblem& p, int /*swizzle_stride*/, cudaStream_t stream) {
    const bool fp32_c = p.c_type == DataType::kFp32;
    if (p.ab_type == DataType::kBf16)
      return fp32_c ? Run<__nv_bfloat16, float>(p, stream)
                    : Run<__nv_bfloat16, __nv_bfloat16>(p, stream);
    return fp32_c ? Run<__half, float>(p, stream) : Run<__half, __half>(p, stream);
  }

  static VariantInfo Info(const char* name, const char* description) {
    VariantInfo v = SameTile::Info(name, description);
    v.smem_bytes = Cfg::kSmemBytes;
    v.stages = K_STAGE;
    v.launch = &Launch;
    v.launch_grouped = nullptr;
    v.experimental = true;
    v.fused_scale = false;  // its epilogue stores op(A)·op(B) alone; the backend scales after
    return v;
  }
};

// Kept after H200 runs 4-6 (docs/kernels_notes.md): 128x256 for large outputs, 128x128 where
// 128x256 tiles leave SMs idle, 64x128 for M <= 128.
//                     BN  consumers stages group_m
using W128x256S4 = Wgmma<256, 2, 4, 8>;
using W128x128S6 = Wgmma<128, 2, 6, 8>;
using W64x128S8 = Wgmma<128, 1, 8, 8>;
// Clusters of two blocks along M sharing B by multicast (docs/kernels_notes.md, "operand
// traffic from L2"); group_m counts pairs of tile rows. Not yet measured.
//                     BN  consumers stages group_m cluster_m
using W128x256S4C2 = Wgmma<256, 2, 4, 4, 2>;
// The 128x256 tile with a stream-K tail (docs/kernels_notes.md, "stream-K tail"); not yet measured.
using W128x256S4Sk = WgmmaSk<256, 2, 4, 8>;
// Ping-pong, predicted in docs/kernels_notes.md ("Ping-pong consumers"); not yet measured.
//                     BN  stages group_m
using Pp128x128S6 = WgmmaPp<128, 6, 8>;

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
      W128x256S4::Info("wgmma_128x256_s4_g8",
                       "TMA + wgmma m64n256k16, 2 consumer warpgroups, 4 stages, persistent, "
                       "TMA-store epilogue"),
      W128x128S6::Info("wgmma_128x128_s6_g8",
                       "TMA + wgmma m64n128k16, 2 consumer warpgroups, 6 stages, persistent, "
                       "TMA-store epilogue"),
      W64x128S8::Info("wgmma_64x128_s8_g8",
                      "TMA + wgmma m64n128k16, 1 consumer warpgroup, 8 stages, persistent, "
                      "TMA-store epilogue (small M)"),
      W128x256S4C2::Info(
          "wgmma_128x256_s4_g4_cluster2",
          "TMA + wgmma m64n256k16, 2 consumer warpgroups, 4 stages, persistent, TMA-store "
          "epilogue, clusters of 2 blocks along M each loading half of the shared B tile by TMA "
          "multicast; experimental (not in auto until measured on a GPU), C of the input type "
          "only, a group as one launch per problem"),
      W128x256S4Sk::Info(
          "wgmma_128x256_s4_g8_sk",
          "TMA + wgmma m64n256k16, 2 consumer warpgroups, 4 stages, persistent, TMA-store "
          "epilogue; the tiles of a last, partial wave cut along K over all the blocks (stream-K), "
          "their fp32 sums meeting in global memory; experimental (not in auto until measured on a "
          "GPU), C of the input type only"),
      Pp128x128S6::Info(
          "wgmma_pp_128x128_s6_g8",
          "TMA + wgmma m64n128k16, ping-pong: 2 consumer warpgroups with a 128x128 tile each, "
          "taking turns on the tensor cores, 6 stages, persistent, TMA-store epilogue; "
          "experimental (not in auto until measured on a GPU), a group as one launch per problem"),
  };
}

}  // namespace hgemm::kernels::internal
