#include "proto/numerics/fp16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace hgemm {
namespace {

TEST(Fp16, KnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(2.0f), 0x4000);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);  // overflow rounds to +Inf
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
}

TEST(Fp16, RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and the next fp16 (1 + 2^-10): ties go to even (1).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
}

TEST(Fp16, ArrayConversionRoundTripsEveryFiniteHalf) {
  std::vector<uint16_t> all;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) != 0x7C00) all.push_back(static_cast<uint16_t>(h));  // skip Inf/NaN
  }
  std::vector<float> wide(all.size());
  std::vector<uint16_t> back(all.size());
  HalfToFloat(all.data(), wide.data(), all.size());
  FloatToHalf(wide.data(), back.data(), all.size());
  EXPECT_EQ(back, all);
  for (size_t i = 0; i < all.size(); i += 997) EXPECT_EQ(wide[i], HalfToFloat(all[i]));
}

TEST(Bf16, ConversionRoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(Bf16ToFloat(0x4040), 3.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3F82);  // halfway above an odd one: up
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7F80);
  std::vector<uint16_t> all;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7F80) != 0x7F80) all.push_back(static_cast<uint16_t>(h));  // skip Inf/NaN
  }
  std::vector<float> wide(all.size());
  std::vector<uint16_t> back(all.size());
  Bf16ToFloat(all.data(), wide.data(), all.size());
  FloatToBf16(wide.data(), back.data(), all.size());
  EXPECT_EQ(back, all);
}

}  // namespace
}  // namespace hgemm
