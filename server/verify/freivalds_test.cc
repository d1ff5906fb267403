#include "server/verify/freivalds.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/fp16.h"
#include "server/testing/c_faults.h"

namespace hgemm::verify {
namespace {

// One GEMM on the host: its operands as stored, C as computed, and the check's form.
struct HostGemm {
  Form form;
  std::vector<uint16_t> a, b;
  std::vector<char> c_in, c;

  // What the check says of C with the vector `seed`: "" (passed) or the failure.
  std::string Check(uint64_t seed) const {
    RowSums sums;
    HostExpected(form, a.data(), c_in.data(), HostB(form, b.data(), seed), &sums);
    HostCr(form, c.data(), seed, &sums);
    return CheckRows(form, sums);
  }
  int64_t CElementBytes() const { return ElementBytes(form.c_type); }
  float CAt(int64_t index) const {
    const char* p = c.data() + index * CElementBytes();
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    switch (form.c_type) {
      case ElementType::kFp16:
        return HalfToFloat(h);
      case ElementType::kBf16:
        return Bf16ToFloat(h);
      case ElementType::kFp32: {
        float f;
        std::memcpy(&f, p, sizeof f);
        return f;
      }
    }
    return 0;
  }
};

GemmForm NumericsForm(const Form& f) {
  return {.transpose_a = f.transpose_a,
          .transpose_b = f.transpose_b,
          .bf16 = f.ab_type == ElementType::kBf16,
          .c_fp32 = f.c_type == ElementType::kFp32};
}

// Fresh random operands (uniform in [-1, 1), or in [0, 1) with `positive`: every partial sum
// grows, the worst case for a biased accumulation) and C by OpenBLAS (fp32 accumulation).
HostGemm MakeGemm(const Form& form, std::mt19937_64& rng, bool positive = false) {
  HostGemm g{.form = form};
  const bool bf16 = form.ab_type == ElementType::kBf16;
  g.a = RandomHalfMatrix(form.m * form.k, rng, bf16);
  g.b = RandomHalfMatrix(form.k * form.n, rng, bf16);
  if (positive) {
    for (auto* v : {&g.a, &g.b}) {
      for (uint16_t& x : *v) x &= 0x7FFF;  // clear the sign bit
    }
  }
  const int64_t c_bytes = form.m * form.n * ElementBytes(form.c_type);
  if (form.beta != 0) {
    std::vector<uint16_t> halves = RandomHalfMatrix(c_bytes / 2, rng, bf16);
    if (form.c_type == ElementType::kFp32) {  // fp32 values in [-1, 1)
      std::vector<float> floats(form.m * form.n);
      std::uniform_real_distribution<float> u(-1, 1);
      for (float& f : floats) f = u(rng);
      g.c_in.resize(c_bytes);
      std::memcpy(g.c_in.data(), floats.data(), c_bytes);
    } else {
      g.c_in.assign(reinterpret_cast<char*>(halves.data()),
                    reinterpret_cast<char*>(halves.data()) + c_bytes);
    }
  }
  g.c.assign(c_bytes, char(0x7F));  // poison: the GEMM writes every element
  CpuGemm(
      g.a.data(), g.b.data(), g.c.data(), form.m, form.n, form.k, NumericsForm(form),
      {.alpha = form.alpha, .beta = form.beta, .c_in = g.c_in.empty() ? nullptr : g.c_in.data()});
  return g;
}

// C with fp16 accumulation as a tensor core's fp16 MMA does it: 16-term products summed exactly
// enough (fp32), added into an fp16 running sum rounded to nearest after each step.
HostGemm MakeFp16AccumulatedGemm(int64_t m, int64_t n, int64_t k, std::mt19937_64& rng,
                                 bool positive) {
  Form form{.m = m, .n = n, .k = k, .accumulation = Accumulation::kFp16};
  HostGemm g = MakeGemm(form, rng, positive);
  std::vector<float> a(m * k), b(k * n);
  HalfToFloat(g.a.data(), a.data(), a.size());
  HalfToFloat(g.b.data(), b.data(), b.size());
  auto* c = reinterpret_cast<uint16_t*>(g.c.data());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0;
      for (int64_t l0 = 0; l0 < k; l0 += 16) {
        float block = 0;
        for (int64_t l = l0; l < std::min(k, l0 + 16); ++l) block += a[i * k + l] * b[l * n + j];
        acc = HalfToFloat(FloatToHalf(acc + block));
      }
      c[i * n + j] = FloatToHalf(acc);
    }
  }
  return g;
}

std::vector<Form> EveryForm(int64_t m, int64_t n, int64_t k) {
  std::vector<Form> forms;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [ab, c] : {std::pair{ElementType::kFp16, ElementType::kFp16},
                           std::pair{ElementType::kFp16, ElementType::kFp32},
                           std::pair{ElementType::kBf16, ElementType::kBf16},
                           std::pair{ElementType::kBf16, ElementType::kFp32}}) {
        for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.75f, 1.5f}}) {
          forms.push_back({.m = m,
                           .n = n,
                           .k = k,
                           .transpose_a = ta,
                           .transpose_b = tb,
                           .ab_type = ab,
                           .c_type = c,
                           .alpha = alpha,
                           .beta = beta});
        }
      }
    }
  }
  return forms;
}

std::string Describe(const Form& f) {
  return std::string(f.transpose_a ? "T" : "N") + (f.transpose_b ? "T" : "N") + " " +
         ElementTypeName(f.ab_type) + "->" + ElementTypeName(f.c_type) +
         " alpha=" + std::to_string(f.alpha) + " beta=" + std::to_string(f.beta) +
         " k=" + std::to_string(f.k);
}

TEST(Freivalds, CorrectGemmsOfEveryFormPass) {
  std::mt19937_64 rng(1);
  for (int64_t k : {1, 7, 256, 4099}) {
    for (const Form& form : EveryForm(37, 29, k)) {
      for (bool positive : {false, true}) {
        const HostGemm g = MakeGemm(form, rng, positive);
        for (int trial = 0; trial < 8; ++trial) {
          EXPECT_EQ(g.Check(FreshSeed()), "") << Describe(form) << (positive ? " positive" : "");
        }
      }
    }
  }
}

TEST(Freivalds, CorrectGemmsPassAtLongK) {
  std::mt19937_64 rng(2);
  for (const Form& form : EveryForm(6, 5, 65536)) {
    const HostGemm g = MakeGemm(form, rng, /*positive=*/form.beta == 0);
    for (int trial = 0; trial < 4; ++trial) EXPECT_EQ(g.Check(FreshSeed()), "") << Describe(form);
  }
}

TEST(Freivalds, Fp16AccumulationPassesAtLongK) {
  std::mt19937_64 rng(3);
  for (int64_t k : {64, 4096, 65536}) {
    for (bool positive : {false, true}) {
      const HostGemm g = MakeFp16AccumulatedGemm(4, 6, k, rng, positive);
      for (int trial = 0; trial < 8; ++trial) {
        EXPECT_EQ(g.Check(FreshSeed()), "") << "k=" << k << (positive ? " positive" : "");
      }
    }
  }
}

TEST(Freivalds, LegitimateOverflowPasses) {
  // Inputs whose products pass fp16's range: C holds infinities, and no check can object.
  std::mt19937_64 rng(4);
  Form form{.m = 8, .n = 8, .k = 64, .alpha = 4096};
  HostGemm g = MakeGemm(form, rng, /*positive=*/true);
  bool any_infinite = false;
  for (int64_t i = 0; i < form.m * form.n; ++i) any_infinite |= std::isinf(g.CAt(i));
  ASSERT_TRUE(any_infinite);
  EXPECT_EQ(g.Check(FreshSeed()), "");
}

// Counts detections of `fault` over `trials` fresh vectors and checks the rate against the
// one docs/verification.md promises per repetition, erfc(√2·t/‖e‖) with t the row's bound and
// ‖e‖ the 2-norm of the error the fault put into the row; returns the measured rate.
double MeasureDetection(const Form& form, CFault fault, int trials, std::mt19937_64& rng) {
  HostGemm g = MakeGemm(form, rng);
  const HostGemm correct = g;
  const int64_t row = int64_t(rng() % uint64_t(form.m)), col = int64_t(rng() % uint64_t(form.n));
  CorruptC(fault, form.c_type, form.n, g.c.data(), row, col);
  double error_sq = 0;
  for (int64_t j = 0; j < form.n; ++j) {
    const double e = double(g.CAt(row * form.n + j)) - correct.CAt(row * form.n + j);
    error_sq += std::isnan(e) ? INFINITY : e * e;  // a NaN (an infinity flipped in) is huge
  }
  EXPECT_GT(error_sq, 0) << CFaultName(fault);
  // The row's bound, from the corrupted C's norms (what the check computes).
  RowSums sums;
  HostExpected(form, g.a.data(), g.c_in.data(), HostB(form, g.b.data(), 1), &sums);
  HostCr(form, g.c.data(), 1, &sums);
  const double t = Tolerance(form, sums.a_sq[row], sums.b_sq, sums.c_sq[row],
                             sums.c_in_sq.empty() ? 0 : sums.c_in_sq[row]);
  const double promised =
      std::isfinite(error_sq) ? std::erfc(std::sqrt(2.0) * t / std::sqrt(error_sq)) : 1;
  int detected = 0;
  for (int trial = 0; trial < trials; ++trial) detected += g.Check(FreshSeed()).empty() ? 0 : 1;
  const double rate = double(detected) / trials;
  std::printf("%-18s %-40s error %-9.3g bound %-9.3g promised %.3f detected %.3f\n",
              CFaultName(fault).c_str(), Describe(form).c_str(), std::sqrt(error_sq), t, promised,
              rate);
  // Binomial slack: 4 standard deviations of the measured rate.
  const double slack = 4 * std::sqrt(promised * (1 - promised) / trials) + 1.0 / trials;
  EXPECT_GE(rate, promised - slack) << CFaultName(fault) << " " << Describe(form) << ": detected "
                                    << detected << " of " << trials << ", promised " << promised;
  return rate;
}

TEST(Freivalds, DetectsFaultsAtThePromisedRates) {
  std::mt19937_64 rng(5);
  constexpr int kTrials = 400;
  const Form fp16{.m = 48, .n = 64, .k = 256};
  const Form bf16_fp32{.m = 48,
                       .n = 64,
                       .k = 256,
                       .ab_type = ElementType::kBf16,
                       .c_type = ElementType::kFp32,
                       .alpha = 0.5f,
                       .beta = -2};
  for (const Form& form : {fp16, bf16_fp32}) {
    for (CFault fault : kAllCFaults) {
      const double rate = MeasureDetection(form, fault, kTrials, rng);
      if (fault == CFault::kLargeError || fault == CFault::kRowZeroed ||
          fault == CFault::kExponentBit) {
        EXPECT_GE(rate, 0.95) << CFaultName(fault) << " " << Describe(form);
      }
    }
  }
}

TEST(Freivalds, ToleranceGrowsWithKAndTheAccumulation) {
  const Form fp32_acc{.m = 1, .n = 1024, .k = 1024};
  Form fp16_acc = fp32_acc;
  fp16_acc.accumulation = Accumulation::kFp16;
  Form long_k = fp32_acc;
  long_k.k = 65536;
  EXPECT_GT(Tolerance(fp16_acc, 1, 1, 1, 0), 100 * Tolerance(fp32_acc, 1, 1, 0, 0));
  EXPECT_GT(Tolerance(long_k, 1, 1, 0, 0), Tolerance(fp32_acc, 1, 1, 0, 0));
}

TEST(ResidentBCache, KeepsAValuePerBufferObjectNotAddress) {
  ResidentBCache<int> cache(2);
  auto buffer = std::make_shared<ResidentBuffer>(0, 16, nullptr, [](void*) {});
  const ResidentBCache<int>::Key key{.k = 4, .n = 4};
  EXPECT_EQ(cache.Find(buffer, key), nullptr);
  cache.Put(buffer, key, std::make_shared<int>(7));
  ASSERT_NE(cache.Find(buffer, key), nullptr);
  EXPECT_EQ(*cache.Find(buffer, key), 7);
  ResidentBCache<int>::Key other = key;
  other.repetition = 1;
  EXPECT_EQ(cache.Find(buffer, other), nullptr);
  // Another buffer object (at any address) finds nothing; a forgotten one neither.
  auto second = std::make_shared<ResidentBuffer>(0, 16, nullptr, [](void*) {});
  EXPECT_EQ(cache.Find(second, key), nullptr);
  cache.Forget(buffer.get());
  EXPECT_EQ(cache.Find(buffer, key), nullptr);
}

TEST(ResidentBCache, DropsTheOldestPastItsCapacity) {
  ResidentBCache<int> cache(2);
  std::vector<std::shared_ptr<ResidentBuffer>> buffers;
  for (int i = 0; i < 3; ++i) {
    buffers.push_back(std::make_shared<ResidentBuffer>(0, 16, nullptr, [](void*) {}));
    cache.Put(buffers.back(), {}, std::make_shared<int>(i));
  }
  EXPECT_EQ(cache.Find(buffers[0], {}), nullptr);
  EXPECT_NE(cache.Find(buffers[2], {}), nullptr);
}

}  // namespace
}  // namespace hgemm::verify
