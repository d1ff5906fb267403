// The Hopper HGEMM family: TMA + wgmma, warp-specialized, persistent. C[M,N] = op(A)·op(B) on
// row-major storage, fp16 or bf16 in and the same type or fp32 out, fp32 accumulators, any of the
// four layouts (NN, NT, TN, TT; op(A) is A or Aᵀ as cuBLAS's transa). sm_90a only (wgmma,
// setmaxnreg).
//
//   * A producer warpgroup (one elected thread) streams K tiles with cp.async.bulk.tensor (TMA,
//     128-byte swizzle) into a K_STAGE-deep shared-memory ring. Each stage has a "full"
//     mbarrier (the producer's expect_tx arrival plus the TMA's completed bytes) and an "empty"
//     mbarrier (one arrival per consumer warpgroup once its wgmma have read the stage).
//   * CONSUMERS warpgroups each own 64 rows of the BM = 64·CONSUMERS row block tile and issue
//     wgmma.m64n<BN>k16, both operands read straight from the swizzled stages through matrix
//     descriptors. Layouts: wgmma reads either operand K-major or MN-major (imm-trans-a/b), and
//     TMA loads either, so a layout changes only the boxes and the descriptors, not the ring:
//       A as stored m×k (K-major): one box of BM rows × 64 K per stage, descriptor advanced 32
//         bytes per k16 within the 128-byte swizzle row (SBO 1024 between 8-row groups);
//       A stored k×m (TRANS_A, M-major): BM/64 boxes of 64 K rows × 64 M columns, imm-trans-a 1,
//         advanced 2048 bytes (16 K rows) per k16; consumer c reads box c;
//       B stored k×n (N-major): BN/64 boxes of 64 K × 64 N, imm-trans-b 1, LBO = one box between
//         64-column blocks (CUTLASS's MN-major SW128 ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)));
//       B stored n×k (TRANS_B, K-major, the nn.Linear weight): one box of BN rows × 64 K,
//         imm-trans-b 0, the same descriptor as a K-major A.
//     A consumer's 64-row slab starts 8192 bytes in either way. One K tile's
//     wgmma group stays in flight while the next is issued (wait_group 1); a stage is released
//     when the group that read it has completed.
//   * setmaxnreg moves registers from the producer (24) to the consumers (240).
//   * The grid is persistent (at most one block per SM, tiles strided by the grid); tiles are
//     visited in groups of GROUP_M tile rows, column by column, so that the blocks running at
//     once share A row blocks and B column blocks in L2.
//   * Strided batches in the same launch: every tensor map is 3-D, the batch item outermost
//     (its stride the item stride; 1 item for a single GEMM), and the tile loop runs over
//     batch × tiles, item by item, so that a batch of small GEMMs fills the machine as one grid
//     instead of one launch per item. Boxes stay within an item's rows and columns.
//   * Groups (problems of different shapes, one layout and type pair) in the same launch: each
//     problem's tensor maps and shape lie in a device array (GroupProblem) with the index of
//     its first tile; a block walks its tiles forward with a cursor over the problems and
//     acquires a problem's maps (fence.proxy.tensormap) when it reaches it. K varies per
//     problem, so the ring's stage count runs on across tiles of different K.
//   * Accumulation is always fp32 on the tensor cores: on sm_90 the f32 and f16 wgmma forms run
//     at the same rate, so fp16-accumulation requests get the same kernel (docs/kernels.md,
//     "What fp16 accumulation means").
//   * Epilogue: each consumer warpgroup writes its 64-row slab in 64×64 chunks into a
//     double-buffered, 128-byte-swizzled shared tile (conflict-free) and one thread stores each
//     chunk with a TMA tensor store, which completes while the warpgroup goes on to its next
//     tile (docs/kernels_notes.md, run 6: +8–10 % over half2 stores from registers). An fp32
//     C (TC = float) needs twice the bytes per chunk: the same 16 KB per consumer hold one
//     64×64 fp32 chunk as two 64-row × 32-column boxes (128-byte rows, swizzled alike), single-
//     buffered (each chunk waits for the previous store's reads).
//   * α/β (C = α·acc + β·C_in, cublasGemmEx's scaling): a runtime argument, one uniform branch
//     per tile between the plain epilogue and the scaled one. With β ≠ 0 the leader prefetches
//     the slab's C_in boxes into L2 at the tile's start, and TMA loads C_in chunk by chunk into
//     the same staging buffer, through a tensor map of C_in with C's boxes: each thread reads
//     its C_in pair at the very address it then overwrites with its result (one mbarrier per
//     buffer). The first pair of chunks is loaded while the last K tile's wgmma runs. β = 0
//     reads no C_in (NaN there stays out). C_in may be C: each element's C_in is read by its
//     chunk's load, which completes before the chunk's result is written and stored, and no
//     other chunk or tile touches it (docs/kernels_notes.md, "α/β fused").
//   * Edges: TMA zero-fills load boxes past M, N and K (they add nothing to the sums; a C_in box
//     reads zeros there) and clips stores at M and N.
//   * CLUSTER_M = 2 (experimental): blocks run in clusters of two along M. The two blocks of
//     a cluster take tile rows 2i and 2i + 1 of the same tile column, so they need the same B
//     tile: each loads half of it and TMA multicasts that half into both blocks' stages, which
//     halves B's traffic from L2 (at 8192³ the 128×256 tiles pull ~12.9 GB through L2 in
//     ~1.45 ms, ~8.9 TB/s: docs/kernels_notes.md, "operand traffic from L2"). A stage is then
//     written by both producers, so its "empty" barrier counts the consumers of both blocks (each
//     consumer arrives on its own block's and its peer's), and a block leaves only after a
//     cluster barrier, when no peer can still arrive on its barriers. The tile order runs over
//     pairs of tile rows; past an odd M's last tile row a block computes a tile of zeros
//     whose stores TMA clips away entirely. Not for groups.
//   * STREAM_K (experimental): the tiles of a last, partial wave are cut along K evenly over
//     the blocks (kernels/stream_k.h) instead of leaving the SMs without a tile idle for a
//     whole tile's time: at 8192³, 2048 128×256 tiles on 132 SMs are 15.5 waves, so ~3 % of
//     the plain grid's time has SMs waiting. A block whose share ends or starts inside a tile
//     writes its fp32 accumulators to a slot in global memory, fences, and counts itself in;
//     the block that completes the count reads all the tile's slots back in block order
//     (the same C whichever block comes last), then runs the usual epilogue (α/β included).
//     Nothing waits on another block, so co-residency is not assumed. Not for groups or
//     clusters.
//   * Watchdog: an mbarrier wait that lasts HGEMM_MBAR_TIMEOUT_NS (default 10 s; 0 disables)
//     traps, so a lost arrival or a wrong transaction count fails the launch instead of hanging
//     the stream. Real waits last microseconds.
//
// REQUIRES (checked by the registry): every stored row stride a 16-byte multiple (N % 8 == 0,
// K % 8 == 0, M % 8 == 0 with TRANS_A, lda/ldb/ldc % 8 == 0), 16-byte aligned A, B, C; batch
// item strides 16-byte multiples under 2^40 bytes, at least one item's extent; batch × tiles <
// 2^31.
// Thread safety: LaunchWgmmaStage may be called from any thread.
#ifndef HGEMM_KERNELS_WGMMA_STAGE_CUH_
#define HGEMM_KERNELS_WGMMA_STAGE_CUH_

#include <cuda.h>  // CUtensorMap (the type only: nothing links libcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/stream_k.h"
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

// Arrives on `bar` and adds `bytes` to the transaction count its phase waits for.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// 3-D TMA load of the box at (c0 = innermost coordinate, c1, item) into shared memory at
// `dst`, completing its bytes on `bar`. The outermost dimension is the batch item (1 for a
// single GEMM). Boxes reaching past the item's rows or columns are zero-filled (and still count
// their full size); they never reach into the next item.
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          int item, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(item), "r"(bar)
      : "memory");
}

// TmaLoad3d into the same shared-memory offset `dst` of every block of the cluster in
// `cta_mask` (bit r: cluster rank r), completing its bytes on each one's barrier at offset
// `bar`.
__device__ __forceinline__ void TmaLoad3dMulticast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, int item, uint32_t bar,
                                                   uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(item), "r"(bar), "h"(cta_mask)
      : "memory");
}

// Arrives on the barrier at shared-memory offset `bar` of cluster rank `cta` (this block's own
// rank included). The default .release.cta, as CUTLASS's ClusterBarrier::arrive: a consumer's
// reads of a stage are over once wgmma.wait_group returns, so nothing needs a wider fence, and
// ptxas makes .release.cluster a GPU-scope fence before every arrive (measured: the cluster
// pair at 0.40-0.46x cuBLAS with two such arrives per K tile).
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

// Every thread of every block of the cluster arrives, then waits for all of them: memory
// operations before it (barrier initialisation, remote arrivals) are visible after it. Not
// .aligned: a warp may reach it diverged (the producer warp's elected thread comes last).
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// 3-D TMA store of the box at (c0, c1, item) from shared memory at `src`; parts past the
// item's rows or columns are not written. Commit and wait with the bulk-group functions below.
__device__ __forceinline__ void TmaStore3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                           int item) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(item)
      : "memory");
}
// Asks TMA to bring the box at (c0, c1, item) into L2 (no shared memory, no completion to wait
// for): C_in of a scaled tile, so that its loads in the epilogue hit L2.
__device__ __forceinline__ void TmaPrefetchL2(const CUtensorMap* map, int c0, int c1, int item) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(item)
               : "memory");
}
// Makes a tensor map in global memory that the host wrote before the launch visible to the
// tensor-map proxy that TMA reads it through (grouped launches; 128 bytes, one CUtensorMap).
__device__ __forceinline__ void TensorMapAcquire(const CUtensorMap* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(
                   reinterpret_cast<uint64_t>(map))
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
// NamedBarrier that also returns whether `p` held in any of its threads (bar.red.or).
__device__ __forceinline__ bool NamedBarrierAny(int id, int threads, bool p) {
  uint32_t any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(uint32_t(p)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}
__device__ __forceinline__ void StShared(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void StShared(uint32_t addr, float lo, float hi) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(lo), "f"(hi) : "memory");
}
__device__ __forceinline__ uint32_t LdShared(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float2 LdSharedF2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
// Two fp32 accumulators rounded to the output type T (__half or __nv_bfloat16), packed low-first.
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
  half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// The inverse of PackPair: two packed elements of T, low first, as fp32.
template <typename T>
__device__ __forceinline__ float2 UnpackPair(uint32_t v);
template <>
__device__ __forceinline__ float2 UnpackPair<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<half2*>(&v));
}
template <>
__device__ __forceinline__ float2 UnpackPair<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}

// wgmma shared-memory matrix descriptor with 128-byte swizzle: start address, leading and
// stride byte offsets (bytes; encoded >> 4), layout type 1 (SWIZZLE_128B) in bits 62-63.
// A (K-major): SBO = 1024 between 8-row groups, LBO unused. B (N-major): LBO = bytes between
// 64-column blocks, SBO = 1024 between 8-row (K) groups (CUTLASS's canonical MN-major SW128
// layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))).
__device__ __forceinline__ uint64_t GmmaDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
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
// @tparam GROUP_M    tile rows per L2 group of the persistent tile order.
// (The kernel adds TRANS_A, TRANS_B and the element type T; they change no size below.)
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M>
struct WgmmaStage {
  static constexpr int BM = 64 * CONSUMERS;
  static constexpr int BK = 64;  // one 128-byte swizzle row of fp16
  static_assert(BN == 128 || BN == 256, "wgmma wrappers exist for n128 and n256");
  static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
  static_assert(K_STAGE >= 2, "the ring needs two stages to overlap loads with wgmma");
  static_assert(GROUP_M >= 1, "a tile group holds at least one tile row");
  static constexpr int kThreads = 128 * (CONSUMERS + 1);
  static constexpr int kStageABytes = BM * BK * 2;
  static constexpr int kStageBBytes = BK * BN * 2;
  static constexpr int kBChunkBytes = BK * 64 * 2;  // one TMA box: BK rows of 64 columns
  static constexpr int kAChunkBytes = BK * 64 * 2;  // TRANS_A: one box of BK rows × 64 M
  static_assert(kAChunkBytes == 64 * BK * 2, "a consumer's 64-row slab is one box either way");
  static constexpr int kStageBytes = kStageABytes + kStageBBytes;
  static_assert(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0,
                "128-byte swizzle atoms are 1024 bytes: every tile must start on one");
  // The epilogue's staging: two 64×64 fp16 chunks (8 KB each, 1024-aligned) per consumer.
  static constexpr int kCChunkBytes = 64 * 64 * 2;
  static constexpr int kCStageBytes = CONSUMERS * 2 * kCChunkBytes;
  // 1024 bytes of slack to align the ring, the ring, the epilogue's staging, then a full and an
  // empty barrier per stage and, per consumer, one C_in barrier per staging buffer (α/β).
  static constexpr size_t kSmemBytes =
      size_t(K_STAGE) * kStageBytes + kCStageBytes + 1024 + 16 * K_STAGE + 16 * CONSUMERS;
  static_assert(kSmemBytes <= 227 * 1024, "an sm_90 block gets at most 227 KB of shared memory");
  static constexpr int kAcc = BN / 2;  // fp32 accumulators per consumer thread
};

// One problem of a grouped launch, in a device array the host fills before the launch: its
// tensor maps (one item each; c_in is C_in's, read with β ≠ 0, else a copy of c), its shape and
// the index of its first tile in the launch.
struct GroupProblem {
  CUtensorMap a, b, c, c_in;
  int m, n, k, first_tile;
};
static_assert(alignof(GroupProblem) % 64 == 0,
              "TMA reads a tensor map at a 64-byte aligned address");

// The stream-K tail of a launch (STREAM_K; kernels/stream_k.h says how it is split): where its
// blocks leave their fp32 sums of shared tiles, tail_blocks × 2 slots × BM·BN floats, each
// consumer's 64×BN laid out [accumulator][thread], and how many of a tile's blocks have left
// theirs, tail_tiles × CONSUMERS counters, 0 at the launch.
struct StreamKTail {
  float* partials = nullptr;
  int* counters = nullptr;
  StreamKSplit split;
};

// Tile t of an item (or problem) of tiles_m × tiles_n tiles, in groups of GROUP_M tile rows
// visited column by column.
template <int GROUP_M>
__device__ __forceinline__ void GroupedOrder(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = GROUP_M * tiles_n;
  const int first_m = (t / per_group) * GROUP_M;
  const int rows = min(tiles_m - first_m, GROUP_M);
  const int r = t % per_group;
  tm = first_m + r % rows;
  tn = r / rows;
}

// Where one tile's work lies: its group problem (nullptr in a batch), the batch item, the
// tile, its K tiles.
struct TileWork {
  const GroupProblem* problem;
  int item, tm, tn, k_tiles;
};

// Tensor maps (row-major T, 128-byte swizzle; 3-D, the batch item outermost), boxes as stored:
// A of BM rows × 64 K (TRANS_A: 64 K rows × 64 M columns), B of 64 K × 64 columns (TRANS_B: BN
// rows × 64 K), C and C_in of 64 × 64 (C's type). Either a strided batch (group_count = 0:
// map_a/b/c/c_in, M, N, K; num_tiles = the items × the tiles of M×N) or a group (group_count ≥
// 1 problems of `group`, each with its own maps and shape, in order of first_tile; num_tiles =
// all their tiles; map_a/b/c/c_in, M, N and K unused). C = alpha·op(A)·op(B) + beta·C_in, for
// the whole launch; alpha = 1, beta = 0 is the plain GEMM (the epilogue as before), beta = 0
// never reads C_in (map_c_in may then be any valid map).
// @tparam BN, CONSUMERS, K_STAGE, GROUP_M  see WgmmaStage.
// @tparam TRANS_A  A is stored k×m (op(A) = Aᵀ): read M-major.
// @tparam TRANS_B  B is stored n×k (op(B) = Bᵀ): read K-major.
// @tparam T        element type of A and B: __half or __nv_bfloat16.
// @tparam TC       element type of C: T, or float (C's tensor map then has boxes of 64 × 32).
// @tparam CLUSTER_M  1, or 2: clusters of two blocks along M sharing B (the header says how);
//                  then num_tiles counts pairs of tile rows × tile columns × items, B's tensor
//                  map has half-width boxes (TRANS_B: BN / 2 rows), the grid is a whole number
//                  of clusters, and group_count is 0.
// @tparam STREAM_K  num_tiles are the whole waves; `tail` the tiles after them, cut along K
//                  (the header says how); group_count is 0 and CLUSTER_M 1. Otherwise `tail`
//                  is unused.
template <int BN, int CONSUMERS, int K_STAGE, int GROUP_M, bool TRANS_A = false,
          bool TRANS_B = false, typename T = __half, typename TC = T, int CLUSTER_M = 1,
          bool STREAM_K = false>
__global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
    WgmmaGemmKernel(const __grid_constant__ CUtensorMap map_a,
                    const __grid_constant__ CUtensorMap map_b,
                    const __grid_constant__ CUtensorMap map_c,
                    const __grid_constant__ CUtensorMap map_c_in, int M, int N, int K,
                    int num_tiles, const GroupProblem* __restrict__ group, int group_count,
                    float alpha, float beta, StreamKTail tail) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = WgmmaStage<BN, CONSUMERS, K_STAGE, GROUP_M>;
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
  // Consumer c's C_in barrier of staging buffer b (0 or 1): the leader's expect_tx, the load's
  // bytes.
  auto c_in_full = [&](int c, int b) { return bars + 8 * (2 * K_STAGE + 2 * c + b); };
  auto stage_a = [&](int s) { return ring + s * Cfg::kStageBytes; };
  auto stage_b = [&](int s) { return ring + s * Cfg::kStageBytes + Cfg::kStageABytes; };

  static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of one or two blocks along M");
  static_assert(!STREAM_K || CLUSTER_M == 1, "a stream-K tail is shared by single blocks");
  if (threadIdx.x == 0) {
    for (int s = 0; s < K_STAGE; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), CONSUMERS * CLUSTER_M);  // a stage is read by every block it fills
    }
    for (int c = 0; c < CONSUMERS; ++c) {
      MbarInit(c_in_full(c, 0), 1);
      MbarInit(c_in_full(c, 1), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // With a peer, its barriers must be initialised before this block multicasts or arrives.
  if constexpr (CLUSTER_M > 1) {
    ClusterSync();
  } else {
    __syncthreads();
  }
  // This block's rank in its cluster. The tile loops below run over the cluster's units, from
  // blockIdx.x / CLUSTER_M in strides of the grid's clusters (blocks, when CLUSTER_M is 1).
  const int rank = CLUSTER_M > 1 ? int(ClusterRank()) : 0;

  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  // Rows of the tile order: pairs of tile rows in a cluster (tile row CLUSTER_M·i + rank).
  const int unit_rows = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;
  const int tiles_per_item = unit_rows * tiles_n;
  // Tile t of a batch: item t / tiles_per_item, then the grouped order within the item. Of a
  // group: the problem whose tiles hold t (a block's tiles only move forward, and so does its
  // cursor), then the grouped order within the problem.
  int cursor = -1;
  // The maps of a tile: the grid constants in a batch, the problem's in a group.
  auto maps_a = [&](const TileWork& w) { return w.problem ? &w.problem->a : &map_a; };
  auto maps_b = [&](const TileWork& w) { return w.problem ? &w.problem->b : &map_b; };
  auto maps_c = [&](const TileWork& w) { return w.problem ? &w.problem->c : &map_c; };
  auto maps_c_in = [&](const TileWork& w) { return w.problem ? &w.problem->c_in : &map_c_in; };
  auto locate = [&](int t, TileWork& w) {
    if (group_count == 0) {
      w.problem = nullptr;
      w.item = t / tiles_per_item;
      GroupedOrder<GROUP_M>(t - w.item * tiles_per_item, unit_rows, tiles_n, w.tm, w.tn);
      w.tm = w.tm * CLUSTER_M + rank;
      w.k_tiles = (K + BK - 1) / BK;
      return;
    }
    int p = max(cursor, 0);
    while (p + 1 < group_count && group[p + 1].first_tile <= t) ++p;
    const GroupProblem& g = group[p];
    w.problem = &g;
    if (p != cursor) {
      TensorMapAcquire(&g.a);
      TensorMapAcquire(&g.b);
      TensorMapAcquire(&g.c);
      TensorMapAcquire(&g.c_in);
      cursor = p;
    }
    w.item = 0;
    GroupedOrder<GROUP_M>(t - g.first_tile, (g.m + BM - 1) / BM, (g.n + BN - 1) / BN, w.tm, w.tn);
    w.k_tiles = (g.k + BK - 1) / BK;
  };
  // With STREAM_K, after the block's whole tiles: its share of the tail, f(w, kb, ke, st) for K
  // tiles [kb, ke) of tail tile st.
  auto for_each_tail_unit = [&](auto&& f) {
    if constexpr (STREAM_K) {
      const int k_tiles = (K + BK - 1) / BK;
      ForEachTailUnit(tail.split, k_tiles, int(blockIdx.x), [&](int st, int kb, int ke) {
        TileWork w;
        locate(num_tiles + st, w);
        f(w, kb, ke, st);
      });
    }
  };

  if (threadIdx.x < 128) {
    // Producer warpgroup: one thread issues every TMA.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x == 0) {
      int it = 0;  // K tiles issued so far, over all of this block's tiles
      // K tiles [kb, ke) of tile w.
      auto produce = [&](const TileWork& w, int kb, int ke, int /*st*/) {
        const int item = w.item, tm = w.tm, tn = w.tn;
        for (int kt = kb; kt < ke; ++kt, ++it) {
          const int s = it % K_STAGE;
          MbarWait(empty(s), ((it / K_STAGE) & 1) ^ 1);  // the first round passes at once
          MbarArriveExpectTx(full(s), Cfg::kStageBytes);
          if constexpr (TRANS_A) {
#pragma unroll
            for (int j = 0; j < BM / 64; ++j)
              TmaLoad3d(stage_a(s) + j * Cfg::kAChunkBytes, maps_a(w), tm * BM + 64 * j, kt * BK,
                        item, full(s));
          } else {
            TmaLoad3d(stage_a(s), maps_a(w), kt * BK, tm * BM, item, full(s));
          }
          if constexpr (CLUSTER_M > 1) {
            // This block's half of B, into both blocks: BN / 2 rows of 128 bytes (TRANS_B), or
            // BN / 128 of the 64-column boxes.
            constexpr uint16_t kBoth = 0b11;
            if constexpr (TRANS_B) {
              TmaLoad3dMulticast(stage_b(s) + rank * (BN / 2) * 128, maps_b(w), kt * BK,
                                 tn * BN + rank * (BN / 2), item, full(s), kBoth);
            } else {
#pragma unroll
              for (int j = rank * BN / 128; j < (rank + 1) * BN / 128; ++j)
                TmaLoad3dMulticast(stage_b(s) + j * Cfg::kBChunkBytes, maps_b(w), tn * BN + 64 * j,
                                   kt * BK, item, full(s), kBoth);
            }
          } else if constexpr (TRANS_B) {
            TmaLoad3d(stage_b(s), maps_b(w), kt * BK, tn * BN, item, full(s));
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              TmaLoad3d(stage_b(s) + j * Cfg::kBChunkBytes, maps_b(w), tn * BN + 64 * j, kt * BK,
                        item, full(s));
          }
        }
      };
      for (int t = blockIdx.x / CLUSTER_M; t < num_tiles; t += gridDim.x / CLUSTER_M) {
        TileWork w;
        locate(t, w);
        produce(w, 0, w.k_tiles, -1);
      }
      for_each_tail_unit(produce);
    }
  } else {
    // Consumer warpgroups.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int c = threadIdx.x / 128 - 1;  // rows 64c .. 64c+63 of the block tile
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const bool leader = threadIdx.x % 128 == 0;  // releases stages, issues the C stores
    auto release = [&](int s) {
      if (!leader) return;
      if constexpr (CLUSTER_M > 1) {
#pragma unroll
        for (int r = 0; r < CLUSTER_M; ++r) MbarArriveCluster(empty(s), r);
      } else {
        MbarArrive(empty(s));
      }
    };
    // Uniform over the launch: the plain epilogue unless alpha or beta asks for scaling.
    const bool scaled = alpha != 1.0f || beta != 0.0f;
    const bool read_c_in = beta != 0.0f;
    // C_in chunks this consumer has consumed so far (all tiles): the parity of its barriers. A
    // tile has BN / 64 chunks, an even count, so chunk j of a tile uses buffer j % 2.
    int c_in_chunks = 0;
    float acc[Cfg::kAcc];
    int it = 0;  // K tiles consumed so far, in the producer's order
    // K tiles [kb, ke) of tile w, then its epilogue. st ≥ 0: tail tile st (STREAM_K), whose
    // other K tiles other blocks may hold: then the sums meet first, and only the block that
    // completes the tile stores it.
    auto consume = [&](const TileWork& w, int kb, int ke, int st) {
      const int item = w.item, tm = w.tm, tn = w.tn;
      const bool shared_tile = STREAM_K && st >= 0 && (kb > 0 || ke < w.k_tiles);
      const int c_row = tm * BM + c * 64;  // the slab's first row of C
      // C_in chunk j (64 columns) into its staging buffer(s), completing on its barrier: two
      // 64×32 boxes filling both buffers for fp32, one 64×64 box into buffer j % 2 otherwise.
      // REQUIRES: the stores that last read the buffer(s) have read them (BulkWaitRead).
      auto load_c_in = [&](int j) {
        const uint32_t buf = c_stage + (c * 2 + (kFp32Out ? 0 : j % 2)) * Cfg::kCChunkBytes;
        const uint32_t bar = c_in_full(c, kFp32Out ? 0 : j % 2);
        MbarArriveExpectTx(bar, kFp32Out ? 2 * Cfg::kCChunkBytes : Cfg::kCChunkBytes);
        TmaLoad3d(buf, maps_c_in(w), tn * BN + 64 * j, c_row, item, bar);
        if constexpr (kFp32Out)
          TmaLoad3d(buf + Cfg::kCChunkBytes, maps_c_in(w), tn * BN + 64 * j + 32, c_row, item, bar);
      };
      if (read_c_in && leader) {
#pragma unroll
        for (int x = 0; x < BN; x += kFp32Out ? 32 : 64)
          TmaPrefetchL2(maps_c_in(w), tn * BN + x, c_row, item);
      }
      for (int kt = kb; kt < ke; ++kt, ++it) {
        const int s = it % K_STAGE;
        MbarWait(full(s), (it / K_STAGE) & 1);
        const uint32_t a0 = stage_a(s) + c * 64 * 128;  // 64 rows of 128 bytes (or box c)
        const uint32_t b0 = stage_b(s);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          // 16 K: 32 bytes along a K-major row, or 2 swizzle atoms (16 rows) of an MN-major box.
          const uint64_t desc_a = TRANS_A ? GmmaDesc(a0 + kk * 2048, Cfg::kAChunkBytes, 1024)
                                          : GmmaDesc(a0 + kk * 32, 16, 1024);
          const uint64_t desc_b = TRANS_B ? GmmaDesc(b0 + kk * 32, 16, 1024)
                                          : GmmaDesc(b0 + kk * 2048, Cfg::kBChunkBytes, 1024);
          Wgmma<BN, kBf16, TRANS_A ? 1 : 0, TRANS_B ? 0 : 1>(acc, desc_a, desc_b,
                                                             kt > kb || kk > 0);
        }
        WgmmaCommit();
        // The previous K tile's group has completed: release its stage.
        WgmmaWait<1>();
        if (kt > kb) release((it + K_STAGE - 1) % K_STAGE);
      }
      // While the last K tile's group runs: C_in's first chunks (a pair of 16-bit ones, or one
      // fp32 one), once the previous tile's stores have read the buffers (long since).
      if (read_c_in && leader && !shared_tile) {
        BulkWaitRead<0>();
        load_c_in(0);
        if constexpr (!kFp32Out) load_c_in(1);
      }
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) FenceReg(acc[i]);
      release((it + K_STAGE - 1) % K_STAGE);
      if constexpr (STREAM_K) {
        if (shared_tile) {
          // This block's sums out (its slot of the tile), fenced, then counted in; the block
          // whose count completes the tile's reads every slot back in block order.
          const int k_tiles = w.k_tiles;
          const TailBlocks sharing = TailBlocksOf(tail.split, k_tiles, st);
          auto sums = [&](int b) {
            const size_t slot = size_t(b) * 2 + TailSlot(tail.split, k_tiles, b, st);
            return tail.partials + (slot * CONSUMERS + c) * size_t(64 * BN) + threadIdx.x % 128;
          };
          float* const mine = sums(int(blockIdx.x));
#pragma unroll
          for (int i = 0; i < Cfg::kAcc; ++i) __stcg(mine + 128 * i, acc[i]);
          __threadfence();
          NamedBarrier(1 + c, 128);  // every thread's sums are out before the count
          bool completes = false;
          if (leader) {
            completes =
                atomicAdd(tail.counters + st * CONSUMERS + c, 1) == sharing.last - sharing.first;
          }
          if (!NamedBarrierAny(1 + c, 128, completes)) return;  // another block stores it
          __threadfence();
#pragma unroll
          for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = __ldcg(sums(sharing.first) + 128 * i);
          for (int b = sharing.first + 1; b <= sharing.last; ++b) {
            const float* const theirs = sums(b);
#pragma unroll
            for (int i = 0; i < Cfg::kAcc; ++i) acc[i] += __ldcg(theirs + 128 * i);
          }
          if (read_c_in && leader) {  // as the whole tiles do during their last K tile
            BulkWaitRead<0>();
            load_c_in(0);
            if constexpr (!kFp32Out) load_c_in(1);
          }
        }
      }
      // Epilogue: accumulator 4j + {0,1} is row lane/4 of the warp's 16, columns
      // 8j + 2(lane%4) + {0,1}; 4j + {2,3} the same columns 8 rows down.
      // This thread's rows r and r + 8 of the slab, bytes 4(lane%4) .. +3 of each 16-byte unit.
      // Under the 128-byte swizzle, unit u of row `row` sits at unit u ^ (row % 8) (rows r and
      // r + 8 alike): the 8 rows a store instruction touches land in 8 different units, so
      // the stores are free of bank conflicts.
      const int r = warp * 16 + lane / 4;
      const uint32_t unit_xor = (r & 7) << 4;
      // alpha·acc (0 where alpha is 0: A·B is not formed, as BLAS), fp32.
      auto times_alpha = [&](float x) { return alpha != 0.0f ? alpha * x : 0.0f; };
      // One instantiation per value of kScaled: the plain one is the epilogue of old.
      auto epilogue = [&](auto scaled_tag) {
        constexpr bool kScaled = decltype(scaled_tag)::value;
        if constexpr (kFp32Out) {
          // fp32: columns 8jj + 2(lane%4) + {0,1} of the chunk are bytes 32jj + 8(lane%4) of
          // its 256-byte row: box jj / 4 (32 columns, 128-byte rows), unit 2(jj%4) +
          // (lane%4)/2, 8 bytes in. The 8 rows of a store fill each unit position twice: two
          // wavefronts for 256 bytes, the minimum.
          const uint32_t buf = c_stage + c * 2 * Cfg::kCChunkBytes;
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) {
            if (leader) {
              BulkWaitRead<0>();  // the previous chunk's stores have read the buffer
              if (kScaled && read_c_in && j > 0) load_c_in(j);
            }
            NamedBarrier(1 + c, 128);
            if (kScaled && read_c_in) MbarWait(c_in_full(c, 0), (c_in_chunks + j) & 1);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
              const int a = 4 * (8 * j + jj);
              const uint32_t unit = 2 * (jj % 4) + (lane % 4) / 2;
              const uint32_t addr = buf + (jj / 4) * Cfg::kCChunkBytes + r * 128 +
                                    ((unit << 4) ^ unit_xor) + 8 * (lane % 2);
              if constexpr (kScaled) {
                float2 top = make_float2(times_alpha(acc[a]), times_alpha(acc[a + 1]));
                float2 bottom = make_float2(times_alpha(acc[a + 2]), times_alpha(acc[a + 3]));
                if (read_c_in) {
                  const float2 in_top = LdSharedF2(addr), in_bottom = LdSharedF2(addr + 8 * 128);
                  top.x += beta * in_top.x;
                  top.y += beta * in_top.y;
                  bottom.x += beta * in_bottom.x;
                  bottom.y += beta * in_bottom.y;
                }
                StShared(addr, top.x, top.y);
                StShared(addr + 8 * 128, bottom.x, bottom.y);
              } else {
                StShared(addr, acc[a], acc[a + 1]);
                StShared(addr + 8 * 128, acc[a + 2], acc[a + 3]);
              }
            }
            FenceProxyAsync();
            NamedBarrier(1 + c, 128);
            if (leader) {
              TmaStore3d(maps_c(w), buf, tn * BN + 64 * j, c_row, item);
              TmaStore3d(maps_c(w), buf + Cfg::kCChunkBytes, tn * BN + 64 * j + 32, c_row, item);
              BulkCommit();
            }
          }
        } else {
          const uint32_t row_base = c_stage + c * 2 * Cfg::kCChunkBytes + r * 128 + 4 * (lane % 4);
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) {
            const uint32_t buf = c_stage + (c * 2 + j % 2) * Cfg::kCChunkBytes;
            if (leader) {
              // A new pair of C_in chunks once the previous pair's stores have read both
              // buffers (pair 0 came during the main loop).
              if (kScaled && read_c_in && j % 2 == 0 && j > 0) {
                BulkWaitRead<0>();
                load_c_in(j);
                load_c_in(j + 1);
              }
              // The store that last read this buffer (two chunks ago) must have finished reading.
              BulkWaitRead<1>();
            }
            NamedBarrier(1 + c, 128);
            if (kScaled && read_c_in) MbarWait(c_in_full(c, j % 2), ((c_in_chunks + j) / 2) & 1);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
              const int a = 4 * (8 * j + jj);
              const uint32_t addr = row_base + (j % 2) * Cfg::kCChunkBytes + ((jj << 4) ^ unit_xor);
              if constexpr (kScaled) {
                float2 top = make_float2(times_alpha(acc[a]), times_alpha(acc[a + 1]));
                float2 bottom = make_float2(times_alpha(acc[a + 2]), times_alpha(acc[a + 3]));
                if (read_c_in) {
                  const float2 in_top = UnpackPair<T>(LdShared(addr));
                  const float2 in_bottom = UnpackPair<T>(LdShared(addr + 8 * 128));
                  top.x += beta * in_top.x;
                  top.y += beta * in_top.y;
                  bottom.x += beta * in_bottom.x;
                  bottom.y += beta * in_bottom.y;
                }
                StShared(addr, PackPair<T>(top.x, top.y));
                StShared(addr + 8 * 128, PackPair<T>(bottom.x, bottom.y));
              } else {
                StShared(addr, PackPair<T>(acc[a], acc[a + 1]));
                StShared(addr + 8 * 128, PackPair<T>(acc[a + 2], acc[a + 3]));
              }
            }
            FenceProxyAsync();
            NamedBarrier(1 + c, 128);
            if (leader) {
              TmaStore3d(maps_c(w), buf, tn * BN + 64 * j, c_row, item);
              BulkCommit();
            }
          }
        }
      };
      if (scaled) {
        epilogue(std::true_type{});
        if (read_c_in) c_in_chunks += BN / 64;
      } else {
        epilogue(std::false_type{});
      }
    };
    for (int t = blockIdx.x / CLUSTER_M; t < num_tiles; t += gridDim.x / CLUSTER_M) {
      TileWork w;
      locate(t, w);
      consume(w, 0, w.k_tiles, -1);
    }
    for_each_tail_unit(consume);
    // The block's shared memory must outlive the last stores' reads of it.
    if (leader) BulkWaitAll();
  }
  // The peer's consumers arrive on this block's barriers until their last K tile.
  if constexpr (CLUSTER_M > 1) ClusterSync();
#endif
}

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_WGMMA_STAGE_CUH_
