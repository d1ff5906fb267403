// The ldmatrix + mma.sync HGEMM family: C[M,N] = A[M,K] · B[K,N], row-major fp16, fp16 or fp32
// accumulation. The same staged cp.async pipeline as the WMMA family (kernels/wmma_stage.cuh),
// with the three changes the WMMA version cannot express:
//   * shared tiles without padding, 16-byte chunks XOR-swizzled per row so that the eight rows an
//     ldmatrix phase reads (and the eight a cp.async phase writes) fall in distinct bank groups;
//   * fragments loaded with ldmatrix (.trans for B, which stays row-major in shared memory) and
//     multiplied with mma.sync.m16n8k16, the tensor-core instruction WMMA lowers to anyway;
//   * accumulators stored straight from registers (half2 per thread), no staging tile.
//
// Tile hierarchy:
//   MMA op      16 x 8 x 16 (mma.sync.m16n8k16)
//   warp tile   WM = BM / WARPS_M rows x WN = BN / WARPS_N cols: MI = WM/16 by NI = WN/8 MMA tiles
//   block tile  BM x BN, WARPS_M x WARPS_N warps
//   K tile      BK, one of K_STAGE cp.async stages
//
// Edges: loads are zero-filled when past M, N or K; stores are guarded per row and column pair.
// REQUIRES (checked by the registry): N % 8 == 0, K % 8 == 0, 16-byte aligned A, B, C.
// Thread safety: the launcher may be called from any thread.
#ifndef HGEMM_KERNELS_MMA_STAGE_CUH_
#define HGEMM_KERNELS_MMA_STAGE_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cp_async.cuh"
#include "kernels/launch.cuh"

namespace hgemm::kernels::detail {

// @tparam BM, BN, BK  block tile: rows of C, columns of C, K extent of one stage.
// @tparam WARPS_M, WARPS_N  warp grid of the block.
// @tparam K_STAGE  pipeline depth (2..6).
// @tparam BLOCK_SWIZZLE  map blocks to N bands for L2 reuse (see BlockTileN).
// @tparam AccT  half or float accumulators.
// @tparam MIN_BLOCKS  blocks per SM the register allocation must allow (__launch_bounds__).
// @tparam FRAG_DB  double-buffer the ldmatrix fragments: load step kk+1 (or step 0 of the next K
//                  tile, right after that tile's barrier) before issuing step kk's MMAs, so that
//                  no MMA waits on a shared-memory load (the CUTLASS multistage main loop).
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int K_STAGE, bool BLOCK_SWIZZLE,
          typename AccT, int MIN_BLOCKS = 1, bool FRAG_DB = false>
struct MmaStage {
  static_assert(K_STAGE >= 2 && K_STAGE <= 6, "the pipeline needs 2..6 stages");
  static_assert(BK % 16 == 0, "a K tile must hold whole k16 MMA steps");
  static_assert(BK / 8 == 4 || (BK / 8) % 8 == 0,
                "the A swizzle is defined for 4 or a multiple of 8 chunks per row");
  static_assert((BN / 8) % 8 == 0, "the B swizzle needs a multiple of 8 chunks per row");
  static_assert(std::is_same_v<AccT, half> || std::is_same_v<AccT, float>,
                "accumulate in half or float");

  static constexpr int kWarps = WARPS_M * WARPS_N;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int WM = BM / WARPS_M;
  static constexpr int WN = BN / WARPS_N;
  static_assert(
      WM % 16 == 0 && WN % 16 == 0,
      "a warp tile holds whole 16-row MMA tiles and pairs of 8-column tiles (ldmatrix.x4)");
  static constexpr int MI = WM / 16;
  static constexpr int NI = WN / 8;
  static constexpr int kChunksRowA = BK / 8;
  static constexpr int kChunksRowB = BN / 8;
  static constexpr int kStageA = BM * BK;  // halves
  static constexpr int kStageB = BK * BN;
  static_assert((BM * kChunksRowA) % kThreads == 0 && (BK * kChunksRowB) % kThreads == 0,
                "every thread copies the same number of 16-byte chunks per stage");
  static constexpr int kLoadsA = BM * kChunksRowA / kThreads;
  static constexpr int kLoadsB = BK * kChunksRowB / kThreads;
  static constexpr size_t kSmemBytes = size_t(K_STAGE) * (kStageA + kStageB) * sizeof(half);
  static_assert(kSmemBytes <= 227 * 1024, "an sm_90 block gets at most 227 KB of shared memory");
  static_assert(MIN_BLOCKS * (kSmemBytes + 1024) <= 228 * 1024,
                "MIN_BLOCKS blocks must fit the SM's 228 KB of shared memory");
  static_assert(!FRAG_DB || BK >= 32,
                "fragment double buffering refills a stage one k16 step after the barrier; with "
                "a single step per tile that stage could still be read");
};

// Index (in 16-byte chunks) of logical chunk `chunk` of row `row` in a swizzled tile with
// CHUNKS chunks per row. Any 8 consecutive rows at one logical chunk land in 8 different
// 16-byte bank groups, which makes ldmatrix (8 row addresses per phase) conflict-free.
template <int CHUNKS>
__device__ __forceinline__ int SwizzledChunk(int row, int chunk) {
  if constexpr (CHUNKS == 4) {
    return row * 4 + (chunk ^ ((row >> 1) & 3));  // two 64-byte rows share a 128-byte line
  } else {
    return row * CHUNKS + (chunk ^ (row & 7));
  }
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Accumulator registers of one 16x8 MMA tile: 4 floats, or 2 half2 words.
template <typename AccT>
struct MmaAcc;
template <>
struct MmaAcc<float> {
  float v[4];
};
template <>
struct MmaAcc<half> {
  uint32_t v[2];
};

__device__ __forceinline__ void Mma16816(MmaAcc<float>& c, const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c.v[0]), "+f"(c.v[1]), "+f"(c.v[2]), "+f"(c.v[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void Mma16816(MmaAcc<half>& c, const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, "
      "{%0,%1};\n"
      : "+r"(c.v[0]), "+r"(c.v[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The two values of row half `h` (0: row g, 1: row g+8) of a 16x8 tile, as half2.
__device__ __forceinline__ half2 AccPair(const MmaAcc<float>& c, int h) {
  return __floats2half2_rn(c.v[2 * h], c.v[2 * h + 1]);
}
__device__ __forceinline__ half2 AccPair(const MmaAcc<half>& c, int h) {
  uint32_t w = c.v[h];
  return *reinterpret_cast<half2*>(&w);
}

// Loads the A and B fragments of k16 step `kk` of the stage at shared addresses sa, sb.
template <typename Cfg>
__device__ __forceinline__ void MmaLoadFrags(uint32_t (&a_frag)[Cfg::MI][4],
                                             uint32_t (&b_frag)[Cfg::NI][2], uint32_t sa,
                                             uint32_t sb, int kk, int a_row, int a_chunk, int b_row,
                                             int b_chunk) {
#pragma unroll
  for (int i = 0; i < Cfg::MI; ++i)
    LdMatrixX4(a_frag[i],
               sa + SwizzledChunk<Cfg::kChunksRowA>(a_row + i * 16, kk * 2 + a_chunk) * 16);
#pragma unroll
  for (int j = 0; j < Cfg::NI / 2; ++j)
    LdMatrixX4Trans(b_frag[2 * j][0], b_frag[2 * j][1], b_frag[2 * j + 1][0], b_frag[2 * j + 1][1],
                    sb + SwizzledChunk<Cfg::kChunksRowB>(kk * 16 + b_row, b_chunk + 2 * j) * 16);
}

template <typename Cfg>
__device__ __forceinline__ void MmaLoadStage(const half* __restrict__ A, const half* __restrict__ B,
                                             half* sA, half* sB, int m0, int n0, int k0, int M,
                                             int N, int K, int tid) {
#pragma unroll
  for (int i = 0; i < Cfg::kLoadsA; ++i) {
    const int c = tid + i * Cfg::kThreads;
    const int r = c / Cfg::kChunksRowA;
    const int ch = c % Cfg::kChunksRowA;
    const int gm = m0 + r;
    const int gk = k0 + ch * 8;
    const bool valid = gm < M && gk < K;  // K % 8 == 0: a chunk is all in or all out
    CpAsync16ZeroFill(SmemAddr(sA + SwizzledChunk<Cfg::kChunksRowA>(r, ch) * 8),
                      valid ? A + (size_t(gm) * K + gk) : A, valid);
  }
#pragma unroll
  for (int i = 0; i < Cfg::kLoadsB; ++i) {
    const int c = tid + i * Cfg::kThreads;
    const int r = c / Cfg::kChunksRowB;
    const int ch = c % Cfg::kChunksRowB;
    const int gk = k0 + r;
    const int gn = n0 + ch * 8;
    const bool valid = gk < K && gn < N;  // N % 8 == 0: a chunk is all in or all out
    CpAsync16ZeroFill(SmemAddr(sB + SwizzledChunk<Cfg::kChunksRowB>(r, ch) * 8),
                      valid ? B + (size_t(gk) * N + gn) : B, valid);
  }
}

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int K_STAGE, bool BLOCK_SWIZZLE,
          typename AccT, int MIN_BLOCKS, bool FRAG_DB>
__global__ void __launch_bounds__(WARPS_M* WARPS_N* kWarpSize, MIN_BLOCKS)
    hgemm_mma_stage_kernel(const half* __restrict__ A, const half* __restrict__ B,
                           half* __restrict__ C, int M, int N, int K) {
  using Cfg =
      MmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, AccT, MIN_BLOCKS, FRAG_DB>;
  constexpr int MI = Cfg::MI;
  constexpr int NI = Cfg::NI;

  const int m0 = blockIdx.y * BM;
  const int n0 = BlockTileN<BLOCK_SWIZZLE>() * BN;
  if (n0 >= N) return;  // block-uniform: a swizzle band's spare block, before any barrier

  extern __shared__ __align__(128) unsigned char mma_smem[];
  half* s_a = reinterpret_cast<half*>(mma_smem);
  half* s_b = s_a + K_STAGE * Cfg::kStageA;

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp_id = tid / kWarpSize;
  const int warp_m = warp_id / WARPS_N;
  const int warp_n = warp_id % WARPS_N;

  MmaAcc<AccT> acc[MI][NI];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < int(sizeof(acc[i][j].v) / sizeof(acc[i][j].v[0])); ++e)
        acc[i][j].v[e] = 0;

  const int num_k_tiles = DivCeil(K, BK);
#pragma unroll
  for (int s = 0; s < K_STAGE - 1; ++s) {
    if (s < num_k_tiles)
      MmaLoadStage<Cfg>(A, B, s_a + s * Cfg::kStageA, s_b + s * Cfg::kStageB, m0, n0, s * BK, M, N,
                        K, tid);
    CpAsyncCommit();  // possibly empty, so that wait_group counts stay aligned with tiles
  }

  // Per-lane ldmatrix coordinates: A rows lane%16 at k chunk lane/16; B k rows lane%8 (+8 for
  // lanes 8-15 and 24-31) at n chunk +lane/16.
  const int a_row = warp_m * Cfg::WM + (lane % 16);
  const int a_chunk = lane / 16;
  const int b_row = (lane % 8) + ((lane >> 3) & 1) * 8;
  const int b_chunk = (warp_n * Cfg::WN) / 8 + (lane >> 4);

  if constexpr (!FRAG_DB) {
    for (int kt = 0; kt < num_k_tiles; ++kt) {
      CpAsyncWait<K_STAGE - 2>();
      __syncthreads();  // tile kt visible; tile kt-1's stage free for the refill below

      const int next = kt + K_STAGE - 1;
      if (next < num_k_tiles) {
        const int s = next % K_STAGE;
        MmaLoadStage<Cfg>(A, B, s_a + s * Cfg::kStageA, s_b + s * Cfg::kStageB, m0, n0, next * BK,
                          M, N, K, tid);
      }
      CpAsyncCommit();

      const uint32_t sa = SmemAddr(s_a + (kt % K_STAGE) * Cfg::kStageA);
      const uint32_t sb = SmemAddr(s_b + (kt % K_STAGE) * Cfg::kStageB);
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t a_frag[MI][4];
        uint32_t b_frag[NI][2];
        MmaLoadFrags<Cfg>(a_frag, b_frag, sa, sb, kk, a_row, a_chunk, b_row, b_chunk);
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NI; ++j) Mma16816(acc[i][j], a_frag[i], b_frag[j]);
      }
    }
  } else {
    // Fragments of step kk+1 are in flight while step kk multiplies. The barrier moves to the
    // last step of each tile, just before the first fragments of the next tile are read; the
    // stage of tile kt-1 is refilled at step 0 of tile kt, after every warp has passed the
    // barrier that followed its last read of that stage.
    constexpr int KK = BK / 16;
    uint32_t a_frag[2][MI][4];
    uint32_t b_frag[2][NI][2];
    CpAsyncWait<K_STAGE - 2>();
    __syncthreads();  // tile 0 visible
    int read_stage = 0;
    int write_stage = K_STAGE - 1;
    uint32_t sa = SmemAddr(s_a);
    uint32_t sb = SmemAddr(s_b);
    MmaLoadFrags<Cfg>(a_frag[0], b_frag[0], sa, sb, 0, a_row, a_chunk, b_row, b_chunk);
    for (int kt = 0; kt < num_k_tiles; ++kt) {
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) {
        if (kk == KK - 1) {
          CpAsyncWait<K_STAGE - 2>();
          __syncthreads();  // tile kt+1 visible; every warp is done reading tile kt-1's stage
          read_stage = read_stage + 1 == K_STAGE ? 0 : read_stage + 1;
          sa = SmemAddr(s_a + read_stage * Cfg::kStageA);
          sb = SmemAddr(s_b + read_stage * Cfg::kStageB);
        }
        // Step kk+1 of this tile, or step 0 of the next (past the last tile this reads a stage
        // nothing uses any more; the fragments are dropped).
        MmaLoadFrags<Cfg>(a_frag[(kk + 1) % 2], b_frag[(kk + 1) % 2], sa, sb, (kk + 1) % KK, a_row,
                          a_chunk, b_row, b_chunk);
        if (kk == 0) {
          const int next = kt + K_STAGE - 1;
          if (next < num_k_tiles)
            MmaLoadStage<Cfg>(A, B, s_a + write_stage * Cfg::kStageA,
                              s_b + write_stage * Cfg::kStageB, m0, n0, next * BK, M, N, K, tid);
          CpAsyncCommit();
          write_stage = write_stage + 1 == K_STAGE ? 0 : write_stage + 1;
        }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NI; ++j) Mma16816(acc[i][j], a_frag[kk % 2][i], b_frag[kk % 2][j]);
      }
    }
  }
  CpAsyncWait<0>();  // only empty groups remain; leave none in flight at exit

  // Epilogue: thread holds rows g and g+8 of each 16x8 tile, two adjacent columns each.
  const int g = lane / 4;
  const int t2 = (lane % 4) * 2;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + warp_m * Cfg::WM + i * 16 + g + 8 * h;
      if (row >= M) continue;
      half* c_row = C + size_t(row) * N;
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int col = n0 + warp_n * Cfg::WN + j * 8 + t2;
        if (col < N)  // N even: col + 1 < N as well
          *reinterpret_cast<half2*>(c_row + col) = AccPair(acc[i][j], h);
      }
    }
  }
}

// Launches one instantiation on `stream`; returns the launch's CUDA error.
// REQUIRES: M, N, K >= 1, N % 8 == 0, K % 8 == 0, 16-byte aligned pointers; with BLOCK_SWIZZLE,
//           swizzle_stride a positive multiple of BN.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int K_STAGE, bool BLOCK_SWIZZLE,
          typename AccT, int MIN_BLOCKS, bool FRAG_DB>
cudaError_t LaunchMmaStage(const half* A, const half* B, half* C, int M, int N, int K,
                           int swizzle_stride, cudaStream_t stream) {
  using Cfg =
      MmaStage<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE, BLOCK_SWIZZLE, AccT, MIN_BLOCKS, FRAG_DB>;
  constexpr auto* kernel = &hgemm_mma_stage_kernel<BM, BN, BK, WARPS_M, WARPS_N, K_STAGE,
                                                   BLOCK_SWIZZLE, AccT, MIN_BLOCKS, FRAG_DB>;
  int device = 0;
  HGEMM_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  HGEMM_RETURN_IF_CUDA_ERROR(OptInDynamicSmem<kernel>(device, Cfg::kSmemBytes));
  return LaunchTiled<kernel>(BM, BN, Cfg::kThreads, Cfg::kSmemBytes, BLOCK_SWIZZLE, swizzle_stride,
                             A, B, C, M, N, K, stream);
}

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_MMA_STAGE_CUH_
