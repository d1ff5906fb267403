// Split-K for skinny M on the GPU: every splitk variant × layout × type pair on
// shapes at the slicing's edges (M = 1, 7, 16, 64, 65; K not a multiple of s·8; K under s·64,
// so fewer slices than s; long K), fresh random inputs, C poisoned with NaN (row padding
// included, which must stay poisoned), against the fp32 reference of the same inputs and within
// twice cuBLAS's error on them; `auto` on the skinny shapes; and SplitKReduce's α/β against a
// float64 host sum (β = 0 never reads C_in: NaN there stays out of C; α = 0 never reads the
// partials). Skips without a GPU. None of this has run on a GPU yet (written without one).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/assert_cuda.h"
#include "kernels/registry.h"
#include "kernels/scale_epilogue.h"
#include "kernels/testing.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"

namespace hgemm::kernels {
namespace {

using testing::HaveGpu;

struct Shape {
  int m, n, k;
};

struct SplitCase {
  std::string variant;
  bool ta, tb;
  DataType ab, c;
  Shape shape;
  bool strided;  // lda, ldb, ldc = stored row length + 8
  // α/β, applied by the reduce: C = alpha·op(A)·op(B) + beta·C_in (C_in random of C's type, all
  // NaN where beta is 0; in_place: C_in is C).
  float alpha = 1.f, beta = 0.f;
  bool in_place = false;
};

// K = 1000: not a multiple of s·8 for s = 2, 4, 8 (the last slice is short); K = 72 and 40:
// under s·64, so fewer slices than s (one for K = 40); K = 4104: 4 slices of 1088 + a 840 tail.
const Shape kShapes[] = {
    {1, 520, 1000}, {7, 264, 72}, {16, 1032, 4104}, {64, 136, 40}, {65, 264, 1000},
};
const Shape kLargeShape = {16, 8192, 8192};
const Shape kStridedShape = {16, 1032, 4104};
const Shape kScaledShape = {65, 264, 1000};

std::vector<SplitCase> Cases() {
  std::vector<SplitCase> cases;
  for (const VariantInfo& v : Variants()) {
    if (v.kind != VariantKind::kSplitK) continue;
    for (int layout = 0; layout < 4; ++layout) {
      const bool ta = layout & 2, tb = layout & 1;
      for (DataType ab : {DataType::kFp16, DataType::kBf16}) {
        for (DataType c : {ab, DataType::kFp32}) {
          for (const Shape& s : kShapes) cases.push_back({v.name, ta, tb, ab, c, s, false});
          if (c == ab && !ta) cases.push_back({v.name, ta, tb, ab, c, kLargeShape, false});
        }
        cases.push_back({v.name, ta, tb, ab, ab, kStridedShape, true});
        if (ta) continue;
        // α/β: the reduce reads C_in with C's row stride; in place; β = 0 never reads it.
        for (DataType c : {ab, DataType::kFp32}) {
          cases.push_back({v.name, ta, tb, ab, c, kScaledShape, false, -0.5f, 0.25f, false});
          cases.push_back({v.name, ta, tb, ab, c, kScaledShape, false, 2.f, 1.f, true});
          cases.push_back({v.name, ta, tb, ab, c, kScaledShape, false, 2.f, 0.f, false});
        }
        cases.push_back({v.name, ta, tb, ab, ab, kStridedShape, true, -0.5f, 0.25f, false});
      }
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<SplitCase>& info) {
  const SplitCase& c = info.param;
  const bool scaled = c.alpha != 1.f || c.beta != 0.f;
  auto hundredths = [](float x) {  // "m50" for -0.5 (test names take letters, digits and _)
    const int h = int(x * 100);
    return (h < 0 ? "m" : "") + std::to_string(h < 0 ? -h : h);
  };
  return c.variant + "_" + LayoutName(c.ta, c.tb) + "_" + testing::TypesTestName(c.ab, c.c) + "_" +
         std::to_string(c.shape.m) + "x" + std::to_string(c.shape.n) + "x" +
         std::to_string(c.shape.k) + (c.strided ? "_ld" : "") +
         (scaled ? "_alpha" + hundredths(c.alpha) + "_beta" + hundredths(c.beta) : "") +
         (c.in_place ? "_inplace" : "");
}

class GpuTest {
 protected:
  bool Start() {
    if (!HaveGpu(&cc_)) return false;
    EXPECT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    return true;
  }
  void Stop() {
    for (void* p : buffers_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }
  cudaError_t Fill(void* data, size_t count, DataType t) {
    return testing::FillRandom(data, count, t, stream_);
  }
  // NaN in every one of `count` elements of type t.
  cudaError_t Poison(void* data, size_t count, DataType t) {
    return testing::Poison(data, count * DataTypeBytes(t), t, stream_);
  }

  int cc_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
};

// m×n of C (rows ldc apart, c_type) against the reference, as the correctness sweep compares.
ErrorStats Compare(const std::vector<unsigned char>& rows, DataType c_type,
                   const std::vector<float>& ref) {
  const int64_t count = int64_t(ref.size());
  if (c_type == DataType::kFp32)
    return CompareToReference(reinterpret_cast<const float*>(rows.data()), ref.data(), count);
  if (c_type == DataType::kBf16)
    return CompareBf16ToReference(reinterpret_cast<const uint16_t*>(rows.data()), ref.data(),
                                  count);
  return CompareToReference(reinterpret_cast<const uint16_t*>(rows.data()), ref.data(), count);
}

class SplitKCorrectness : public GpuTest, public ::testing::TestWithParam<SplitCase> {
 protected:
  void SetUp() override {
    if (!Start()) GTEST_SKIP() << "no CUDA device";
  }
  void TearDown() override { Stop(); }
};

TEST_P(SplitKCorrectness, MatchesFp32ReferenceAndCublas) {
  const SplitCase& c = GetParam();
  const VariantInfo* v = FindVariant(c.variant);
  const VariantInfo* cublas = FindVariant("cublas");
  ASSERT_NE(v, nullptr);
  ASSERT_NE(cublas, nullptr);
  if (v->min_sm > cc_) GTEST_SKIP() << v->name << " needs sm_" << v->min_sm;
  const int m = c.shape.m, n = c.shape.n, k = c.shape.k;
  const int a_rows = c.ta ? k : m, a_cols = c.ta ? m : k;
  const int b_rows = c.tb ? n : k, b_cols = c.tb ? k : n;
  const int pad = c.strided ? 8 : 0;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  const size_t ab_bytes = DataTypeBytes(c.ab), c_bytes = DataTypeBytes(c.c);
  void* a = Alloc(size_t(a_rows) * lda * ab_bytes);
  void* b = Alloc(size_t(b_rows) * ldb * ab_bytes);
  void* out = Alloc(size_t(m) * ldc * c_bytes);
  auto* ref = static_cast<float*>(Alloc(size_t(m) * n * sizeof(float)));
  ASSERT_FALSE(HasFailure());
  ASSERT_CUDA(Fill(a, size_t(a_rows) * lda, c.ab));
  ASSERT_CUDA(Fill(b, size_t(b_rows) * ldb, c.ab));
  ASSERT_CUDA(testing::ReferenceGemmEx(a, b, ref, m, n, k, c.ta, c.tb, lda, ldb,
                                       c.ab == DataType::kBf16, stream_));
  std::vector<float> host_ref(size_t(m) * n);
  ASSERT_CUDA(cudaMemcpyAsync(host_ref.data(), ref, host_ref.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_));
  // α/β: C_in's values (rows ldc apart) as they are before each run, and the reference of
  // alpha·op(A)·op(B) + beta·C_in.
  const bool scaled = c.alpha != 1.f || c.beta != 0.f;
  void* c_in = !scaled ? nullptr : c.in_place ? out : Alloc(size_t(m) * ldc * c_bytes);
  void* c_in_source = scaled ? Alloc(size_t(m) * ldc * c_bytes) : nullptr;
  ASSERT_FALSE(HasFailure());
  if (scaled) {
    ASSERT_CUDA(c.beta != 0 ? Fill(c_in_source, size_t(m) * ldc, c.c)
                            : Poison(c_in_source, size_t(m) * ldc, c.c));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<unsigned char> bits(size_t(m) * ldc * c_bytes);
    ASSERT_CUDA(cudaMemcpy(bits.data(), c_in_source, bits.size(), cudaMemcpyDeviceToHost));
    for (int r = 0; r < m; ++r)
      for (int j = 0; j < n; ++j) {
        const unsigned char* e = bits.data() + (size_t(r) * ldc + j) * c_bytes;
        uint16_t half_bits = 0;
        float in = 0;
        if (c.c == DataType::kFp32) {
          std::memcpy(&in, e, 4);
        } else {
          std::memcpy(&half_bits, e, 2);
          in = c.c == DataType::kBf16 ? Bf16ToFloat(half_bits) : HalfToFloat(half_bits);
        }
        float& expected = host_ref[size_t(r) * n + j];
        expected = float(double(c.alpha) * expected + (c.beta != 0 ? double(c.beta) * in : 0.0));
      }
  }

  GemmProblem p{a, b, out, m, n, k, Accumulation::kFp32};
  p.transpose_a = c.ta;
  p.transpose_b = c.tb;
  p.ab_type = c.ab;
  p.c_type = c.c;
  if (scaled) {
    p.alpha = c.alpha;
    p.beta = c.beta;
    p.c_in = c_in;
  }
  if (c.strided) {
    p.lda = lda;
    p.ldb = ldb;
    p.ldc = ldc;
  }
  LaunchContext ctx(stream_);
  // A transposed A of m % 8 != 0 is refused by name (TMA's 16-byte row strides), by Launch too.
  if (const std::string why = CheckProblem(*v, p); !why.empty()) {
    EXPECT_TRUE(c.ta && m % 8 != 0) << why;
    EXPECT_NE(Launch(*v, p, ctx).find("transpose_a needs m % 8 == 0"), std::string::npos);
    GTEST_SKIP() << why;
  }
  auto run = [&](const VariantInfo& variant, ErrorStats* stats) {
    if (!c.in_place) ASSERT_CUDA(Poison(out, size_t(m) * ldc, c.c));
    if (scaled)
      ASSERT_CUDA(cudaMemcpyAsync(c_in, c_in_source, size_t(m) * ldc * c_bytes,
                                  cudaMemcpyDeviceToDevice, stream_));
    ASSERT_EQ(Launch(variant, p, ctx), "");
    ASSERT_CUDA(cudaGetLastError());
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<unsigned char> all(size_t(m) * ldc * c_bytes);
    ASSERT_CUDA(cudaMemcpy(all.data(), out, all.size(), cudaMemcpyDeviceToHost));
    std::vector<unsigned char> rows(size_t(m) * n * c_bytes);
    for (int r = 0; r < m; ++r) {
      std::memcpy(rows.data() + size_t(r) * n * c_bytes, all.data() + size_t(r) * ldc * c_bytes,
                  size_t(n) * c_bytes);
      // The padding after each row keeps its poison: nothing is written past column n.
      for (size_t byte = size_t(n) * c_bytes; byte < size_t(ldc) * c_bytes; byte += 2) {
        uint16_t bits;
        std::memcpy(&bits, all.data() + size_t(r) * ldc * c_bytes + byte, 2);
        ASSERT_EQ(bits, c.c == DataType::kFp16 ? 0x7E00 : 0x7FC0)
            << variant.name << " wrote row " << r << "'s padding at byte " << byte;
      }
    }
    *stats = Compare(rows, c.c, host_ref);
  };
  ErrorStats ours, theirs;
  ASSERT_NO_FATAL_FAILURE(run(*v, &ours));
  ASSERT_NO_FATAL_FAILURE(run(*cublas, &theirs));
  const double bar = c.c == DataType::kBf16 ? kKernelToleranceBf16 : kKernelTolerance.fp32_acc;
  const std::string where = ours.first_bad == SIZE_MAX ? std::string("-")
                                                       : std::to_string(ours.first_bad / n) + "," +
                                                             std::to_string(ours.first_bad % n);
  EXPECT_EQ(ours.nan_count, 0u) << ours.ToString() << " first bad (row,col)=" << where;
  EXPECT_LE(ours.rel_frobenius, bar) << ours.ToString() << " worst (row,col)=" << where;
  if (int64_t(m) * n >= 4096) {
    EXPECT_LE(ours.rel_frobenius, 2 * theirs.rel_frobenius)
        << ours.ToString() << " vs cublas " << theirs.ToString();
  }
  const KSlices slices = SliceK(k, v->split_k);
  std::printf(
      "[ splitk ] %-28s %s %-9s %5dx%5dx%5d%s a=%g b=%g%s slices=%d×%d rel_frob=%.3e cublas=%.3e\n",
      v->name.c_str(), LayoutName(c.ta, c.tb), TypesName(c.ab, c.c).c_str(), m, n, k,
      c.strided ? " ld+8" : "", c.alpha, c.beta, c.in_place ? " in place" : "", slices.count,
      slices.depth, ours.rel_frobenius, theirs.rel_frobenius);
}

const std::vector<SplitCase> kCases = Cases();
INSTANTIATE_TEST_SUITE_P(SplitK, SplitKCorrectness, ::testing::ValuesIn(kCases), CaseName);

class SplitKAuto : public GpuTest, public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Start()) GTEST_SKIP() << "no CUDA device";
    if (FindVariant("splitk2_wgmma_64x128_s8_g8") == nullptr || cc_ < 90)
      GTEST_SKIP() << "no splitk variants on this device";
  }
  void TearDown() override { Stop(); }
};

// auto measures the splitk variants beside the kernels on skinny shapes; whatever it picks
// takes the problem and computes it right (NN fp16 through ChooseAuto, NT bf16 through
// ChooseAutoFor).
TEST_F(SplitKAuto, PicksAVariantThatTakesSkinnyShapesAndIsRight) {
  const VariantInfo& automatic = *FindVariant("auto");
  for (int m : {1, 16, 64}) {
    for (bool nt_bf16 : {false, true}) {
      const int n = 4096, k = 8192;
      const DataType t = nt_bf16 ? DataType::kBf16 : DataType::kFp16;
      void* a = Alloc(size_t(m) * k * 2);
      void* b = Alloc(size_t(k) * n * 2);
      void* out = Alloc(size_t(m) * n * 2);
      auto* ref = static_cast<float*>(Alloc(size_t(m) * n * sizeof(float)));
      ASSERT_FALSE(HasFailure());
      ASSERT_CUDA(Fill(a, size_t(m) * k, t));
      ASSERT_CUDA(Fill(b, size_t(k) * n, t));
      ASSERT_CUDA(
          testing::ReferenceGemmEx(a, b, ref, m, n, k, false, nt_bf16, 0, 0, nt_bf16, stream_));
      ASSERT_CUDA(Poison(out, size_t(m) * n, t));
      GemmProblem p{a, b, out, m, n, k, Accumulation::kFp32};
      p.transpose_b = nt_bf16;
      p.ab_type = p.c_type = t;
      LaunchContext ctx(stream_);
      const VariantInfo* chosen =
          nt_bf16 ? ChooseAutoFor(p, ctx) : &ChooseAuto(m, n, k, Accumulation::kFp32, ctx);
      ASSERT_NE(chosen, nullptr);
      EXPECT_EQ(CheckProblem(*chosen, p), "") << chosen->name;
      ASSERT_EQ(Launch(automatic, p, ctx), "");
      ASSERT_CUDA(cudaStreamSynchronize(stream_));
      std::vector<unsigned char> rows(size_t(m) * n * 2);
      std::vector<float> host_ref(size_t(m) * n);
      ASSERT_CUDA(cudaMemcpy(rows.data(), out, rows.size(), cudaMemcpyDeviceToHost));
      ASSERT_CUDA(cudaMemcpy(host_ref.data(), ref, host_ref.size() * sizeof(float),
                             cudaMemcpyDeviceToHost));
      const ErrorStats s = Compare(rows, t, host_ref);
      EXPECT_EQ(s.nan_count, 0u) << s.ToString();
      EXPECT_LE(s.rel_frobenius, nt_bf16 ? kKernelToleranceBf16 : kKernelTolerance.fp32_acc)
          << s.ToString();
      std::printf("[ auto   ] %dx%dx%d %s -> %s (rel_frob=%.3e)\n", m, n, k,
                  nt_bf16 ? "NT bf16" : "NN fp16", chosen->name.c_str(), s.rel_frobenius);
    }
  }
}

// SplitKReduce alone: s partials (packed, slice_stride apart, with a gap) into a C with row
// padding, against a float64 host sum; α/β with C_in, β = 0 with NaN in C_in, α = 0 with NaN
// partials, each C type.
struct ReduceCase {
  DataType c;
  float alpha, beta;
  bool nan_c_in, nan_partials;
};

class SplitKReduceTest : public GpuTest, public ::testing::TestWithParam<ReduceCase> {
 protected:
  void SetUp() override {
    if (!Start()) GTEST_SKIP() << "no CUDA device";
  }
  void TearDown() override { Stop(); }
};

float RoundTo(DataType t, float x) {
  if (t == DataType::kFp16) return HalfToFloat(FloatToHalf(x));
  if (t == DataType::kBf16) return Bf16ToFloat(FloatToBf16(x));
  return x;
}

TEST_P(SplitKReduceTest, MatchesFloat64SumWithAlphaBeta) {
  const ReduceCase& rc = GetParam();
  const int slices = 3, m = 7, n = 100, ldc = 104;  // n needs no alignment here
  const int64_t stride = int64_t(m) * n + 5;
  const size_t cb = DataTypeBytes(rc.c);
  uint32_t state = 2929;
  auto uniform = [&] {
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) / float(1u << 24) * 2.f - 1.f;
  };
  std::vector<float> partials(size_t(slices) * stride);
  for (float& x : partials) x = rc.nan_partials ? std::nanf("") : uniform();
  // C_in: values of C's type, rows ldc apart (the padding too), or all NaN.
  std::vector<float> c_in(size_t(m) * ldc);
  for (float& x : c_in) x = rc.nan_c_in ? std::nanf("") : RoundTo(rc.c, uniform());
  std::vector<unsigned char> c_in_bits(c_in.size() * cb);
  for (size_t i = 0; i < c_in.size(); ++i) {
    if (rc.c == DataType::kFp32) {
      std::memcpy(c_in_bits.data() + i * 4, &c_in[i], 4);
    } else {
      const uint16_t bits = rc.c == DataType::kFp16 ? FloatToHalf(c_in[i]) : FloatToBf16(c_in[i]);
      std::memcpy(c_in_bits.data() + i * 2, &bits, 2);
    }
  }
  auto* d_partials = static_cast<float*>(Alloc(partials.size() * sizeof(float)));
  void* d_c_in = Alloc(c_in_bits.size());
  void* d_c = Alloc(c_in_bits.size());
  ASSERT_FALSE(HasFailure());
  ASSERT_CUDA(cudaMemcpy(d_partials, partials.data(), partials.size() * sizeof(float),
                         cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(d_c_in, c_in_bits.data(), c_in_bits.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(Poison(d_c, size_t(m) * ldc, rc.c));
  ASSERT_CUDA(SplitKReduce(d_partials, slices, stride, m, n, d_c_in, d_c, ldc, rc.alpha, rc.beta,
                           rc.c, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  std::vector<unsigned char> all(c_in_bits.size());
  ASSERT_CUDA(cudaMemcpy(all.data(), d_c, all.size(), cudaMemcpyDeviceToHost));
  std::vector<unsigned char> rows(size_t(m) * n * cb);
  std::vector<float> expected(size_t(m) * n);
  for (int r = 0; r < m; ++r) {
    std::memcpy(rows.data() + size_t(r) * n * cb, all.data() + size_t(r) * ldc * cb,
                size_t(n) * cb);
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      if (rc.alpha != 0)
        for (int i = 0; i < slices; ++i) sum += partials[i * stride + int64_t(r) * n + j];
      double value = double(rc.alpha) * sum;
      if (rc.beta != 0) value += double(rc.beta) * c_in[size_t(r) * ldc + j];
      expected[size_t(r) * n + j] = float(value);
    }
  }
  const ErrorStats s = Compare(rows, rc.c, expected);
  // One rounding to C's type: half an ulp relative, 2^-11 (fp16), 2^-8 (bf16).
  const double bar = rc.c == DataType::kFp32 ? 1e-6 : rc.c == DataType::kFp16 ? 1e-3 : 4e-3;
  EXPECT_EQ(s.nan_count, 0u) << s.ToString();
  EXPECT_LE(s.rel_frobenius, bar) << s.ToString();
  std::printf("[ reduce ] %s alpha=%g beta=%g%s%s rel_frob=%.3e\n", DataTypeName(rc.c), rc.alpha,
              rc.beta, rc.nan_c_in ? " NaN C_in" : "", rc.nan_partials ? " NaN partials" : "",
              s.rel_frobenius);
}

std::vector<ReduceCase> ReduceCases() {
  std::vector<ReduceCase> cases;
  for (DataType c : {DataType::kFp16, DataType::kBf16, DataType::kFp32}) {
    cases.push_back({c, 1.0f, 0.0f, true, false});    // the splitk path: C_in never read
    cases.push_back({c, 0.75f, 0.0f, true, false});   // α ≠ 1, β = 0: still never read
    cases.push_back({c, 0.75f, 0.5f, false, false});  // α·Σ + β·C_in
    cases.push_back({c, 0.0f, -1.5f, false, true});   // α = 0: the partials are never read
  }
  return cases;
}

std::string ReduceCaseName(const ::testing::TestParamInfo<ReduceCase>& info) {
  const ReduceCase& rc = info.param;
  return std::string(DataTypeName(rc.c)) + "_" + std::to_string(info.index % 4);
}

INSTANTIATE_TEST_SUITE_P(Reduce, SplitKReduceTest, ::testing::ValuesIn(ReduceCases()),
                         ReduceCaseName);

TEST(SplitKReduceArgs, RefusesBadArgumentsWithoutLaunching) {
  float* fake = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced
  EXPECT_EQ(SplitKReduce(fake, 0, 64, 8, 8, nullptr, fake, 8, 1, 0, DataType::kFp32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SplitKReduce(fake, 2, 63, 8, 8, nullptr, fake, 8, 1, 0, DataType::kFp32, nullptr),
            cudaErrorInvalidValue);  // slices overlap
  EXPECT_EQ(SplitKReduce(fake, 2, 64, 8, 8, nullptr, fake, 7, 1, 0, DataType::kFp32, nullptr),
            cudaErrorInvalidValue);  // ldc < n
  EXPECT_EQ(SplitKReduce(fake, 2, 64, 8, 8, nullptr, fake, 8, 1, 0.5f, DataType::kFp32, nullptr),
            cudaErrorInvalidValue);  // beta ≠ 0 without C_in
}

}  // namespace
}  // namespace hgemm::kernels
