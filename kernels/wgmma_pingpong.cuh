// The ping-pong schedule of the TMA + wgmma family (CUTLASS's KernelTmaWarpSpecializedPingpong):
// C[M,N] = op(A)·op(B), row-major storage, fp16 or bf16 in, the same type or fp32 out, fp32
// accumulators, the four layouts (NN, NT, TN, TT), strided batches. sm_90a only.
//
// The cooperative kernel (wgmma_stage.cuh) splits one 128×256 tile between its two consumer
// warpgroups, so both finish their main loops together and then both run the epilogue while the
// tensor cores idle (docs/kernels_notes.md, "Where the time goes now"). Here each consumer
// warpgroup owns a whole BM×BN tile, and the two take turns:
//   * The producer warpgroup (one thread) walks the block's tiles in order and fills the one
//     K_STAGE-deep ring with the K tiles of tile 0 (consumer 0's), then tile 1 (consumer 1's),
//     tile 2 (consumer 0's) ...: a stage is read by one consumer only (its "empty" barrier
//     counts one arrival). Boxes, swizzle, descriptors and byte counts are the cooperative
//     kernel's with CONSUMERS = 2 (one warpgroup now issues both 64-row slabs' wgmma).
//   * An ordered barrier passes the MMA phase between the consumers: a consumer issues its
//     tile's wgmma only after the other has issued all of its previous tile's, and hands the
//     turn over as soon as its own last K tile is issued, before waiting for the wgmma to
//     drain. So while consumer 0 converts and stores its accumulators, consumer 1 keeps the
//     tensor cores busy, and the other way round.
//     The turn is two hardware named barriers (one per consumer, 256 threads; FlashAttention-3's
//     warp-scheduler barriers): a consumer waits on its own with bar.sync (128 threads) and the
//     other arrives with bar.arrive (128). A barrier never holds two pending arrivals: the
//     arriver must itself have had its turn in between. A consumer hands the turn over only if
//     the block has a next tile (whose owner then waits for it), so no arrival is left pending
//     at exit. The turn also keeps the ring's parity waits sound: a consumer starts tile j only
//     after the other has waited on every stage of tile j − 1, so each stage it waits on has
//     been filled for every earlier K tile, and the phase it waits for is the next one.
//   * Epilogue: the cooperative kernel's, per 64-row slab: 64×64 chunks through a double-
//     buffered 128-byte-swizzled shared tile and TMA tensor stores (fp32 C: two 64×32 boxes,
//     single-buffered), 16 KB of staging per consumer.
//   * setmaxnreg: 40 registers to the producer, 232 to each consumer (the block's 168 × 384
//     exactly); a consumer holds BM·BN/128 = 128 fp32 accumulators.
// Not here: groups (the registry runs a group as a loop of launches: VariantInfo says so) and
// α/β (the registry's separate epilogue, as for the cooperative kernel).
//
// REQUIRES (checked by the registry): the cooperative kernel's (16-byte row strides: N % 8, K %
// 8, M % 8 with TRANS_A, lda/ldb/ldc % 8; 16-byte aligned A, B, C; batch item strides 16-byte
// multiples under 2^40 bytes; batch × tiles < 2^31).
// Thread safety: a launch (wgmma_pingpong_launch.cuh) may be made from any thread.
#ifndef HGEMM_KERNELS_WGMMA_PINGPONG_CUH_
#define HGEMM_KERNELS_WGMMA_PINGPONG_CUH_

#include <cuda.h>  // CUtensorMap (the type only: nothing links libcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/wgmma_ops.cuh"
#include "kernels/wgmma_stage.cuh"

namespace hgemm::kernels::detail {

// @tparam BN       tile columns of each consumer warpgroup (the wgmma N: 128 or 256).
// @tparam K_STAGE  shared-memory ring depth, in K tiles of BK = 64 (shared by both consumers).
// @tparam GROUP_M  tile rows per L2 group of the persistent tile order.
template <int BN, int K_STAGE, int GROUP_M>
struct WgmmaPingpong {
  static constexpr int BM = 128;  // each consumer's tile: two m64 slabs
  static constexpr int BK = 64;   // one 128-byte swizzle row of fp16
  static constexpr int kSlabs = BM / 64;
  static_assert(BN == 128 || BN == 256, "wgmma wrappers exist for n128 and n256");
  static_assert(BM * BN / 128 <= 128,
                "a consumer's accumulators (BM·BN/128 fp32 per thread) must leave room in 232 "
                "registers");
  static_assert(K_STAGE >= 2, "the ring needs two stages to overlap loads with wgmma");
  static_assert(GROUP_M >= 1, "a tile group holds at least one tile row");
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kStageABytes = BM * BK * 2;
  static constexpr int kStageBBytes = BK * BN * 2;
  static constexpr int kBChunkBytes = BK * 64 * 2;  // one TMA box: BK rows of 64 columns
  static constexpr int kAChunkBytes = BK * 64 * 2;  // TRANS_A: one box of BK rows × 64 M
  static constexpr int kSlabBytes = 64 * BK * 2;    // a 64-row slab of A starts this far in
  static_assert(kAChunkBytes == kSlabBytes, "a 64-row slab of A is one box either way");
  static constexpr int kStageBytes = kStageABytes + kStageBBytes;
  static_assert(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0,
                "128-byte swizzle atoms are 1024 bytes: every tile must start on one");
  // The epilogue's staging: two 64×64 fp16 chunks (8 KB each, 1024-aligned) per consumer.
  static constexpr int kCChunkBytes = 64 * 64 * 2;
  static constexpr int kCStageBytes = kConsumers * 2 * kCChunkBytes;
  // 1024 bytes of slack to align the ring, the ring, the epilogue's staging, then a full and an
  // empty barrier per stage.
  static constexpr size_t kSmemBytes =
      size_t(K_STAGE) * kStageBytes + kCStageBytes + 1024 + 16 * K_STAGE;
  static_assert(kSmemBytes <= 227 * 1024, "an sm_90 block gets at most 227 KB of shared memory");
  static constexpr int kAcc = BN / 2;  // fp32 accumulators per thread and 64-row slab
  // Named barriers: 1 + c a consumer's epilogue (128 threads), 3 + c its MMA turn (256).
  static constexpr int kEpilogueBarrier = 1, kTurnBarrier = 3;
};

__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Tensor maps as WgmmaGemmKernel's with CONSUMERS = 2 (internal::ProblemTensorMaps<128, BN,
// ...>): A boxes of 128 rows × 64 K (TRANS_A: 64 K rows × 64 M), B of 64 K × 64 columns
// (TRANS_B: BN rows × 64 K), C of 64 × 64 (fp32: 64 × 32); 3-D, the batch item outermost.
// num_tiles = the items × the tiles of M×N.
// @tparam BN, K_STAGE, GROUP_M  see WgmmaPingpong.
// @tparam TRANS_A, TRANS_B, T, TC  see WgmmaGemmKernel.
template <int BN, int K_STAGE, int GROUP_M, bool TRANS_A = false, bool TRANS_B = false,
          typename T = __half, typename TC = T>
__global__ void __launch_bounds__(384, 1)
    WgmmaPingpongKernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_b,
                        const __grid_constant__ CUtensorMap map_c, int M, int N, int K,
                        int num_tiles) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = WgmmaPingpong<BN, K_STAGE, GROUP_M>;
  static_assert(Cfg::kThreads == 384, "__launch_bounds__ above assumes 3 warpgroups");
  constexpr int BM = Cfg::BM, BK = Cfg::BK;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(kBf16 || std::is_same_v<T, __half>, "wgmma with transposes takes f16 or bf16");
  constexpr bool kFp32Out = std::is_same_v<TC, float>;
  static_assert(kFp32Out || std::is_same_v<TC, T>, "C is of the input type or fp32");
  static_assert(64 * 64 * sizeof(float) <= 2 * Cfg::kCChunkBytes,
                "an fp32 chunk fits in a consumer's two 16-bit chunk buffers");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t ring = (raw + 1023) & ~1023u;
  const uint32_t c_stage = ring + K_STAGE * Cfg::kStageBytes;
  const uint32_t bars = c_stage + Cfg::kCStageBytes;
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (K_STAGE + s); };
  auto stage_a = [&](int s) { return ring + s * Cfg::kStageBytes; };
  auto stage_b = [&](int s) { return ring + s * Cfg::kStageBytes + Cfg::kStageABytes; };

  if (threadIdx.x == 0) {
    for (int s = 0; s < K_STAGE; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), 1);  // one consumer reads a stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int tiles_per_item = tiles_m * tiles_n;
  const int k_tiles = (K + BK - 1) / BK;
  // Tile t: item t / tiles_per_item, then the grouped order within the item.
  auto locate = [&](int t, int& item, int& tm, int& tn) {
    item = t / tiles_per_item;
    GroupedOrder<GROUP_M>(t - item * tiles_per_item, tiles_m, tiles_n, tm, tn);
  };

  if (threadIdx.x < 128) {
    // Producer warpgroup: one thread issues every TMA, the block's tiles in order.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      int it = 0;  // K tiles issued so far, over all of this block's tiles
      for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
        int item, tm, tn;
        locate(t, item, tm, tn);
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % K_STAGE;
          MbarWait(empty(s), ((it / K_STAGE) & 1) ^ 1);  // the first round passes at once
          MbarArriveExpectTx(full(s), Cfg::kStageBytes);
          if constexpr (TRANS_A) {
#pragma unroll
            for (int j = 0; j < Cfg::kSlabs; ++j)
              TmaLoad3d(stage_a(s) + j * Cfg::kAChunkBytes, &map_a, tm * BM + 64 * j, kt * BK, item,
                        full(s));
          } else {
            TmaLoad3d(stage_a(s), &map_a, kt * BK, tm * BM, item, full(s));
          }
          if constexpr (TRANS_B) {
            TmaLoad3d(stage_b(s), &map_b, kt * BK, tn * BN, item, full(s));
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              TmaLoad3d(stage_b(s) + j * Cfg::kBChunkBytes, &map_b, tn * BN + 64 * j, kt * BK, item,
                        full(s));
          }
        }
      }
    }
  } else {
    // Consumer warpgroups: c takes the block's tiles 0, 2, 4 ... (c = 0) or 1, 3, 5 ... (c = 1).
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = threadIdx.x / 128 - 1;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const bool leader = threadIdx.x % 128 == 0;  // releases stages, issues the C stores
    const int my_turn = Cfg::kTurnBarrier + c, their_turn = Cfg::kTurnBarrier + (1 - c);
    // Consumer 0 has the first turn: consumer 1 gives it (every block has a tile 0).
    if (c == 1) NamedBarrierArrive(their_turn, 256);
    float acc[Cfg::kSlabs][Cfg::kAcc];
    for (int j = c, t = blockIdx.x + c * gridDim.x; t < num_tiles; j += 2, t += 2 * gridDim.x) {
      int item, tm, tn;
      locate(t, item, tm, tn);
      const bool next_exists = t + gridDim.x < num_tiles;  // its owner waits for the turn
      int it = j * k_tiles;  // the producer's count at this tile's first K tile
      NamedBarrier(my_turn, 256);
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % K_STAGE;
        MbarWait(full(s), (it / K_STAGE) & 1);
        const uint32_t b0 = stage_b(s);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          // 16 K: 32 bytes along a K-major row, or 2 swizzle atoms (16 rows) of an MN-major box.
          const uint64_t desc_b = TRANS_B ? GmmaDesc(b0 + kk * 32, 16, 1024)
                                          : GmmaDesc(b0 + kk * 2048, Cfg::kBChunkBytes, 1024);
#pragma unroll
          for (int h = 0; h < Cfg::kSlabs; ++h) {
            const uint32_t a0 = stage_a(s) + h * Cfg::kSlabBytes;
            const uint64_t desc_a = TRANS_A ? GmmaDesc(a0 + kk * 2048, Cfg::kAChunkBytes, 1024)
                                            : GmmaDesc(a0 + kk * 32, 16, 1024);
            Wgmma<BN, kBf16, TRANS_A ? 1 : 0, TRANS_B ? 0 : 1>(acc[h], desc_a, desc_b,
                                                               kt > 0 || kk > 0);
          }
        }
        WgmmaCommit();
        // The previous K tile's group has completed: release its stage.
        WgmmaWait<1>();
        if (kt > 0 && leader) MbarArrive(empty((it + K_STAGE - 1) % K_STAGE));
      }
      // Every wgmma of this tile is issued: the other consumer's next tile may start on the
      // tensor cores while this one's drain and its epilogue run.
      if (next_exists) NamedBarrierArrive(their_turn, 256);
      WgmmaWait<0>();
#pragma unroll
      for (int h = 0; h < Cfg::kSlabs; ++h)
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) FenceReg(acc[h][i]);
      if (leader) MbarArrive(empty((it + K_STAGE - 1) % K_STAGE));
      // Epilogue, slab by slab as the cooperative kernel's consumer c: accumulator 4j + {0,1}
      // is row lane/4 of the warp's 16, columns 8j + 2(lane%4) + {0,1}; 4j + {2,3} the same
      // columns 8 rows down. Unit u of row `row` sits at unit u ^ (row % 8) under the 128-byte
      // swizzle, so a store instruction's 8 rows land in 8 different units: no bank conflicts.
      const int r = warp * 16 + lane / 4;
      const uint32_t unit_xor = (r & 7) << 4;
      const uint32_t bufs = c_stage + c * 2 * Cfg::kCChunkBytes;
      const int epilogue = Cfg::kEpilogueBarrier + c;
#pragma unroll
      for (int h = 0; h < Cfg::kSlabs; ++h) {
        const int row0 = tm * BM + h * 64;
        if constexpr (kFp32Out) {
          // fp32: columns 8jj + 2(lane%4) + {0,1} of the chunk are bytes 32jj + 8(lane%4) of
          // its 256-byte row: box jj / 4 (32 columns), unit 2(jj%4) + (lane%4)/2, 8 bytes in.
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) {
            if (leader) BulkWaitRead<0>();  // the previous chunk's stores have read the buffer
            NamedBarrier(epilogue, 128);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
              const int a = 4 * (8 * j + jj);
              const uint32_t unit = 2 * (jj % 4) + (lane % 4) / 2;
              const uint32_t addr = bufs + (jj / 4) * Cfg::kCChunkBytes + r * 128 +
                                    ((unit << 4) ^ unit_xor) + 8 * (lane % 2);
              StShared(addr, acc[h][a], acc[h][a + 1]);
              StShared(addr + 8 * 128, acc[h][a + 2], acc[h][a + 3]);
            }
            FenceProxyAsync();
            NamedBarrier(epilogue, 128);
            if (leader) {
              TmaStore3d(&map_c, bufs, tn * BN + 64 * j, row0, item);
              TmaStore3d(&map_c, bufs + Cfg::kCChunkBytes, tn * BN + 64 * j + 32, row0, item);
              BulkCommit();
            }
          }
        } else {
          const uint32_t row_base = bufs + r * 128 + 4 * (lane % 4);
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) {
            // Chunks alternate between the two buffers over slabs and tiles alike (BN / 64 is
            // even); the store that last read this one (two chunks ago) must be done reading.
            const int b = j % 2;
            if (leader) BulkWaitRead<1>();
            NamedBarrier(epilogue, 128);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
              const int a = 4 * (8 * j + jj);
              const uint32_t addr = row_base + b * Cfg::kCChunkBytes + ((jj << 4) ^ unit_xor);
              StShared(addr, PackPair<T>(acc[h][a], acc[h][a + 1]));
              StShared(addr + 8 * 128, PackPair<T>(acc[h][a + 2], acc[h][a + 3]));
            }
            FenceProxyAsync();
            NamedBarrier(epilogue, 128);
            if (leader) {
              TmaStore3d(&map_c, bufs + b * Cfg::kCChunkBytes, tn * BN + 64 * j, row0, item);
              BulkCommit();
            }
          }
        }
      }
    }
    // The block's shared memory must outlive the last stores' reads of it.
    if (leader) BulkWaitAll();
  }
#endif
}

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_WGMMA_PINGPONG_CUH_
