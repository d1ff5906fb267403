// The staged WMMA HGEMM family: C[M,N] = A[M,K] · B[K,N], all row-major fp16, on any M, N, K >= 1.
//
// Tile hierarchy (names kept from ../shared/reference/hgemm_wmma_stage.cu):
//   WMMA op        WMMA_M x WMMA_N x WMMA_K            one tensor-core fragment product (16x16x16)
//   warp tile      WARP_TILE_M x WARP_TILE_N fragments  what one warp accumulates
//   block tile     WMMA_TILE_M x WMMA_TILE_N warps      BM = WMMA_M*WMMA_TILE_M*WARP_TILE_M rows,
//                                                       BN = WMMA_N*WMMA_TILE_N*WARP_TILE_N cols
//   K tile         BK (a multiple of WMMA_K)            one pipeline stage of A (BM x BK), B (BK x
//   BN) pipeline       K_STAGE stages of cp.async           K_STAGE-1 tiles in flight while one
//   computes
//
// Edges: every global load is predicated (zero-filled cp.async, or guarded scalar loads when
// VEC16 is off), so tiles past M, N or K add zeros; the epilogue stores through a per-warp shared
// staging tile with per-row/column guards. No thread returns before a barrier: the only early
// exit is block-uniform (a swizzled block past the last N tile), taken before any barrier.
//
// Accumulation: AccT = half (the reference's semantics) or float (fp32 accumulator fragments,
// rounded to fp16 once at the store).
//
// Kernels never launch themselves: LaunchWmmaStage<> below fixes grid, block and the dynamic
// shared-memory attribute. Thread safety: the launcher may be called from any thread.
#ifndef HGEMM_KERNELS_WMMA_STAGE_CUH_
#define HGEMM_KERNELS_WMMA_STAGE_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cp_async.cuh"
#include "kernels/launch.cuh"

namespace hgemm::kernels::detail {

// @tparam WMMA_M, WMMA_N, WMMA_K  fragment shape (16x16x16, the only fp16 shape used here).
// @tparam WMMA_TILE_M, WMMA_TILE_N  warps per block along M and N.
// @tparam WARP_TILE_M, WARP_TILE_N  fragments per warp along M and N.
// @tparam BK  K extent of one pipeline stage (multiple of WMMA_K).
// @tparam A_PAD, B_PAD  halves of padding after each shared row of A and B (bank-conflict relief).
// @tparam K_STAGE  pipeline depth (2..6): K_STAGE-1 K tiles are fetched ahead.
// @tparam BLOCK_SWIZZLE  map blocks to N bands for L2 reuse (see BlockTileN).
// @tparam DYNAMIC_SMEM  dynamic (extern) shared memory instead of a static array (> 48 KB).
// @tparam VEC16  16-byte cp.async loads and vector stores; REQUIRES K % 8 == 0, N % 8 == 0 and
//                16-byte aligned A, B, C. Off: guarded scalar loads and stores (the fallback).
// @tparam AccT  accumulator type: half or float.
template <int WMMA_M, int WMMA_N, int WMMA_K, int WMMA_TILE_M, int WMMA_TILE_N, int WARP_TILE_M,
          int WARP_TILE_N, int BK, int A_PAD, int B_PAD, int K_STAGE, bool BLOCK_SWIZZLE,
          bool DYNAMIC_SMEM, bool VEC16, typename AccT>
struct WmmaStage {
  static_assert(WMMA_M == 16 && WMMA_N == 16 && WMMA_K == 16,
                "fp16 WMMA with fp16 or fp32 accumulators is only used in its 16x16x16 shape");
  static_assert(K_STAGE >= 2 && K_STAGE <= 6, "the pipeline needs 2..6 stages");
  static_assert(BK % WMMA_K == 0, "a K tile must hold whole WMMA fragments");
  static_assert(A_PAD % 8 == 0 && B_PAD % 8 == 0,
                "WMMA ldm must be a multiple of 8 halves and cp.async rows 16-byte aligned");
  static_assert(std::is_same_v<AccT, half> || std::is_same_v<AccT, float>,
                "accumulate in half or float");

  static constexpr int kWarps = WMMA_TILE_M * WMMA_TILE_N;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int BM = WMMA_M * WMMA_TILE_M * WARP_TILE_M;
  static constexpr int BN = WMMA_N * WMMA_TILE_N * WARP_TILE_N;
  static constexpr int kWarpM = WMMA_M * WARP_TILE_M;  // rows of C per warp
  static constexpr int kWarpN = WMMA_N * WARP_TILE_N;  // cols of C per warp
  static constexpr int kLdA = BK + A_PAD;              // shared row pitch of A, halves
  static constexpr int kLdB = BN + B_PAD;              // shared row pitch of B, halves
  static constexpr int kStageA = BM * kLdA;            // halves per stage
  static constexpr int kStageB = BK * kLdB;
  static constexpr int kChunksA = BM * BK / 8;  // 16-byte chunks per stage
  static constexpr int kChunksB = BK * BN / 8;
  static_assert(kChunksA % kThreads == 0 && kChunksB % kThreads == 0,
                "every thread copies the same number of 16-byte chunks per stage");
  static constexpr int kLoadsA = kChunksA / kThreads;
  static constexpr int kLoadsB = kChunksB / kThreads;
  static constexpr size_t kPipeBytes = size_t(K_STAGE) * (kStageA + kStageB) * sizeof(half);
  // Epilogue: one WMMA_M x WMMA_N staging tile per warp, reusing the pipeline's memory.
  static constexpr size_t kEpilogueBytes = size_t(kWarps) * WMMA_M * WMMA_N * sizeof(AccT);
  static constexpr size_t kSmemBytes = kPipeBytes > kEpilogueBytes ? kPipeBytes : kEpilogueBytes;
  static_assert(DYNAMIC_SMEM || kSmemBytes <= 48 * 1024,
                "static shared memory is limited to 48 KB; use DYNAMIC_SMEM");
  static_assert(kSmemBytes <= 227 * 1024, "an sm_90 block gets at most 227 KB of shared memory");
  static_assert(WMMA_M * WMMA_N == 8 * kWarpSize, "epilogue: each lane stores 8 elements");
};

// Fills one pipeline stage with the A tile (rows m0.., cols k0..) and B tile (rows k0.., cols
// n0..).
template <typename Cfg, bool VEC16>
__device__ __forceinline__ void LoadStage(const half* __restrict__ A, const half* __restrict__ B,
                                          half* sA, half* sB, int m0, int n0, int k0, int M, int N,
                                          int K, int tid) {
  constexpr int kChunksPerRowA = Cfg::kChunksA / Cfg::BM;  // BK / 8
  constexpr int kChunksPerRowB = Cfg::BN / 8;
#pragma unroll
  for (int i = 0; i < Cfg::kLoadsA; ++i) {
    const int c = tid + i * Cfg::kThreads;
    const int r = c / kChunksPerRowA;
    const int col = (c % kChunksPerRowA) * 8;
    const int gm = m0 + r;
    const int gk = k0 + col;
    half* dst = sA + r * Cfg::kLdA + col;
    if constexpr (VEC16) {
      const bool valid = gm < M && gk < K;  // K % 8 == 0: a chunk is all in or all out
      const half* src = valid ? A + (size_t(gm) * K + gk) : A;
      CpAsync16ZeroFill(SmemAddr(dst), src, valid);
    } else {
      alignas(16) half v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v[e] = (gm < M && gk + e < K) ? A[size_t(gm) * K + gk + e] : __float2half(0.f);
      *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(v);
    }
  }
#pragma unroll
  for (int i = 0; i < Cfg::kLoadsB; ++i) {
    const int c = tid + i * Cfg::kThreads;
    const int r = c / kChunksPerRowB;
    const int col = (c % kChunksPerRowB) * 8;
    const int gk = k0 + r;
    const int gn = n0 + col;
    half* dst = sB + r * Cfg::kLdB + col;
    if constexpr (VEC16) {
      const bool valid = gk < K && gn < N;  // N % 8 == 0: a chunk is all in or all out
      const half* src = valid ? B + (size_t(gk) * N + gn) : B;
      CpAsync16ZeroFill(SmemAddr(dst), src, valid);
    } else {
      alignas(16) half v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v[e] = (gk < K && gn + e < N) ? B[size_t(gk) * N + gn + e] : __float2half(0.f);
      *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(v);
    }
  }
}

template <int WMMA_M, int WMMA_N, int WMMA_K, int WMMA_TILE_M, int WMMA_TILE_N, int WARP_TILE_M,
          int WARP_TILE_N, int BK, int A_PAD, int B_PAD, int K_STAGE, bool BLOCK_SWIZZLE,
          bool DYNAMIC_SMEM, bool VEC16, typename AccT>
__global__ void __launch_bounds__(WMMA_TILE_M* WMMA_TILE_N* kWarpSize)
    hgemm_wmma_stage_kernel(const half* __restrict__ A, const half* __restrict__ B,
                            half* __restrict__ C, int M, int N, int K) {
  using namespace nvcuda;
  using Cfg = WmmaStage<WMMA_M, WMMA_N, WMMA_K, WMMA_TILE_M, WMMA_TILE_N, WARP_TILE_M, WARP_TILE_N,
                        BK, A_PAD, B_PAD, K_STAGE, BLOCK_SWIZZLE, DYNAMIC_SMEM, VEC16, AccT>;

  const int m0 = blockIdx.y * Cfg::BM;
  const int n0 = BlockTileN<BLOCK_SWIZZLE>() * Cfg::BN;
  if (n0 >= N) return;  // block-uniform: a swizzle band's spare block, before any barrier

  unsigned char* smem;
  if constexpr (DYNAMIC_SMEM) {
    extern __shared__ __align__(128) unsigned char wmma_dsmem[];
    smem = wmma_dsmem;
  } else {
    __shared__ __align__(128) unsigned char wmma_ssmem[Cfg::kSmemBytes];
    smem = wmma_ssmem;
  }
  half* s_a = reinterpret_cast<half*>(smem);
  half* s_b = s_a + K_STAGE * Cfg::kStageA;

  const int tid = threadIdx.x;
  const int warp_id = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int warp_m = warp_id / WMMA_TILE_N;
  const int warp_n = warp_id % WMMA_TILE_N;

  wmma::fragment<wmma::accumulator, WMMA_M, WMMA_N, WMMA_K, AccT> c_frag[WARP_TILE_M][WARP_TILE_N];
#pragma unroll
  for (int i = 0; i < WARP_TILE_M; ++i)
#pragma unroll
    for (int j = 0; j < WARP_TILE_N; ++j) wmma::fill_fragment(c_frag[i][j], AccT(0));

  const int num_k_tiles = DivCeil(K, BK);

  // Prologue: K_STAGE-1 tiles in flight. A group is committed even when empty so that the
  // wait_group count below always refers to the same tile.
#pragma unroll
  for (int s = 0; s < K_STAGE - 1; ++s) {
    if (s < num_k_tiles)
      LoadStage<Cfg, VEC16>(A, B, s_a + s * Cfg::kStageA, s_b + s * Cfg::kStageB, m0, n0, s * BK, M,
                            N, K, tid);
    CpAsyncCommit();
  }

  for (int kt = 0; kt < num_k_tiles; ++kt) {
    // Tile kt has landed; every warp has also finished computing tile kt-1, whose stage is
    // refilled just below.
    CpAsyncWait<K_STAGE - 2>();
    __syncthreads();

    const int next = kt + K_STAGE - 1;
    if (next < num_k_tiles) {
      const int s = next % K_STAGE;
      LoadStage<Cfg, VEC16>(A, B, s_a + s * Cfg::kStageA, s_b + s * Cfg::kStageB, m0, n0, next * BK,
                            M, N, K, tid);
    }
    CpAsyncCommit();

    const half* sa = s_a + (kt % K_STAGE) * Cfg::kStageA;
    const half* sb = s_b + (kt % K_STAGE) * Cfg::kStageB;
#pragma unroll
    for (int kk = 0; kk < BK; kk += WMMA_K) {
      wmma::fragment<wmma::matrix_a, WMMA_M, WMMA_N, WMMA_K, half, wmma::row_major>
          a_frag[WARP_TILE_M];
      wmma::fragment<wmma::matrix_b, WMMA_M, WMMA_N, WMMA_K, half, wmma::row_major>
          b_frag[WARP_TILE_N];
#pragma unroll
      for (int i = 0; i < WARP_TILE_M; ++i)
        wmma::load_matrix_sync(a_frag[i], sa + (warp_m * Cfg::kWarpM + i * WMMA_M) * Cfg::kLdA + kk,
                               Cfg::kLdA);
#pragma unroll
      for (int j = 0; j < WARP_TILE_N; ++j)
        wmma::load_matrix_sync(b_frag[j], sb + kk * Cfg::kLdB + warp_n * Cfg::kWarpN + j * WMMA_N,
                               Cfg::kLdB);
#pragma unroll
      for (int i = 0; i < WARP_TILE_M; ++i)
#pragma unroll
        for (int j = 0; j < WARP_TILE_N; ++j)
          wmma::mma_sync(c_frag[i][j], a_frag[i], b_frag[j], c_frag[i][j]);
    }
  }

  // Epilogue: the pipeline memory becomes per-warp staging tiles.
  CpAsyncWait<0>();
  __syncthreads();
  AccT* stage = reinterpret_cast<AccT*>(smem) + warp_id * (WMMA_M * WMMA_N);
  const int r = lane / 2;  // each lane writes 8 consecutive elements of one row
  const int c8 = (lane % 2) * 8;
#pragma unroll
  for (int i = 0; i < WARP_TILE_M; ++i) {
#pragma unroll
    for (int j = 0; j < WARP_TILE_N; ++j) {
      wmma::store_matrix_sync(stage, c_frag[i][j], WMMA_N, wmma::mem_row_major);
      __syncwarp();
      const int gm = m0 + warp_m * Cfg::kWarpM + i * WMMA_M + r;
      const int gn = n0 + warp_n * Cfg::kWarpN + j * WMMA_N + c8;
      alignas(16) half out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) out[e] = __float2half(float(stage[r * WMMA_N + c8 + e]));
      if (gm < M) {
        half* dst = C + size_t(gm) * N + gn;
        if (VEC16 && gn + 8 <= N) {
          *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(out);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (gn + e < N) dst[e] = out[e];
        }
      }
      __syncwarp();
    }
  }
}

// Launches one instantiation of the family on `stream`. Returns the launch's CUDA error.
// REQUIRES: M, N, K >= 1; with VEC16, K % 8 == 0, N % 8 == 0 and 16-byte aligned pointers;
//           with BLOCK_SWIZZLE, swizzle_stride a positive multiple of BN.
template <int WMMA_TILE_M, int WMMA_TILE_N, int WARP_TILE_M, int WARP_TILE_N, int BK, int A_PAD,
          int B_PAD, int K_STAGE, bool BLOCK_SWIZZLE, bool DYNAMIC_SMEM, bool VEC16, typename AccT>
cudaError_t LaunchWmmaStage(const half* A, const half* B, half* C, int M, int N, int K,
                            int swizzle_stride, cudaStream_t stream) {
  using Cfg = WmmaStage<16, 16, 16, WMMA_TILE_M, WMMA_TILE_N, WARP_TILE_M, WARP_TILE_N, BK, A_PAD,
                        B_PAD, K_STAGE, BLOCK_SWIZZLE, DYNAMIC_SMEM, VEC16, AccT>;
  constexpr auto* kernel =
      &hgemm_wmma_stage_kernel<16, 16, 16, WMMA_TILE_M, WMMA_TILE_N, WARP_TILE_M, WARP_TILE_N, BK,
                               A_PAD, B_PAD, K_STAGE, BLOCK_SWIZZLE, DYNAMIC_SMEM, VEC16, AccT>;
  constexpr size_t dynamic_bytes = DYNAMIC_SMEM ? Cfg::kSmemBytes : 0;
  if constexpr (DYNAMIC_SMEM) {
    int device = 0;
    HGEMM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
    HGEMM_RETURN_IF_CUDA_ERROR(OptInDynamicSmem<kernel>(device, dynamic_bytes));
  }
  return LaunchTiled<kernel>(Cfg::BM, Cfg::BN, Cfg::kThreads, dynamic_bytes, BLOCK_SWIZZLE,
                             swizzle_stride, A, B, C, M, N, K, stream);
}

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_WMMA_STAGE_CUH_
