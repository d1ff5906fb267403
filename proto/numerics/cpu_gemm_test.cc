#include "proto/numerics/cpu_gemm.h"

#include <gtest/gtest.h>

#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"

namespace hgemm {
namespace {

TEST(CpuGemm, TwoByTwo) {
  const uint16_t a[] = {FloatToHalf(1), FloatToHalf(2), FloatToHalf(3), FloatToHalf(4)};
  uint16_t c[4] = {0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF};  // NaN poison
  CpuGemm(a, a, c, 2, 2, 2);
  EXPECT_EQ(HalfToFloat(c[0]), 7);
  EXPECT_EQ(HalfToFloat(c[1]), 10);
  EXPECT_EQ(HalfToFloat(c[2]), 15);
  EXPECT_EQ(HalfToFloat(c[3]), 22);
}

TEST(CpuGemm, MatchesNaiveLoopOnOddShape) {
  std::mt19937_64 rng(7);
  const int m = 33, n = 65, k = 17;
  std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  std::vector<float> naive(m * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p)
        sum += double(HalfToFloat(a[i * k + p])) * HalfToFloat(b[p * n + j]);
      naive[i * n + j] = static_cast<float>(sum);
    }
  std::vector<uint16_t> c(m * n, 0xFFFF);
  CpuGemm(a.data(), b.data(), c.data(), m, n, k);
  EXPECT_LT(RelativeFrobeniusError(c.data(), naive.data(), m * n), kServiceTolerance.fp32_acc);
}

TEST(RelativeFrobeniusError, NanIsInfinite) {
  const float reference[] = {1, 2};
  const uint16_t c[] = {FloatToHalf(1), 0x7E00};
  EXPECT_TRUE(std::isinf(RelativeFrobeniusError(c, reference, 2)));
}

}  // namespace
}  // namespace hgemm
