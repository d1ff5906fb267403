#include "proto/numerics/error_stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "proto/numerics/fp16.h"

namespace hgemm {
namespace {

TEST(ErrorStats, MeasuresTheFiniteElementsAndCountsTheOthers) {
  const float reference[] = {3, 4, 1, 1};
  const uint16_t c[] = {FloatToHalf(3), FloatToHalf(4.5f), 0x7E00, 0x7C00};  // NaN, +Inf
  const ErrorStats s = CompareToReference(c, reference, 4);
  EXPECT_EQ(s.nan_count, 2u);
  EXPECT_EQ(s.first_bad, 2u);
  EXPECT_DOUBLE_EQ(s.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(s.rel_frobenius, 0.5 / std::sqrt(27.0));
  EXPECT_TRUE(std::isinf(RelativeFrobeniusError(c, reference, 4)));
  EXPECT_DOUBLE_EQ(RelativeFrobeniusError(c, reference, 2), 0.5 / 5);
}

TEST(ErrorStats, FirstBadIsTheLargestErrorWithoutNans) {
  const float reference[] = {1, 1, 1};
  const uint16_t c[] = {FloatToHalf(1.25f), FloatToHalf(0), FloatToHalf(1)};
  const ErrorStats s = CompareToReference(c, reference, 3);
  EXPECT_EQ(s.nan_count, 0u);
  EXPECT_EQ(s.first_bad, 1u);
  EXPECT_DOUBLE_EQ(s.max_abs, 1);
  EXPECT_NE(s.ToString().find("nan=0 first_bad=1"), std::string::npos) << s.ToString();
}

TEST(ErrorStats, ComparesBf16AndFp32Outputs) {
  const float reference[] = {3, 4, 1};
  // bf16 bits: the upper half of the fp32 pattern (3 = 0x4040, 4.5 = 0x4090, NaN = 0x7FC0).
  const uint16_t bf16[] = {0x4040, 0x4090, 0x7FC0};
  const ErrorStats b = CompareBf16ToReference(bf16, reference, 3);
  EXPECT_EQ(b.nan_count, 1u);
  EXPECT_EQ(b.first_bad, 2u);
  EXPECT_DOUBLE_EQ(b.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(b.rel_frobenius, 0.5 / std::sqrt(26.0));
  const float fp32[] = {3, 4.5f, 1};
  const ErrorStats f = CompareToReference(fp32, reference, 3);
  EXPECT_EQ(f.nan_count, 0u);
  EXPECT_EQ(f.first_bad, 1u);
  EXPECT_DOUBLE_EQ(f.rel_frobenius, 0.5 / std::sqrt(26.0));
  EXPECT_GT(kKernelToleranceBf16, kKernelTolerance.fp32_acc);
}

TEST(Tolerance, PicksTheAccumulationsBar) {
  EXPECT_EQ(kKernelTolerance.For(true), kKernelTolerance.fp16_acc);
  EXPECT_EQ(kKernelTolerance.For(false), kKernelTolerance.fp32_acc);
  EXPECT_LT(kKernelTolerance.fp32_acc, kKernelTolerance.fp16_acc);
  EXPECT_LE(kKernelTolerance.fp32_acc, kServiceTolerance.fp32_acc);
}

}  // namespace
}  // namespace hgemm
