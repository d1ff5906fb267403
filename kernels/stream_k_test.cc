// The stream-K split's arithmetic (kernels/stream_k.h), without a GPU: the blocks' units cover
// every K tile of every tile exactly once, the tail's tiles are shared by the blocks
// TailBlocksOf names, in order, and no block uses one of its slots for two tiles.
#include "kernels/stream_k.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace hgemm::kernels {
namespace {

struct Unit {
  int block, kb, ke;
};

TEST(StreamK, UnitsCoverEveryKTileOnceAndTheSumsMeetInOrder) {
  int planned_tails = 0;
  for (int sms : {1, 2, 7, 132}) {
    for (long long tiles : {1ll, 2ll, 5ll, 68ll, 131ll, 132ll, 133ll, 512ll, 2048ll, 2080ll}) {
      for (int k_tiles : {1, 2, 3, 7, 64, 128, 129}) {
        SCOPED_TRACE(testing::Message()
                     << tiles << " tiles of " << k_tiles << " K tiles, " << sms << " SMs");
        const StreamKPlan plan = PlanStreamK(tiles, k_tiles, sms);
        const StreamKSplit& s = plan.split;
        ASSERT_GE(plan.grid, 1);
        ASSERT_LE(plan.grid, sms);
        ASSERT_EQ(plan.whole_tiles + s.tail_tiles, tiles);
        if (s.tail_tiles == 0) {  // the plain persistent grid
          ASSERT_EQ(plan.grid, tiles < sms ? tiles : sms);
          continue;
        }
        ++planned_tails;
        ASSERT_EQ(plan.whole_tiles % sms, 0) << "the whole tiles are whole waves";
        ASSERT_EQ(plan.grid, plan.whole_tiles > 0 ? sms : s.tail_blocks);
        ASSERT_LT(s.tail_tiles, sms);
        ASSERT_LE(s.tail_blocks, plan.grid);
        ASSERT_GE(s.iters_per_block, 1);
        // Every block's share, as the kernel walks it.
        std::map<int, std::vector<Unit>> by_tile;
        std::set<std::pair<int, int>> slots_used;  // (block, slot)
        for (int b = 0; b < plan.grid; ++b) {
          int units = 0;
          ForEachTailUnit(s, k_tiles, b, [&](int st, int kb, int ke) {
            ++units;
            ASSERT_GE(st, 0);
            ASSERT_LT(st, s.tail_tiles);
            ASSERT_LT(kb, ke);
            ASSERT_LE(ke, k_tiles);
            by_tile[st].push_back({b, kb, ke});
            const TailBlocks blocks = TailBlocksOf(s, k_tiles, st);
            if (blocks.first != blocks.last) {  // a partial unit: it takes a slot
              ASSERT_TRUE(slots_used.insert({b, TailSlot(s, k_tiles, b, st)}).second)
                  << "block " << b << " uses slot " << TailSlot(s, k_tiles, b, st)
                  << " for two tiles";
            }
          });
          if (b < s.tail_blocks) {
            ASSERT_GT(units, 0) << "block " << b << " of the tail is idle";
          } else {
            ASSERT_EQ(units, 0) << "block " << b << " is past the tail";
          }
        }
        ASSERT_EQ(int(by_tile.size()), s.tail_tiles);
        for (const auto& [st, units] : by_tile) {
          const TailBlocks blocks = TailBlocksOf(s, k_tiles, st);
          ASSERT_LE(blocks.last - blocks.first + 1, kStreamKMaxBlocksPerTile + 1);
          ASSERT_EQ(int(units.size()), blocks.last - blocks.first + 1) << "tail tile " << st;
          int next_k = 0;
          for (size_t i = 0; i < units.size(); ++i) {
            ASSERT_EQ(units[i].block, blocks.first + int(i)) << "tail tile " << st;
            ASSERT_EQ(units[i].kb, next_k) << "tail tile " << st << ": a K tile missed or twice";
            next_k = units[i].ke;
          }
          ASSERT_EQ(next_k, k_tiles) << "tail tile " << st;
        }
      }
    }
  }
  EXPECT_GT(planned_tails, 50);  // the sweep exercised tails, not only whole waves
}

TEST(StreamK, EightThousandCubedOnAnH100) {
  // 8192³ in 128x256 tiles: 2048 tiles = 15 waves of 132 and 68 left, 128 K tiles each.
  const StreamKPlan plan = PlanStreamK(64 * 32, 128, 132);
  EXPECT_EQ(plan.whole_tiles, 15 * 132);
  EXPECT_EQ(plan.grid, 132);
  EXPECT_EQ(plan.split.tail_tiles, 68);
  EXPECT_EQ(plan.split.iters_per_block, 66);  // 8704 K tiles over 132 blocks
  EXPECT_EQ(plan.split.tail_blocks, 132);
}

TEST(StreamK, NoTailWhereWavesAreWholeOrKIsOneTile) {
  EXPECT_EQ(PlanStreamK(264, 128, 132).split.tail_tiles, 0);
  EXPECT_EQ(PlanStreamK(264, 128, 132).grid, 132);
  EXPECT_EQ(PlanStreamK(100, 1, 132).split.tail_tiles, 0);
  EXPECT_EQ(PlanStreamK(100, 1, 132).grid, 100);
}

}  // namespace
}  // namespace hgemm::kernels
