// skinny_m16: C = op(A)·B for M <= 16 (the skinniest shapes), a kernel built around B's bytes
// rather than around a 64-row wgmma tile. At M <= 16 a GEMM is a stream of B (K·N elements) past
// a few rows of A; the wgmma kernels' 64-row tiles are >= 75 % padding there, and one block per
// 128 columns leaves half the SMs idle (docs/kernels_notes.md, "skinny M at 64–83 % of a
// copy": 64–70 % of the device copy at M <= 16). Here:
//   * each block takes one panel of BN = 128 columns and one slab of K, so that the grid fills
//     one wave of two blocks per SM (split-K across the slabs);
//   * B's tiles (BK = 64 rows of the panel, 16 KiB) and A's (16 x 64) stream through a 6-stage
//     cp.async ring (108 KiB; two blocks per SM: up to 160 KiB of B in flight per SM);
//   * mma.sync.m16n8k16 with A as the 16-row operand (rows past M zero, no further padding) and B
//     from shared memory by ldmatrix (.trans for B stored k x n, plain for B stored n x k: NT);
//   * the slabs' fp32 partials are summed in the same launch: every block writes its partial to
//     scratch, and the last block of a panel to arrive (a counter per panel) adds them up and
//     writes C (in A's type, or fp32). One slab writes C directly.
// Layouts NN and NT (A as stored, m x k), fp16 or bf16 in, fp32 accumulation, packed operands;
// alpha/beta are the backend's separate epilogue (not fused). Predicted 3.5–3.7 TB/s of B at
// 8192 x 8192 on the H200; measured on an H100: right, and
// at the memory's bound with cuBLAS and the 64x128 wgmma kernel (2.3–2.55 TB/s of a 2.96 TB/s
// copy): ahead of that kernel at M = 1 (+7–13 %), behind it on NT at M = 8–16, so auto decides.
//
// Thread safety: Launch may be called from any thread; its LaunchContext belongs to one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cp_async.cuh"
#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"
#include "kernels/mma_stage.cuh"
#include "kernels/registry.h"
#include "kernels/variant_lists.h"

namespace hgemm::kernels::internal {
namespace {

using detail::CpAsync16ZeroFill;
using detail::CpAsyncCommit;
using detail::CpAsyncWait;
using detail::DivCeil;
using detail::kWarpSize;
using detail::LdMatrixX4;
using detail::LdMatrixX4Trans;
using detail::MmaAcc;
using detail::SmemAddr;
using detail::SwizzledChunk;

constexpr int kMaxM = 16;  // one mma.sync row tile
constexpr int kBN = 128;   // columns per block: 4 warps of 32
constexpr int kBK = 64;    // K rows per stage
constexpr int kStages = 6;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kBlocksPerSm = 2;
// Bytes of one stage: A's 16 x 64 tile, then B's 64 x 128 (NN) or 128 x 64 (NT) tile.
constexpr int kATileBytes = kMaxM * kBK * 2;
constexpr int kBTileBytes = kBK * kBN * 2;
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr int kSmemBytes = kStages * kStageBytes;
// A slab shorter than this leaves the ring too little to stream.
constexpr int kMinSlabK = 4 * kBK;

// acc += a (16x16, row) · b (16x8, col), fp32 accumulators, inputs of type T.
template <typename T>
__device__ __forceinline__ void Mma(MmaAcc<float>& acc, const uint32_t (&a)[4],
                                    const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __half>) {
    detail::Mma16816(acc, a, b);
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(acc.v[0]), "+f"(acc.v[1]), "+f"(acc.v[2]), "+f"(acc.v[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <typename CT>
__device__ __forceinline__ void StorePair(CT* c, float x, float y) {
  if constexpr (std::is_same_v<CT, float>) {
    *reinterpret_cast<float2*>(c) = make_float2(x, y);
  } else if constexpr (std::is_same_v<CT, __half>) {
    *reinterpret_cast<__half2*>(c) = __floats2half2_rn(x, y);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(c) = __floats2bfloat162_rn(x, y);
  }
}

// Where a block's slab partials and its panel's arrival counter live (scratch).
struct SplitScratch {
  float* partials;     // slabs x m x n, slab-major
  unsigned* arrivals;  // one per panel, zero between launches
};

// One block: panel blockIdx.x (columns [n0, n0 + 128)), slab blockIdx.y (K rows [k0, k1)).
// A is m x k row-major (lda = k); B is k x n row-major (NN) or n x k row-major (TRANS_B).
// REQUIRES: m <= 16, n % 8 == 0, k % 8 == 0, 16-byte aligned operands, slab_k % 64 == 0.
template <typename T, typename CT, bool TRANS_B>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    SkinnyKernel(const T* __restrict__ A, const T* __restrict__ B, CT* __restrict__ C, int m, int n,
                 int k, int slab_k, SplitScratch split) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int n0 = blockIdx.x * kBN;
  const int k0 = blockIdx.y * slab_k;
  const int k1 = min(k, k0 + slab_k);
  const int tiles = DivCeil(k1 - k0, kBK);

  // A's rows past m are never loaded: zero them in every stage once.
  for (int i = tid; i < kStages * (kMaxM - m) * (kBK / 8); i += kThreads) {
    const int stage = i / ((kMaxM - m) * (kBK / 8));
    const int rest = i % ((kMaxM - m) * (kBK / 8));
    const int row = m + rest / (kBK / 8), chunk = rest % (kBK / 8);
    unsigned char* a_tile = smem + stage * kStageBytes;
    *reinterpret_cast<uint4*>(a_tile + SwizzledChunk<kBK / 8>(row, chunk) * 16) =
        make_uint4(0, 0, 0, 0);
  }

  // Tile t of the slab into stage s: 16 B chunks, zero past k1 (and past n for B), so that a
  // short last tile adds zeros (never NaN from whatever B holds there).
  auto load = [&](int t, int s) {
    unsigned char* stage = smem + s * kStageBytes;
    const int kt = k0 + t * kBK;
    {  // A: 16 x 64, one chunk per thread (rows < m)
      const int row = tid / (kBK / 8), chunk = tid % (kBK / 8);
      const int kk = kt + chunk * 8;
      if (row < m) {
        const bool valid = kk < k1;
        CpAsync16ZeroFill(SmemAddr(stage + SwizzledChunk<kBK / 8>(row, chunk) * 16),
                          valid ? A + int64_t(row) * k + kk : A, valid);
      }
    }
    unsigned char* b_tile = stage + kATileBytes;
#pragma unroll
    for (int i = 0; i < kBTileBytes / 16 / kThreads; ++i) {
      const int c = tid + i * kThreads;
      if constexpr (!TRANS_B) {  // 64 rows of k, 16 chunks of 8 columns
        const int row = c / (kBN / 8), chunk = c % (kBN / 8);
        const int kk = kt + row, nn = n0 + chunk * 8;
        const bool valid = kk < k1 && nn < n;
        CpAsync16ZeroFill(SmemAddr(b_tile + SwizzledChunk<kBN / 8>(row, chunk) * 16),
                          valid ? B + int64_t(kk) * n + nn : B, valid);
      } else {  // 128 rows of n, 8 chunks of 8 k
        const int row = c / (kBK / 8), chunk = c % (kBK / 8);
        const int nn = n0 + row, kk = kt + chunk * 8;
        const bool valid = kk < k1 && nn < n;
        CpAsync16ZeroFill(SmemAddr(b_tile + SwizzledChunk<kBK / 8>(row, chunk) * 16),
                          valid ? B + int64_t(nn) * k + kk : B, valid);
      }
    }
  };

  MmaAcc<float> acc[4] = {};  // this warp's 4 column tiles of 8: rows g and g+8, column pairs
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load(s, s);
    CpAsyncCommit();
  }
  for (int t = 0; t < tiles; ++t) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile t landed for all; stage (t - 1) % kStages is free
    if (t + kStages - 1 < tiles) load(t + kStages - 1, (t + kStages - 1) % kStages);
    CpAsyncCommit();
    const unsigned char* stage = smem + (t % kStages) * kStageBytes;
    const uint32_t a_base = SmemAddr(stage);
    const uint32_t b_base = SmemAddr(stage + kATileBytes);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t a[4];  // rows lane % 16 at k chunk 2·ks + lane / 16
      LdMatrixX4(a, a_base + SwizzledChunk<kBK / 8>(lane % 16, 2 * ks + lane / 16) * 16);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {    // column tiles 2·pair and 2·pair + 1
        const int col = warp * 32 + pair * 16;  // the pair's first column in the panel
        uint32_t b[4];  // b[0..1]: column tile 2·pair, b[2..3]: 2·pair + 1
        if constexpr (!TRANS_B) {
          // Matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
          const int row = 16 * ks + lane % 16, chunk = col / 8 + lane / 16;
          LdMatrixX4Trans(b[0], b[1], b[2], b[3], b_base + SwizzledChunk<kBN / 8>(row, chunk) * 16);
        } else {
          // Matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
          const int row = col + (lane / 16) * 8 + lane % 8, chunk = 2 * ks + (lane / 8) % 2;
          LdMatrixX4(b, b_base + SwizzledChunk<kBK / 8>(row, chunk) * 16);
        }
        Mma<T>(acc[2 * pair], a, {b[0], b[1]});
        Mma<T>(acc[2 * pair + 1], a, {b[2], b[3]});
      }
    }
  }
  CpAsyncWait<0>();

  // This block's rows g and g + 8 at column pairs 2·(lane % 4) of each tile.
  const int g = lane / 4;
  const int slab_count = gridDim.y;
  auto column = [&](int tile) { return n0 + warp * 32 + tile * 8 + 2 * (lane % 4); };
  if (slab_count == 1) {
#pragma unroll
    for (int tile = 0; tile < 4; ++tile) {
      const int nn = column(tile);
      if (nn >= n) continue;
      if (g < m) StorePair(C + int64_t(g) * n + nn, acc[tile].v[0], acc[tile].v[1]);
      if (g + 8 < m) StorePair(C + int64_t(g + 8) * n + nn, acc[tile].v[2], acc[tile].v[3]);
    }
    return;
  }
  float* mine = split.partials + int64_t(blockIdx.y) * m * n;
#pragma unroll
  for (int tile = 0; tile < 4; ++tile) {
    const int nn = column(tile);
    if (nn >= n) continue;
    if (g < m)
      *reinterpret_cast<float2*>(mine + int64_t(g) * n + nn) =
          make_float2(acc[tile].v[0], acc[tile].v[1]);
    if (g + 8 < m)
      *reinterpret_cast<float2*>(mine + int64_t(g + 8) * n + nn) =
          make_float2(acc[tile].v[2], acc[tile].v[3]);
  }
  // The last block of this panel to arrive sums the slabs (the threadfence makes this block's
  // partial visible before its arrival counts).
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (tid == 0) {
    last = atomicAdd(&split.arrivals[blockIdx.x], 1u) == unsigned(slab_count - 1);
    if (last) split.arrivals[blockIdx.x] = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Thread tid: column pair n0 + 2·(tid % 64), rows tid / 64, + 2, ...
  const int nn = n0 + 2 * (tid % (kBN / 2));
  if (nn >= n) return;
  for (int row = tid / (kBN / 2); row < m; row += kThreads / (kBN / 2)) {
    float x = 0.0f, y = 0.0f;
    for (int s = 0; s < slab_count; ++s) {
      const float2 p =
          __ldcg(reinterpret_cast<const float2*>(split.partials + (int64_t(s) * m + row) * n + nn));
      x += p.x;
      y += p.y;
    }
    StorePair(C + int64_t(row) * n + nn, x, y);
  }
}

// Slabs for this shape: as many as fill one wave of kBlocksPerSm blocks per SM without starting
// a second (a partial second wave would run alone), slabs of whole K tiles at least kMinSlabK
// deep.
struct Slabs {
  int count, depth;
};
Slabs SlabsFor(int n, int k, int sms) {
  const int panels = DivCeil(n, kBN);
  int count = std::max(1, kBlocksPerSm * sms / panels);
  count = std::min(count, std::max(1, k / kMinSlabK));
  const int depth = DivCeil(DivCeil(k, count), kBK) * kBK;
  return {DivCeil(k, depth), depth};
}

template <typename T, typename CT, bool TRANS_B>
std::string Run(const GemmProblem& p, LaunchContext& ctx) {
  constexpr auto kernel = &SkinnyKernel<T, CT, TRANS_B>;
  int device = 0, sms = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return CudaErrorText("cudaGetDevice", e);
  if (cudaError_t e = detail::SmCount(device, &sms); e != cudaSuccess)
    return CudaErrorText("SM count", e);
  const Slabs slabs = SlabsFor(p.n, p.k, sms);
  const int panels = DivCeil(p.n, kBN);
  SplitScratch split{nullptr, nullptr};
  if (slabs.count > 1) {
    const size_t partial_bytes = size_t(slabs.count) * p.m * p.n * sizeof(float);
    std::string error;
    auto* scratch = static_cast<unsigned char*>(ctx.Scratch(
        LaunchContext::kSplitKScratch, partial_bytes + panels * sizeof(unsigned), &error));
    if (scratch == nullptr) return error;
    split.partials = reinterpret_cast<float*>(scratch);
    split.arrivals = reinterpret_cast<unsigned*>(scratch + partial_bytes);
    // The counters return to zero at the end of every launch; the scratch may be new (or have
    // served another slot user), so they start from zero here.
    if (cudaError_t e = cudaMemsetAsync(split.arrivals, 0, panels * sizeof(unsigned), ctx.stream());
        e != cudaSuccess)
      return CudaErrorText("cudaMemsetAsync", e);
  }
  if (cudaError_t e = detail::OptInDynamicSmem<kernel>(device, kSmemBytes); e != cudaSuccess)
    return CudaErrorText("cudaFuncSetAttribute", e);
  kernel<<<dim3(panels, slabs.count), kThreads, kSmemBytes, ctx.stream()>>>(
      static_cast<const T*>(p.a), static_cast<const T*>(p.b), static_cast<CT*>(p.c), p.m, p.n, p.k,
      slabs.depth, split);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaErrorText("skinny_m16", e);
  return "";
}

template <typename T>
std::string RunTyped(const GemmProblem& p, LaunchContext& ctx) {
  if (p.c_type == DataType::kFp32)
    return p.transpose_b ? Run<T, float, true>(p, ctx) : Run<T, float, false>(p, ctx);
  return p.transpose_b ? Run<T, T, true>(p, ctx) : Run<T, T, false>(p, ctx);
}

std::string Launch(const GemmProblem& p, LaunchContext& ctx) {
  return p.ab_type == DataType::kBf16 ? RunTyped<__nv_bfloat16>(p, ctx) : RunTyped<__half>(p, ctx);
}

bool CanImplement(int m, int n, int k) {
  return m >= 1 && m <= kMaxM && n >= 8 && n % 8 == 0 && k >= 8 && k % 8 == 0 &&
         DivCeil(n, kBN) <= 65535;
}

}  // namespace

std::vector<VariantInfo> SkinnyVariants() {
  VariantInfo v{"skinny_m16",
                "M <= 16: 128-column panels x K slabs (split-K, reduced in the launch), "
                "mma.sync m16n8k16, 6-stage cp.async ring",
                /*fp16_acc=*/false,
                /*fp32_acc=*/true,
                size_t(kSmemBytes),
                /*min_sm=*/90,
                &CanImplement,
                "m <= 16, n % 8 == 0, k % 8 == 0, 16-byte aligned a, b, c; NN or NT, packed; "
                "fp32 accumulation",
                VariantKind::kKernel,
                /*is_fallback=*/false,
                /*swizzle_stride=*/0,
                kMaxM,
                kBN,
                kStages,
                /*inner=*/"",
                /*launch=*/nullptr,
                kLayoutNN | kLayoutNT,
                kAllTypes};
  v.launch_with_context = &Launch;
  return {v};
}

}  // namespace hgemm::kernels::internal
