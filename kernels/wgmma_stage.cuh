// The Hopper HGEMM family: TMA + wgmma, warp-specialized, persistent. C[M,N] = A[M,K] · B[K,N],
// row-major fp16 in and out, fp32 accumulators. sm_90a only (wgmma, setmaxnreg).
//
//   * A producer warpgroup (one elected thread) streams K tiles with cp.async.bulk.tensor (TMA,
//     128-byte swizzle) into a K_STAGE-deep shared-memory ring. Each stage has a "full"
//     mbarrier (the producer's expect_tx arrival plus the TMA's completed bytes) and an "empty"
//     mbarrier (one arrival per consumer warpgroup of the cluster once its wgmma have read the
//     stage).
//   * CLUSTER = 2: two blocks of a thread-block cluster take vertically adjacent tiles (the same
//     B columns) and each loads half of the B tile with TMA multicast into both blocks' shared
//     memory, so B crosses L2 once per pair; a stage is refilled only after the consumers of
//     both blocks released it (they arrive on both blocks' empty barriers).
//   * CONSUMERS warpgroups each own 64 rows of the BM = 64·CONSUMERS row block tile and issue
//     wgmma.m64n<BN>k16 with A K-major and B N-major (imm-trans-b: our B is row-major k×n),
//     both read straight from the swizzled stages through matrix descriptors. One K tile's
//     wgmma group stays in flight while the next is issued (wait_group 1); a stage is released
//     when the group that read it has completed.
//   * setmaxnreg moves registers from the producer (24) to the consumers (240).
//   * The grid is persistent (at most one block per SM, tiles strided by the grid); tiles (or
//     cluster pairs of tiles) are visited in groups of GROUP_M tile rows (pairs), column by
//     column, so that the blocks running at once share A row blocks and B column blocks in L2.
//   * Accumulation is always fp32 on the tensor cores: on sm_90 the f32 and f16 wgmma forms run
//     at the same rate, so fp16-accumulation requests get the same kernel (docs/kernels.md,
//     "What fp16 accumulation means").
//   * Epilogue, TMA_STORE = false: half2 stores straight from the accumulators, guarded per row
//     and column pair. TMA_STORE = true: each consumer warpgroup writes its 64-row slab in
//     64×64 chunks into a double-buffered, 128-byte-swizzled shared tile (conflict-free) and one
//     thread stores each chunk with a TMA tensor store (cp.async.bulk.tensor, clipped at M and
//     N), which completes while the warpgroup goes on to its next tile.
//   * Edges: TMA zero-fills load boxes past M, N and K (they add nothing to the sums).
//   * Watchdog: an mbarrier wait that lasts HGEMM_MBAR_TIMEOUT_NS (default 10 s; 0 disables)
//     traps, so a lost arrival or a wrong transaction count fails the launch instead of hanging
//     the stream. Real waits last microseconds.
//
// REQUIRES (checked by the registry): N % 8 == 0, K % 8 == 0 (TMA strides are 16-byte
// multiples), 16-byte aligned A, B, C.
// Thread safety: LaunchWgmmaStage may be called from any thread.
#ifndef HGEMM_KERNELS_WGMMA_STAGE_CUH_
#define HGEMM_KERNELS_WGMMA_STAGE_CUH_

#include <cuda.h>  // CUtensorMap (the type only: nothing links libcuda)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/wgmma_ops.cuh"

#ifndef HGEMM_MBAR_TIMEOUT_NS
#define HGEMM_MBAR_TIMEOUT_NS 10000000000ull
#endif

namespace hgemm::kernels::detail {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Experiment (EXP & 1): polls with the non-blocking test_wait instead of try_wait.
__device__ __forceinline__ void MbarSpin(uint32_t bar, uint32_t parity) {
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return;
  }
}

// Experiment (EXP & 2): remote arrive without .release.cluster.
__device__ __forceinline__ void MbarArriveClusterRelaxed(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

// Waits until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint64_t start = 0;
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return;
    if (HGEMM_MBAR_TIMEOUT_NS > 0) {
      const uint64_t now = GlobalTimerNs();
      if (start == 0) start = now;
      if (now - start > HGEMM_MBAR_TIMEOUT_NS) __trap();
    }
  }
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on the barrier at shared address `bar` of cluster block `cta` (this block's own
// included).
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every block of the cluster (none may have exited).
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// Arrives on `bar` and adds `bytes` to the transaction count its phase waits for.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// 2-D TMA load of the box at (c0 = innermost coordinate, c1) into shared memory at `dst`,
// completing its bytes on `bar`. Boxes reaching past the tensor are zero-filled (and still
// count their full size).
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The same load multicast to the blocks of `cta_mask` (same shared offsets, same barrier offset).
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}

// 2-D TMA store of the box at (c0, c1) from shared memory at `src`; parts past the tensor are
// not written. Commit and wait with the bulk-group functions below.
__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most N committed bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until every committed bulk group has completed (its writes are done).
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Makes this thread's shared-memory writes visible to the async proxy (TMA, wgmma).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier `id` (1-15) among `threads` threads (a warpgroup: 128).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void StShared(uint32_t addr, half2 v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<uint32_t*>(&v))
               : "memory");
}

// wgmma shared-memory matrix descriptor with 128-byte swizzle: start address, leading and
// stride byte offsets (bytes; encoded >> 4), layout type 1 (SWIZZLE_128B) in bits 62-63.
// A (K-major): SBO = 1024 between 8-row groups, LBO unused. B (N-major): LBO = bytes between
// 64-column blocks, SBO = 1024 between 8-row (K) groups (CUTLASS's canonical MN-major SW128
// layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))).
__device__ __forceinline__ uint64_t GmmaDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) |
         (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across a wgmma wait.
__device__ __forceinline__ void FenceReg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// @tparam BN         block tile columns (128 or 256: the wgmma N of each consumer).
// @tparam CONSUMERS  consumer warpgroups, 64 rows each (BM = 64 · CONSUMERS).
// @tparam K_STAGE    shared-memory ring depth, in K tiles of BK = 64.
// @tparam CLUSTER    blocks per cluster along M sharing each B tile by multicast (1 or 2).
// @tparam GROUP_M    tile rows (CLUSTER = 2: pairs of tile rows) per L2 group of the tile order.
// @tparam TMA_STORE  epilogue through swizzled shared memory and TMA stores (else half2 stores).
template <int BN, int CONSUMERS, int K_STAGE, int CLUSTER, int GROUP_M, bool TMA_STORE,
          int EXP = 0>
struct WgmmaStage {
  static constexpr int BM = 64 * CONSUMERS;
  static constexpr int BK = 64;  // one 128-byte swizzle row of fp16
  static_assert(BN == 128 || BN == 256, "wgmma wrappers exist for n128 and n256");
  static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
  static_assert(K_STAGE >= 2, "the ring needs two stages to overlap loads with wgmma");
  static_assert(GROUP_M >= 1, "a tile group holds at least one tile row");
  static_assert(CLUSTER == 1 || CLUSTER == 2, "one block, or a pair sharing B");
  static_assert((BN / 64) % CLUSTER == 0, "each block of a cluster loads whole 64-column chunks");
  static constexpr int kThreads = 128 * (CONSUMERS + 1);
  static constexpr int kStageABytes = BM * BK * 2;
  static constexpr int kStageBBytes = BK * BN * 2;
  static constexpr int kBChunkBytes = BK * 64 * 2;  // one TMA box: BK rows of 64 columns
  static constexpr int kStageBytes = kStageABytes + kStageBBytes;
  static_assert(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0,
                "128-byte swizzle atoms are 1024 bytes: every tile must start on one");
  // The epilogue's staging: two 64×64 fp16 chunks (8 KB each, 1024-aligned) per consumer.
  static constexpr int kCChunkBytes = 64 * 64 * 2;
  static constexpr int kCStageBytes = TMA_STORE ? CONSUMERS * 2 * kCChunkBytes : 0;
  // 1024 bytes of slack to align the ring, the ring, the epilogue's staging, then a full and an
  // empty barrier per stage.
  static constexpr size_t kSmemBytes =
      size_t(K_STAGE) * kStageBytes + kCStageBytes + 1024 + 16 * K_STAGE;
  static_assert(kSmemBytes <= 227 * 1024, "an sm_90 block gets at most 227 KB of shared memory");
  static constexpr int kAcc = BN / 2;  // fp32 accumulators per consumer thread
};

// map_c (box 64×64, 128-byte swizzle) is read only with TMA_STORE, C only without.
template <int BN, int CONSUMERS, int K_STAGE, int CLUSTER, int GROUP_M, bool TMA_STORE,
          int EXP = 0>
__global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
    WgmmaGemmKernel(const __grid_constant__ CUtensorMap map_a,
                    const __grid_constant__ CUtensorMap map_b,
                    const __grid_constant__ CUtensorMap map_c, half* __restrict__ C, int M, int N,
                    int K) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = WgmmaStage<BN, CONSUMERS, K_STAGE, CLUSTER, GROUP_M, TMA_STORE, EXP>;
  auto wait = [](uint32_t bar, uint32_t parity) {
    if constexpr ((EXP & 1) != 0) MbarSpin(bar, parity); else MbarWait(bar, parity);
  };
  constexpr int BM = Cfg::BM, BK = Cfg::BK;
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
      MbarInit(empty(s), CONSUMERS * CLUSTER);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // The peer's multicasts and arrivals may reach this block's barriers once both are past here.
  if constexpr (CLUSTER > 1) ClusterSync(); else __syncthreads();
  const uint32_t rank = CLUSTER > 1 ? ClusterRank() : 0;

  // Work units: one tile, or a cluster's pair of vertically adjacent tiles (rank 1 takes the
  // lower one; past M it computes zeros and stores nothing, but still shares its B loads).
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int units_m = (tiles_m + CLUSTER - 1) / CLUSTER;
  const int num_units = units_m * tiles_n, k_tiles = (K + BK - 1) / BK;
  const int first_unit = blockIdx.x / CLUSTER, unit_stride = gridDim.x / CLUSTER;
  auto tile_coords = [&](int u, int& tm, int& tn) {
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (u / per_group) * GROUP_M;
    const int rows = min(units_m - first_m, GROUP_M);
    const int r = u % per_group;
    tm = (first_m + r % rows) * CLUSTER + int(rank);
    tn = r / rows;
  };

  if (threadIdx.x < 128) {
    // Producer warpgroup: one thread issues every TMA.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x == 0) {
      int it = 0;  // K tiles issued so far, over all of this block's tiles
      for (int u = first_unit; u < num_units; u += unit_stride) {
        int tm, tn;
        tile_coords(u, tm, tn);
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % K_STAGE;
          wait(empty(s), ((it / K_STAGE) & 1) ^ 1);  // the first round passes at once
          MbarArriveExpectTx(full(s), Cfg::kStageBytes);  // the peer's B half lands here too
          TmaLoad2d(stage_a(s), &map_a, kt * BK, tm * BM, full(s));
          constexpr bool kMulticast = CLUSTER > 1 && (EXP & 4) == 0;
          constexpr int kChunks = BN / 64 / (kMulticast ? CLUSTER : 1);  // B chunks loaded here
#pragma unroll
          for (int i = 0; i < kChunks; ++i) {
            const int j = (kMulticast ? int(rank) : 0) * kChunks + i;
            if constexpr (kMulticast)
              TmaLoad2dMulticast(stage_b(s) + j * Cfg::kBChunkBytes, &map_b, tn * BN + 64 * j,
                                 kt * BK, full(s), (1u << CLUSTER) - 1);
            else
              TmaLoad2d(stage_b(s) + j * Cfg::kBChunkBytes, &map_b, tn * BN + 64 * j, kt * BK,
                        full(s));
          }
        }
      }
    }
  } else {
    // Consumer warpgroups.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int c = threadIdx.x / 128 - 1;  // rows 64c .. 64c+63 of the block tile
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    // Thread d < CLUSTER of each consumer warpgroup releases stages in cluster block d.
    const bool releases = threadIdx.x % 128 < CLUSTER;
    auto release = [&](int s) {
      if (!releases) return;
      if constexpr (CLUSTER > 1 && (EXP & 2) != 0) MbarArriveClusterRelaxed(empty(s), threadIdx.x % 128);
      else if constexpr (CLUSTER > 1) MbarArriveCluster(empty(s), threadIdx.x % 128);
      else MbarArrive(empty(s));
    };
    float acc[Cfg::kAcc];
    int it = 0;  // K tiles consumed so far, in the producer's order
    for (int u = first_unit; u < num_units; u += unit_stride) {
      int tm, tn;
      tile_coords(u, tm, tn);
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % K_STAGE;
        wait(full(s), (it / K_STAGE) & 1);
        const uint32_t a0 = stage_a(s) + c * 64 * 128;  // 64 rows of 128 bytes
        const uint32_t b0 = stage_b(s);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)  // 16 K = 32 bytes of an A row, 2 atoms of B rows
          Wgmma<BN>(acc, GmmaDesc(a0 + kk * 32, 16, 1024),
                    GmmaDesc(b0 + kk * 2048, Cfg::kBChunkBytes, 1024), kt > 0 || kk > 0);
        WgmmaCommit();
        // The previous K tile's group has completed: release its stage.
        WgmmaWait<1>();
        if (kt > 0) release((it + K_STAGE - 1) % K_STAGE);
      }
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) FenceReg(acc[i]);
      release((it + K_STAGE - 1) % K_STAGE);
      // Epilogue: accumulator 4j + {0,1} is row lane/4 of the warp's 16, columns
      // 8j + 2(lane%4) + {0,1}; 4j + {2,3} the same columns 8 rows down.
      if constexpr (TMA_STORE) {
        const bool leader = threadIdx.x % 128 == 0;
        // This thread's rows r and r + 8 of the slab, bytes 4(lane%4) .. +3 of each 16-byte unit.
        // Under the 128-byte swizzle, unit u of row `row` sits at unit u ^ (row % 8) (rows r and
        // r + 8 alike): the 8 rows a store instruction touches land in 8 different units, so
        // the stores are free of bank conflicts.
        const int r = warp * 16 + lane / 4;
        const uint32_t row_base = c_stage + c * 2 * Cfg::kCChunkBytes + r * 128 + 4 * (lane % 4);
        const uint32_t unit_xor = (r & 7) << 4;
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) {
          const uint32_t buf = c_stage + (c * 2 + j % 2) * Cfg::kCChunkBytes;
          // The store that last read this buffer (two chunks ago) must have finished reading.
          if (leader) BulkWaitRead<1>();
          NamedBarrier(1 + c, 128);
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const int a = 4 * (8 * j + jj);
            const uint32_t addr = row_base + (j % 2) * Cfg::kCChunkBytes + ((jj << 4) ^ unit_xor);
            StShared(addr, __floats2half2_rn(acc[a], acc[a + 1]));
            StShared(addr + 8 * 128, __floats2half2_rn(acc[a + 2], acc[a + 3]));
          }
          FenceProxyAsync();
          NamedBarrier(1 + c, 128);
          if (leader) {
            TmaStore2d(&map_c, buf, tn * BN + 64 * j, tm * BM + c * 64);
            BulkCommit();
          }
        }
      } else {
        const int row0 = tm * BM + c * 64 + warp * 16 + lane / 4;
        const int col0 = tn * BN + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = col0 + 8 * j;
          if (col < N) {
            if (row0 < M)
              *reinterpret_cast<half2*>(C + size_t(row0) * N + col) =
                  __floats2half2_rn(acc[4 * j], acc[4 * j + 1]);
            if (row0 + 8 < M)
              *reinterpret_cast<half2*>(C + size_t(row0 + 8) * N + col) =
                  __floats2half2_rn(acc[4 * j + 2], acc[4 * j + 3]);
          }
        }
      }
    }
    // The block's shared memory must outlive the last stores' reads of it.
    if constexpr (TMA_STORE)
      if (threadIdx.x % 128 == 0) BulkWaitAll();
  }
  // No block may leave while its peer can still arrive on its barriers.
  if constexpr (CLUSTER > 1) ClusterSync();
#endif
}

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_WGMMA_STAGE_CUH_
