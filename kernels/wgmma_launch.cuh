// Host side of one TMA + wgmma kernel instantiation (kernels/wgmma_stage.cuh): its tensor maps,
// the dynamic-smem opt-in and the persistent grid. The instantiations are explicit, one list per
// element type (wgmma_instances_fp16.cu, wgmma_instances_bf16.cu; fp32 C of either in
// wgmma_instances_f32out.cu), so that the registry's
// wgmma_variants.cu compiles none of the kernels; HGEMM_WGMMA_INSTANCES names them all.
//
// Thread safety: LaunchWgmmaGemm, TensorMap and ProblemTensorMaps may be called from any thread;
// LaunchWgmmaGrouped from the thread that owns its LaunchContext.
#ifndef HGEMM_KERNELS_WGMMA_LAUNCH_CUH_
#define HGEMM_KERNELS_WGMMA_LAUNCH_CUH_

#include <cuda.h>  // CUtensorMap (the type only: nothing links libcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"
#include "kernels/registry.h"
#include "kernels/stream_k.h"
#include "kernels/wgmma_stage.cuh"

namespace hgemm::kernels::internal {

// The tensor map of `batch` row-major matrices of rows×cols elements of `type` (fp16, bf16 or
// fp32) whose rows lie `ld` elements apart and whose items lie `item_stride` elements apart (a
// 3-D map, the item outermost), read in boxes of box_rows×box_cols of one item (box_cols × the
// element size = 128 bytes, one swizzle row), 128-byte swizzle; from a process-wide cache or
// newly encoded (wgmma_variants.cu). Returns false if encoding failed.
bool TensorMap(const void* ptr, int rows, int cols, int ld, int batch, int64_t item_stride,
               int box_rows, int box_cols, CUtensorMapDataType type, CUtensorMap* out);

// A, B, C and C_in's tensor maps of `p` as WgmmaGemmKernel<BN, ...> reads them (its A boxes BM
// rows, B boxes BN; 64 along K; C_in as C, at p.c_in, where p.beta != 0, else a copy of C's
// map, which the kernel then never reads through), over `batch` items StridesOf(p) apart:
// p.batch for one launch of the batch, 1 for one problem of a group. Returns false if one could
// not be encoded.
// @tparam BM  the kernel's row block tile (WgmmaStage::BM, 64 · CONSUMERS).
// @tparam BN, TRANS_A, TRANS_B, T, TC  see detail::WgmmaGemmKernel.
template <int BM, int BN, bool TRANS_A, bool TRANS_B, typename T, typename TC>
bool ProblemTensorMaps(const GemmProblem& p, int batch, CUtensorMap* a, CUtensorMap* b,
                       CUtensorMap* c, CUtensorMap* c_in) {
  constexpr bool kFp32Out = std::is_same_v<TC, float>;
  constexpr CUtensorMapDataType kType = std::is_same_v<T, __nv_bfloat16>
                                            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // Stored extents: A is m×k (k×m transposed), B k×n (n×k transposed), C m×n.
  const int a_rows = TRANS_A ? p.k : p.m, a_cols = TRANS_A ? p.m : p.k;
  const int b_rows = TRANS_B ? p.n : p.k, b_cols = TRANS_B ? p.k : p.n;
  const BatchStrides strides = StridesOf(p);
  // C_in shares C's shape, row stride, item stride and boxes.
  auto c_map = [&](const void* ptr, CUtensorMap* out) {
    return TensorMap(ptr, p.m, p.n, p.ldc ? p.ldc : p.n, batch, strides.c, 64, kFp32Out ? 32 : 64,
                     kFp32Out ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : kType, out);
  };
  if (!TensorMap(p.a, a_rows, a_cols, p.lda ? p.lda : a_cols, batch, strides.a, TRANS_A ? 64 : BM,
                 64, kType, a) ||
      !TensorMap(p.b, b_rows, b_cols, p.ldb ? p.ldb : b_cols, batch, strides.b, TRANS_B ? BN : 64,
                 64, kType, b) ||
      !c_map(p.c, c))
    return false;
  if (p.beta == 0.0f) {
    *c_in = *c;
    return true;
  }
  return c_map(p.c_in, c_in);
}

// Enqueues C = p.alpha·op(A)·op(B) + p.beta·C_in with WgmmaGemmKernel<...> on `stream`: one
// launch for the whole batch; with CLUSTER_M = 2, in clusters of two blocks sharing B (as many
// as fit at once: cudaOccupancyMaxActiveClusters).
// REQUIRES: CheckProblem passed for a wgmma variant of this configuration, p.transpose_a ==
// TRANS_A, p.transpose_b == TRANS_B, p.ab_type the type T and p.c_type TC. Returns the CUDA
// error (cudaErrorInvalidValue if a tensor map could not be encoded).
// @tparam BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC, CLUSTER_M  see
//         detail::WgmmaGemmKernel.
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M, bool TRANS_A, bool TRANS_B, typename T,
          typename TC, int CLUSTER_M = 1>
cudaError_t LaunchWgmmaGemm(const GemmProblem& p, cudaStream_t stream) {
  using Cfg = detail::WgmmaStage<BN, CONSUMERS, K_STAGE, GROUP_M>;
  constexpr auto* kernel =
      &detail::WgmmaGemmKernel<BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC, CLUSTER_M>;
  int device = 0;
  HGEMM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  HGEMM_RETURN_IF_CUDA_ERROR(detail::OptInDynamicSmem<kernel>(device, Cfg::kSmemBytes));
  CUtensorMap map_a, map_b, map_c, map_c_in;
  // In a cluster each block loads half of B's tile: a TRANS_B box of BN / 2 rows.
  if (!ProblemTensorMaps<Cfg::BM, BN / CLUSTER_M, TRANS_A, TRANS_B, T, TC>(
          p, p.batch, &map_a, &map_b, &map_c, &map_c_in))
    return cudaErrorInvalidValue;
  const long long tile_rows = (p.m + Cfg::BM - 1) / Cfg::BM;
  if constexpr (CLUSTER_M > 1) {
    // The kernel's units: pairs of tile rows × tile columns × items.
    const long long units =
        (tile_rows + CLUSTER_M - 1) / CLUSTER_M * ((p.n + BN - 1) / BN) * p.batch;
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = CLUSTER_M;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(CLUSTER_M);
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    // Per device and kernel, as SmCount: the query is host time inside every launch otherwise.
    static std::atomic<int> max_clusters[64] = {};
    int clusters = device < 64 ? max_clusters[device].load(std::memory_order_relaxed) : 0;
    if (clusters < 1) {
      HGEMM_RETURN_IF_CUDA_ERROR(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
      if (clusters < 1) return cudaErrorInvalidConfiguration;
      if (device < 64) max_clusters[device].store(clusters, std::memory_order_relaxed);
    }
    config.gridDim = dim3(unsigned(std::min<long long>(units, clusters)) * CLUSTER_M);
    return cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_c, map_c_in, p.m, p.n, p.k,
                              int(units), static_cast<const detail::GroupProblem*>(nullptr), 0,
                              p.alpha, p.beta, detail::StreamKTail{});
  } else {
    int sms = 0;
    HGEMM_RETURN_IF_CUDA_ERROR(detail::SmCount(device, &sms));
    const long long tiles = tile_rows * ((p.n + BN - 1) / BN) * p.batch;
    const int grid = int(std::min<long long>(tiles, sms));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
        map_a, map_b, map_c, map_c_in, p.m, p.n, p.k, int(tiles), nullptr, 0, p.alpha, p.beta,
        detail::StreamKTail{});
    return cudaGetLastError();
  }
}

// Enqueues C = p.alpha·op(A)·op(B) + p.beta·C_in with WgmmaGemmKernel<..., STREAM_K = true> on
// ctx's stream: one block per SM runs the whole waves of tiles, and the tiles of a last,
// partial wave are cut along K over the blocks (kernels/stream_k.h), their sums meeting in
// ctx's kStreamKScratch (2 slots of BM·BN floats per block sharing them, and a counter per
// tile and consumer, zeroed on the stream first). Without such a tail it is the plain kernel's
// launch. Returns "" or the error. REQUIRES: as LaunchWgmmaGemm.
// @tparam BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC  see detail::WgmmaGemmKernel.
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M, bool TRANS_A, bool TRANS_B, typename T,
          typename TC>
std::string LaunchWgmmaStreamK(const GemmProblem& p, LaunchContext& ctx) {
  using Cfg = detail::WgmmaStage<BN, CONSUMERS, K_STAGE, GROUP_M>;
  constexpr auto* kernel = &detail::WgmmaGemmKernel<BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A,
                                                    TRANS_B, T, TC, /*CLUSTER_M=*/1, true>;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return CudaErrorText("cudaGetDevice", e);
  if (cudaError_t e = detail::OptInDynamicSmem<kernel>(device, Cfg::kSmemBytes); e != cudaSuccess)
    return CudaErrorText("shared memory opt-in", e);
  CUtensorMap map_a, map_b, map_c, map_c_in;
  if (!ProblemTensorMaps<Cfg::BM, BN, TRANS_A, TRANS_B, T, TC>(p, p.batch, &map_a, &map_b, &map_c,
                                                               &map_c_in))
    return "a tensor map could not be encoded";
  int sms = 0;
  if (cudaError_t e = detail::SmCount(device, &sms); e != cudaSuccess)
    return CudaErrorText("SM count", e);
  const long long tiles =
      (long long)((p.m + Cfg::BM - 1) / Cfg::BM) * ((p.n + BN - 1) / BN) * p.batch;
  const StreamKPlan plan = PlanStreamK(tiles, (p.k + Cfg::BK - 1) / Cfg::BK, sms);
  detail::StreamKTail tail;
  tail.split = plan.split;
  if (plan.split.tail_tiles > 0) {
    const size_t partial_bytes = size_t(plan.split.tail_blocks) * 2 * Cfg::BM * BN * sizeof(float);
    const size_t counter_bytes = size_t(plan.split.tail_tiles) * CONSUMERS * sizeof(int);
    std::string error;
    auto* scratch = static_cast<char*>(
        ctx.Scratch(LaunchContext::kStreamKScratch, partial_bytes + counter_bytes, &error));
    if (scratch == nullptr) return error;
    tail.partials = reinterpret_cast<float*>(scratch);
    tail.counters = reinterpret_cast<int*>(scratch + partial_bytes);
    if (cudaError_t e = cudaMemsetAsync(tail.counters, 0, counter_bytes, ctx.stream());
        e != cudaSuccess)
      return CudaErrorText("zeroing the stream-K counters", e);
  }
  kernel<<<plan.grid, Cfg::kThreads, Cfg::kSmemBytes, ctx.stream()>>>(
      map_a, map_b, map_c, map_c_in, p.m, p.n, p.k, int(plan.whole_tiles), nullptr, 0, p.alpha,
      p.beta, tail);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return CudaErrorText("stream-K launch", e);
  return "";
}

// Enqueues a group of GEMMs of different shapes (one layout and type pair: TRANS_A, TRANS_B, T,
// TC) as one launch of WgmmaGemmKernel<...> on ctx's stream: each problem's tensor maps and
// shape go into a device array in ctx's kGroupScratch (copied on the stream; the kernel reads
// it). Returns "" or the error. REQUIRES: CheckProblem passed for every problem (batch 1) on a
// wgmma variant of this configuration, and all of them have this layout, these types and one
// alpha and beta (kernel arguments; each problem has its own C_in).
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M, bool TRANS_A, bool TRANS_B, typename T,
          typename TC>
std::string LaunchWgmmaGrouped(const std::vector<GemmProblem>& problems, LaunchContext& ctx) {
  using Cfg = detail::WgmmaStage<BN, CONSUMERS, K_STAGE, GROUP_M>;
  constexpr auto* kernel =
      &detail::WgmmaGemmKernel<BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC>;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return CudaErrorText("cudaGetDevice", e);
  if (cudaError_t e = detail::OptInDynamicSmem<kernel>(device, Cfg::kSmemBytes); e != cudaSuccess)
    return CudaErrorText("shared memory opt-in", e);
  std::vector<detail::GroupProblem> host(problems.size());
  long long tiles = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    const GemmProblem& p = problems[i];
    detail::GroupProblem& g = host[i];
    if (p.alpha != problems.front().alpha || p.beta != problems.front().beta)
      return "problem " + std::to_string(i) + ": one launch takes one alpha and beta";
    if (!ProblemTensorMaps<Cfg::BM, BN, TRANS_A, TRANS_B, T, TC>(p, 1, &g.a, &g.b, &g.c, &g.c_in))
      return "problem " + std::to_string(i) + ": a tensor map could not be encoded";
    g.m = p.m;
    g.n = p.n;
    g.k = p.k;
    g.first_tile = int(tiles);
    tiles += (long long)((p.m + Cfg::BM - 1) / Cfg::BM) * ((p.n + BN - 1) / BN);
    if (tiles >= (1ll << 31)) return "the group's tiles reach 2^31 (the kernel's tile index)";
  }
  std::string error;
  const size_t bytes = host.size() * sizeof(detail::GroupProblem);
  auto* device_group =
      static_cast<detail::GroupProblem*>(ctx.Scratch(LaunchContext::kGroupScratch, bytes, &error));
  if (device_group == nullptr) return error;
  // From pageable memory: returns once `host` has been staged; ordered before the kernel.
  if (cudaError_t e =
          cudaMemcpyAsync(device_group, host.data(), bytes, cudaMemcpyHostToDevice, ctx.stream());
      e != cudaSuccess)
    return CudaErrorText("copying the group's tensor maps", e);
  int sms = 0;
  if (cudaError_t e = detail::SmCount(device, &sms); e != cudaSuccess)
    return CudaErrorText("SM count", e);
  const int grid = int(std::min<long long>(tiles, sms));
  // The grid-constant maps are unused in a group: any valid map fills them.
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, ctx.stream()>>>(
      host[0].a, host[0].b, host[0].c, host[0].c_in, 0, 0, 0, int(tiles), device_group,
      int(host.size()), problems.front().alpha, problems.front().beta, detail::StreamKTail{});
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return CudaErrorText("grouped launch", e);
  return "";
}

// Every instantiation, as X(BN, CONSUMERS, K_STAGE, GROUP_M, TRANS_A, TRANS_B, T, TC): the kept
// configurations (wgmma_variants.cu) × the four layouts, for one input type T and C type TC.
#define HGEMM_WGMMA_LAYOUTS(X, BN, CONSUMERS, K_STAGE, GROUP_M, T, TC) \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, false, false, T, TC)              \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, false, true, T, TC)               \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, true, false, T, TC)               \
  X(BN, CONSUMERS, K_STAGE, GROUP_M, true, true, T, TC)
#define HGEMM_WGMMA_INSTANCES(X, T, TC)       \
  HGEMM_WGMMA_LAYOUTS(X, 256, 2, 4, 8, T, TC) \
  HGEMM_WGMMA_LAYOUTS(X, 128, 2, 6, 8, T, TC) \
  HGEMM_WGMMA_LAYOUTS(X, 128, 1, 8, 8, T, TC)

#define HGEMM_WGMMA_EXTERN(BN, C, S, G, TA, TB, T, TC)                                        \
  extern template cudaError_t LaunchWgmmaGemm<BN, C, S, G, TA, TB, T, TC>(const GemmProblem&, \
                                                                          cudaStream_t);      \
  extern template std::string LaunchWgmmaGrouped<BN, C, S, G, TA, TB, T, TC>(                 \
      const std::vector<GemmProblem>&, LaunchContext&);
#define HGEMM_WGMMA_INSTANTIATE(BN, C, S, G, TA, TB, T, TC)                            \
  template cudaError_t LaunchWgmmaGemm<BN, C, S, G, TA, TB, T, TC>(const GemmProblem&, \
                                                                   cudaStream_t);      \
  template std::string LaunchWgmmaGrouped<BN, C, S, G, TA, TB, T, TC>(                 \
      const std::vector<GemmProblem>&, LaunchContext&);

HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __half, __half)
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __nv_bfloat16, __nv_bfloat16)
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __half, float)
HGEMM_WGMMA_INSTANCES(HGEMM_WGMMA_EXTERN, __nv_bfloat16, float)

// The cluster-pair configuration (CLUSTER_M = 2; wgmma_cluster_instances.cu), experimental: the
// 128×256 tile, C of the input type only, no groups (each costs 8 kernels of nvcc time).
#define HGEMM_WGMMA_CLUSTER_INSTANCES(X, T) \
  X(256, 2, 4, 4, false, false, T, T, 2)    \
  X(256, 2, 4, 4, false, true, T, T, 2)     \
  X(256, 2, 4, 4, true, false, T, T, 2)     \
  X(256, 2, 4, 4, true, true, T, T, 2)
#define HGEMM_WGMMA_CLUSTER_EXTERN(BN, C, S, G, TA, TB, T, TC, CM)                                \
  extern template cudaError_t LaunchWgmmaGemm<BN, C, S, G, TA, TB, T, TC, CM>(const GemmProblem&, \
                                                                              cudaStream_t);
#define HGEMM_WGMMA_CLUSTER_INSTANTIATE(BN, C, S, G, TA, TB, T, TC, CM)                    \
  template cudaError_t LaunchWgmmaGemm<BN, C, S, G, TA, TB, T, TC, CM>(const GemmProblem&, \
                                                                       cudaStream_t);
HGEMM_WGMMA_CLUSTER_INSTANCES(HGEMM_WGMMA_CLUSTER_EXTERN, __half)
HGEMM_WGMMA_CLUSTER_INSTANCES(HGEMM_WGMMA_CLUSTER_EXTERN, __nv_bfloat16)

// The stream-K configuration (wgmma_streamk_instances.cu), experimental: the 128×256 tile, C of
// the input type only.
#define HGEMM_WGMMA_STREAMK_INSTANCES(X, T) HGEMM_WGMMA_LAYOUTS(X, 256, 2, 4, 8, T, T)
#define HGEMM_WGMMA_STREAMK_EXTERN(BN, C, S, G, TA, TB, T, TC)                                   \
  extern template std::string LaunchWgmmaStreamK<BN, C, S, G, TA, TB, T, TC>(const GemmProblem&, \
                                                                             LaunchContext&);
#define HGEMM_WGMMA_STREAMK_INSTANTIATE(BN, C, S, G, TA, TB, T, TC)                       \
  template std::string LaunchWgmmaStreamK<BN, C, S, G, TA, TB, T, TC>(const GemmProblem&, \
                                                                      LaunchContext&);
HGEMM_WGMMA_STREAMK_INSTANCES(HGEMM_WGMMA_STREAMK_EXTERN, __half)
HGEMM_WGMMA_STREAMK_INSTANCES(HGEMM_WGMMA_STREAMK_EXTERN, __nv_bfloat16)

}  // namespace hgemm::kernels::internal

#endif  // HGEMM_KERNELS_WGMMA_LAUNCH_CUH_
