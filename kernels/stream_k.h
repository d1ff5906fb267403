// The stream-K split of a persistent launch (Osama et al., "Stream-K", PPoPP 2023; CUTLASS's
// data-parallel + stream-K hybrid): the grid, one block per SM, runs the whole waves of tiles as
// the plain persistent kernel does, tile by tile; the tiles left over for a last, partial wave
// (fewer than the SMs, which would leave the others idle for a whole tile's time) form the
// tail, whose K tiles are cut evenly over the blocks. A tail tile is then computed by the
// consecutive blocks first..last of TailBlocks; each leaves its fp32 sums in one of its two
// slots (0 for the first tile of its share, 1 for its last; a share spans at most two partial
// tiles), and the block that completes the count sums them in block order and stores C.
//
// Plain host/device arithmetic on ints, shared by the kernel (kernels/wgmma_stage.cuh, STREAM_K)
// and its host side, and tested without a GPU (stream_k_test.cc). Thread safety: stateless.
#ifndef HGEMM_KERNELS_STREAM_K_H_
#define HGEMM_KERNELS_STREAM_K_H_

#ifdef __CUDACC__
#define HGEMM_HOST_DEVICE __host__ __device__
#else
#define HGEMM_HOST_DEVICE
#endif

namespace hgemm::kernels {

// How a launch's tiles are split. No tail (tail_tiles == 0) leaves the plain persistent grid.
struct StreamKSplit {
  int tail_tiles = 0;       // the last tiles, after the whole waves
  int iters_per_block = 0;  // K tiles of the tail per block (the last block may have fewer)
  int tail_blocks = 0;      // blocks sharing the tail: 0 .. tail_blocks - 1
};

struct StreamKPlan {
  long long whole_tiles = 0;  // tiles [0, whole_tiles) run whole: a multiple of the grid
  int grid = 0;               // blocks of the launch
  StreamKSplit split;
};

// A tail block's share is at least this many K tiles, so that its fixed costs (one partial
// tile out, up to two in) stay small beside its work, and a tile has at most this many
// sharing blocks.
inline constexpr int kStreamKMinIters = 4;
inline constexpr int kStreamKMaxBlocksPerTile = 8;

// The plan for `tiles` tiles of `k_tiles` K tiles each on `sms` SMs. A tail is planned only
// where it helps (tiles % sms != 0, more than one K tile) and its iteration count fits in int.
inline StreamKPlan PlanStreamK(long long tiles, int k_tiles, int sms) {
  StreamKPlan plan;
  const long long tail = tiles % sms;
  const long long iters = tail * k_tiles;
  if (tail == 0 || k_tiles < 2 || iters >= (1ll << 30)) {
    plan.whole_tiles = tiles;
    plan.grid = int(tiles < sms ? tiles : sms);
    return plan;
  }
  plan.whole_tiles = tiles - tail;
  long long blocks = iters / kStreamKMinIters;
  if (blocks > tail * kStreamKMaxBlocksPerTile) blocks = tail * kStreamKMaxBlocksPerTile;
  if (blocks > sms) blocks = sms;
  if (blocks < 1) blocks = 1;
  const long long per_block = (iters + blocks - 1) / blocks;
  plan.split.tail_tiles = int(tail);
  plan.split.iters_per_block = int(per_block);
  plan.split.tail_blocks = int((iters + per_block - 1) / per_block);  // none left empty
  plan.grid = plan.whole_tiles > 0 ? sms : plan.split.tail_blocks;
  return plan;
}

// Calls f(st, kb, ke) for block `block`'s share of the tail, in order: K tiles [kb, ke) of
// tail tile st (the launch's tile whole_tiles + st). Nothing for a block past the tail's.
template <typename F>
HGEMM_HOST_DEVICE void ForEachTailUnit(const StreamKSplit& s, int k_tiles, int block, F&& f) {
  const int total = s.tail_tiles * k_tiles;
  const int end = (block + 1) * s.iters_per_block < total ? (block + 1) * s.iters_per_block : total;
  for (int g = block * s.iters_per_block; g < end;) {
    const int st = g / k_tiles, kb = g % k_tiles;
    const int ke = kb + (end - g) < k_tiles ? kb + (end - g) : k_tiles;
    f(st, kb, ke);
    g += ke - kb;
  }
}

// The blocks that share tail tile st, first..last (one block: the tile is whole in its share).
struct TailBlocks {
  int first, last;
};
HGEMM_HOST_DEVICE inline TailBlocks TailBlocksOf(const StreamKSplit& s, int k_tiles, int st) {
  return {st * k_tiles / s.iters_per_block, ((st + 1) * k_tiles - 1) / s.iters_per_block};
}

// The slot where `block` leaves its sums of tail tile st: 0 if st is the first tile of its
// share, else 1 (then st is its last).
HGEMM_HOST_DEVICE inline int TailSlot(const StreamKSplit& s, int k_tiles, int block, int st) {
  return block * s.iters_per_block / k_tiles == st ? 0 : 1;
}

}  // namespace hgemm::kernels

#endif  // HGEMM_KERNELS_STREAM_K_H_
