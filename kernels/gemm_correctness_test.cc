// Every registered variant, both accumulations, on odd and large shapes, against an fp32
// reference GEMM. Fresh random inputs per case, output poisoned with NaN before each launch.
// Skips without a GPU. The Small suites are the ones compute-sanitizer runs.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/assert_cuda.h"
#include "kernels/registry.h"
#include "kernels/testing.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"

namespace hgemm::kernels {
namespace {

struct Shape {
  int m, n, k;
};

struct Case {
  std::string variant;
  Accumulation acc;
  Shape shape;
};

// The shapes, plus aligned neighbours so that the 16-byte kernels see every edge too.
const Shape kSmallShapes[] = {
    {1, 1, 1},    {7, 5, 3},       {33, 65, 17},   {255, 257, 100}, {1, 8, 8},    {7, 8, 16},
    {33, 72, 24}, {255, 264, 104}, {129, 136, 40}, {300, 256, 8},   {64, 64, 64}, {130, 520, 72},
};
const Shape kLargeShapes[] = {
    {1000, 1000, 1000},
    {4097, 4096, 4095},
    {4097, 4096, 4096},
    {8192, 64, 4096},
    {2048, 2048, 2048},
    {520, 1032, 2056},
    {8, 4096, 1024},
    // skinny_m16's split-K edges: a partial last panel and slab (K not a multiple of 64),
    // N past 8192, and K deep enough for many slabs over few panels.
    {13, 1000, 4104},
    {16, 8200, 2056},
    {3, 264, 32776},
};

std::vector<Case> Cases(const Shape* begin, const Shape* end) {
  std::vector<Case> cases;
  for (const VariantInfo& v : Variants())
    for (Accumulation acc : {Accumulation::kFp16, Accumulation::kFp32})
      if (v.Supports(acc))
        for (const Shape* s = begin; s != end; ++s) cases.push_back({v.name, acc, *s});
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.variant + "_" + AccumulationName(c.acc) + "_" + std::to_string(c.shape.m) + "x" +
         std::to_string(c.shape.n) + "x" + std::to_string(c.shape.k);
}

class GemmCorrectness : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu(&cc_)) GTEST_SKIP() << "no CUDA device";
    ASSERT_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    for (void* p : buffers_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  template <typename T>
  T* Alloc(size_t count) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, count * sizeof(T)), cudaSuccess);
    buffers_.push_back(p);
    return static_cast<T*>(p);
  }

  int cc_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
};

TEST_P(GemmCorrectness, MatchesFp32Reference) {
  const Case& c = GetParam();
  const VariantInfo* v = FindVariant(c.variant);
  ASSERT_NE(v, nullptr);
  if (v->min_sm > cc_) GTEST_SKIP() << v->name << " needs sm_" << v->min_sm;
  const int m = c.shape.m, n = c.shape.n, k = c.shape.k;

  auto* a = reinterpret_cast<__half*>(Alloc<uint16_t>(size_t(m) * k));
  auto* b = reinterpret_cast<__half*>(Alloc<uint16_t>(size_t(k) * n));
  auto* out = reinterpret_cast<__half*>(Alloc<uint16_t>(size_t(m) * n));
  float* ref = Alloc<float>(size_t(m) * n);
  ASSERT_FALSE(HasFailure());
  ASSERT_CUDA(testing::FillRandom(a, size_t(m) * k, DataType::kFp16, stream_));
  ASSERT_CUDA(testing::FillRandom(b, size_t(k) * n, DataType::kFp16, stream_));
  ASSERT_CUDA(testing::Poison(out, size_t(m) * n * 2, DataType::kFp16, stream_));
  ASSERT_CUDA(testing::ReferenceGemm(a, b, ref, m, n, k, stream_));

  LaunchContext ctx(stream_);
  const GemmProblem p{a, b, out, m, n, k, c.acc};
  const std::string error = Launch(*v, p, ctx);
  if (!v->can_implement(m, n, k)) {
    EXPECT_NE(error, "") << v->name << " accepted a shape it cannot take";
    return;
  }
  ASSERT_EQ(error, "");
  ASSERT_CUDA(cudaGetLastError());
  ASSERT_CUDA(cudaStreamSynchronize(stream_));

  std::vector<uint16_t> host_out(size_t(m) * n);  // fp16 bits
  std::vector<float> host_ref(size_t(m) * n);
  ASSERT_CUDA(
      cudaMemcpy(host_out.data(), out, host_out.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(
      cudaMemcpy(host_ref.data(), ref, host_ref.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const ErrorStats s =
      CompareToReference(host_out.data(), host_ref.data(), int64_t(host_out.size()));
  const double bar = kKernelTolerance.For(c.acc == Accumulation::kFp16);
  const std::string where = s.first_bad == SIZE_MAX ? std::string("-")
                                                    : std::to_string(s.first_bad / n) + "," +
                                                          std::to_string(s.first_bad % n);
  EXPECT_EQ(s.nan_count, 0u) << s.ToString() << " first bad (row,col)=" << where;
  EXPECT_LE(s.rel_frobenius, bar) << s.ToString() << " worst (row,col)=" << where;
  std::printf("[ result ] %-34s %s %5dx%5dx%5d %s\n", v->name.c_str(), AccumulationName(c.acc), m,
              n, k, s.ToString().c_str());
}

const std::vector<Case> kSmall = Cases(std::begin(kSmallShapes), std::end(kSmallShapes));
const std::vector<Case> kLarge = Cases(std::begin(kLargeShapes), std::end(kLargeShapes));
INSTANTIATE_TEST_SUITE_P(Small, GemmCorrectness, ::testing::ValuesIn(kSmall), CaseName);
INSTANTIATE_TEST_SUITE_P(Large, GemmCorrectness, ::testing::ValuesIn(kLarge), CaseName);

// fp16 accumulation at long K: every variant that offers it, on the same inputs as cuBLAS's
// fp16 compute mode, must stay within twice cuBLAS's error, and within the fp16 bar.
const Shape kLongKShapes[] = {
    {64, 64, 8192}, {64, 64, 32768}, {64, 64, 131072}, {3, 3, 70000}, {1, 1, 65536},
};

std::vector<Case> LongKCases() {
  std::vector<Case> cases;
  for (const VariantInfo& v : Variants())
    if (v.fp16_acc && v.kind != VariantKind::kCublas)
      for (const Shape& s : kLongKShapes) cases.push_back({v.name, Accumulation::kFp16, s});
  return cases;
}

class LongKFp16 : public GemmCorrectness {};

TEST_P(LongKFp16, WithinTwiceCublasError) {
  const Case& c = GetParam();
  const VariantInfo* v = FindVariant(c.variant);
  const VariantInfo* cublas = FindVariant("cublas");
  ASSERT_NE(v, nullptr);
  ASSERT_NE(cublas, nullptr);
  if (v->min_sm > cc_) GTEST_SKIP() << v->name << " needs sm_" << v->min_sm;
  const int m = c.shape.m, n = c.shape.n, k = c.shape.k;
  if (!v->can_implement(m, n, k)) GTEST_SKIP() << v->name << " does not take the shape";

  auto* a = reinterpret_cast<__half*>(Alloc<uint16_t>(size_t(m) * k));
  auto* b = reinterpret_cast<__half*>(Alloc<uint16_t>(size_t(k) * n));
  auto* out = reinterpret_cast<__half*>(Alloc<uint16_t>(size_t(m) * n));
  float* ref = Alloc<float>(size_t(m) * n);
  ASSERT_FALSE(HasFailure());
  ASSERT_CUDA(testing::FillRandom(a, size_t(m) * k, DataType::kFp16, stream_));
  ASSERT_CUDA(testing::FillRandom(b, size_t(k) * n, DataType::kFp16, stream_));
  ASSERT_CUDA(testing::ReferenceGemm(a, b, ref, m, n, k, stream_));
  std::vector<float> host_ref(size_t(m) * n);
  ASSERT_CUDA(cudaMemcpyAsync(host_ref.data(), ref, host_ref.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_));

  LaunchContext ctx(stream_);
  auto run = [&](const VariantInfo& variant, ErrorStats* stats) {
    ASSERT_CUDA(testing::Poison(out, size_t(m) * n * 2, DataType::kFp16, stream_));
    ASSERT_EQ(Launch(variant, GemmProblem{a, b, out, m, n, k, Accumulation::kFp16}, ctx), "");
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<uint16_t> host_out(size_t(m) * n);
    ASSERT_CUDA(cudaMemcpy(host_out.data(), out, host_out.size() * sizeof(uint16_t),
                           cudaMemcpyDeviceToHost));
    *stats = CompareToReference(host_out.data(), host_ref.data(), int64_t(host_out.size()));
  };
  ErrorStats ours, theirs;
  ASSERT_NO_FATAL_FAILURE(run(*v, &ours));
  ASSERT_NO_FATAL_FAILURE(run(*cublas, &theirs));
  EXPECT_EQ(ours.nan_count, 0u) << ours.ToString();
  EXPECT_LE(ours.rel_frobenius, 2 * theirs.rel_frobenius)
      << ours.ToString() << " vs cublas " << theirs.ToString();
  EXPECT_LE(ours.rel_frobenius, kKernelTolerance.fp16_acc) << ours.ToString();
  std::printf("[ longk  ] %-34s fp16 %5dx%5dx%6d rel_frob=%.3e cublas=%.3e\n", v->name.c_str(), m,
              n, k, ours.rel_frobenius, theirs.rel_frobenius);
}

const std::vector<Case> kLongK = LongKCases();
INSTANTIATE_TEST_SUITE_P(LongK, LongKFp16, ::testing::ValuesIn(kLongK), CaseName);

// Layouts × element types: every variant that takes more than NN fp16 packed, on odd
// shapes, each layout (NN, NT, TN, TT) and type pair (fp16 with either accumulation, fp16→fp32,
// bf16, bf16→fp32), plus row strides past the packed ones. Inputs fresh and random in the
// stored layout, C poisoned with NaN, an fp32 reference of op(A)·op(B) on the same inputs; the
// variant must be within the bar of its output type and, on outputs of 4096+ elements, within
// twice cuBLAS's error on the same inputs (the accuracy target).
struct LayoutCase {
  std::string variant;
  bool ta, tb;
  DataType ab, c;
  Accumulation acc;
  Shape shape;
  bool strided;  // lda, ldb, ldc = stored row length + 8
};

const Shape kLayoutShapes[] = {
    {1, 8, 8},       {7, 5, 3},          {8, 8, 8},         {33, 72, 24},
    {64, 136, 40},   {136, 72, 24},      {255, 257, 100},   {264, 136, 104},
    {129, 264, 104}, {1000, 1000, 1000}, {2056, 1032, 520}, {13, 1000, 4104},
};
const Shape kStridedShapes[] = {{136, 264, 104}, {1000, 1000, 1000}};

std::vector<LayoutCase> LayoutCases() {
  std::vector<LayoutCase> cases;
  for (const VariantInfo& v : Variants())
    for (int layout = 0; layout < 4; ++layout)
      for (const testing::TypeCombo& t : testing::kTypeCombos) {
        const bool ta = layout & 2, tb = layout & 1;
        // NN fp16 packed is the Small/Large suites' case.
        const bool beyond = ta || tb || t.ab != DataType::kFp16 || t.c != DataType::kFp16;
        if (!v.SupportsLayout(ta, tb) || !v.SupportsTypes(t.ab, t.c) || !v.Supports(t.acc))
          continue;
        if (beyond)
          for (const Shape& s : kLayoutShapes)
            cases.push_back({v.name, ta, tb, t.ab, t.c, t.acc, s, false});
        if (v.strided && t.acc == Accumulation::kFp32)
          for (const Shape& s : kStridedShapes)
            cases.push_back({v.name, ta, tb, t.ab, t.c, t.acc, s, true});
      }
  return cases;
}

std::string LayoutCaseName(const ::testing::TestParamInfo<LayoutCase>& info) {
  const LayoutCase& c = info.param;
  return c.variant + "_" + LayoutName(c.ta, c.tb) + "_" + testing::TypesTestName(c.ab, c.c) + "_" +
         AccumulationName(c.acc) + "acc_" + std::to_string(c.shape.m) + "x" +
         std::to_string(c.shape.n) + "x" + std::to_string(c.shape.k) + (c.strided ? "_ld" : "");
}

// A parameterized GPU test's stream and device buffers (freed after the test).
template <typename Param>
class DeviceCase : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu(&cc_)) GTEST_SKIP() << "no CUDA device";
    ASSERT_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    for (void* p : buffers_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }

  int cc_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
};
using LayoutCorrectness = DeviceCase<LayoutCase>;

TEST_P(LayoutCorrectness, MatchesFp32ReferenceAndCublas) {
  const LayoutCase& c = GetParam();
  const VariantInfo* v = FindVariant(c.variant);
  const VariantInfo* cublas = FindVariant("cublas");
  ASSERT_NE(v, nullptr);
  ASSERT_NE(cublas, nullptr);
  if (v->min_sm > cc_) GTEST_SKIP() << v->name << " needs sm_" << v->min_sm;
  const int m = c.shape.m, n = c.shape.n, k = c.shape.k;
  // Stored extents (rows × cols) and row strides.
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
  ASSERT_CUDA(testing::FillRandom(a, size_t(a_rows) * lda, c.ab, stream_));
  ASSERT_CUDA(testing::FillRandom(b, size_t(b_rows) * ldb, c.ab, stream_));
  ASSERT_CUDA(testing::ReferenceGemmEx(a, b, ref, m, n, k, c.ta, c.tb, lda, ldb,
                                       c.ab == DataType::kBf16, stream_));
  std::vector<float> host_ref(size_t(m) * n);
  ASSERT_CUDA(cudaMemcpyAsync(host_ref.data(), ref, host_ref.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_));

  GemmProblem p{a, b, out, m, n, k, c.acc};
  p.transpose_a = c.ta;
  p.transpose_b = c.tb;
  p.ab_type = c.ab;
  p.c_type = c.c;
  if (c.strided) {
    p.lda = lda;
    p.ldb = ldb;
    p.ldc = ldc;
  }
  LaunchContext ctx(stream_);
  // A variant that takes the layout and types may still refuse the shape (a transposed A needs
  // m % 8 == 0 in the wgmma family): then Launch must refuse it too.
  if (const std::string why = CheckProblem(*v, p); !why.empty()) {
    EXPECT_NE(Launch(*v, p, ctx), "") << v->name << " launched a problem it refuses";
    GTEST_SKIP() << why;
  }
  auto run = [&](const VariantInfo& variant, ErrorStats* stats) {
    // NaN in every element of C, the padding between rows included.
    ASSERT_CUDA(testing::Poison(out, size_t(m) * ldc * c_bytes, c.c, stream_));
    ASSERT_EQ(Launch(variant, p, ctx), "");
    ASSERT_CUDA(cudaGetLastError());
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    // Rows of C, gathered without the padding.
    std::vector<unsigned char> host(size_t(m) * n * c_bytes);
    ASSERT_CUDA(cudaMemcpy2D(host.data(), size_t(n) * c_bytes, out, size_t(ldc) * c_bytes,
                             size_t(n) * c_bytes, m, cudaMemcpyDeviceToHost));
    const int64_t count = int64_t(m) * n;
    if (c.c == DataType::kFp32)
      *stats =
          CompareToReference(reinterpret_cast<const float*>(host.data()), host_ref.data(), count);
    else if (c.c == DataType::kBf16)
      *stats = CompareBf16ToReference(reinterpret_cast<const uint16_t*>(host.data()),
                                      host_ref.data(), count);
    else
      *stats = CompareToReference(reinterpret_cast<const uint16_t*>(host.data()), host_ref.data(),
                                  count);
  };
  ErrorStats ours, theirs;
  ASSERT_NO_FATAL_FAILURE(run(*v, &ours));
  ASSERT_NO_FATAL_FAILURE(run(*cublas, &theirs));
  const double bar = testing::ToleranceFor(c.c, c.acc);
  const std::string where = ours.first_bad == SIZE_MAX ? std::string("-")
                                                       : std::to_string(ours.first_bad / n) + "," +
                                                             std::to_string(ours.first_bad % n);
  EXPECT_EQ(ours.nan_count, 0u) << ours.ToString() << " first bad (row,col)=" << where;
  EXPECT_LE(ours.rel_frobenius, bar) << ours.ToString() << " worst (row,col)=" << where;
  if (int64_t(m) * n >= 4096) {
    EXPECT_LE(ours.rel_frobenius, 2 * theirs.rel_frobenius)
        << ours.ToString() << " vs cublas " << theirs.ToString();
  }
  std::printf("[ layout ] %-26s %s %-9s %s %5dx%5dx%5d%s rel_frob=%.3e cublas=%.3e\n",
              v->name.c_str(), LayoutName(c.ta, c.tb), TypesName(c.ab, c.c).c_str(),
              AccumulationName(c.acc), m, n, k, c.strided ? " ld+8" : "", ours.rel_frobenius,
              theirs.rel_frobenius);
}

const std::vector<LayoutCase> kLayoutCases = LayoutCases();
INSTANTIATE_TEST_SUITE_P(Layouts, LayoutCorrectness, ::testing::ValuesIn(kLayoutCases),
                         LayoutCaseName);

// α/β: every variant that applies them itself (VariantInfo::fused_scale: the wgmma
// family in its epilogue, splitk in its reduce, cublas, auto), every layout and type pair it
// takes, odd shapes: C = α·op(A)·op(B) + β·C_in with C_in fresh and random of C's type (its own
// buffer, or C itself: in place), checked against α·ref + β·C_in from the fp32 reference and
// the very C_in the kernel read, within the bar of C's type and, on 4096+ outputs, within twice
// cuBLAS's error with the same α, β and C_in. β = 0 runs with C_in all NaN (C itself too when
// in place): a kernel that reads it fails. NN fp16 gets the whole α ∈ {1, -0.5, 2} × β ∈ {0, 1,
// 0.25} grid; the other forms α = -0.5 with β = 0.25 and α = 2 with β = 0.
struct ScaledCase {
  std::string variant;
  bool ta, tb;
  DataType ab, c;
  Accumulation acc;
  float alpha, beta;
  Shape shape;
  bool in_place;  // c_in == c
  bool strided;   // lda, ldb, ldc = stored row length + 8
};

std::vector<ScaledCase> ScaledCases() {
  const std::pair<float, float> kGrid[] = {{1.f, 1.f},   {1.f, 0.25f},   {-0.5f, 0.f},
                                           {-0.5f, 1.f}, {-0.5f, 0.25f}, {2.f, 0.f},
                                           {2.f, 1.f},   {2.f, 0.25f}};
  const Shape kGridShapes[] = {{255, 264, 104}, {1000, 1000, 1000}};
  const Shape kFormShapes[] = {{7, 8, 16}, {129, 264, 104}, {264, 520, 136}};
  const Shape kInPlace = {136, 264, 104};
  std::vector<ScaledCase> cases;
  for (const VariantInfo& v : Variants()) {
    if (!v.fused_scale) continue;
    for (int layout = 0; layout < 4; ++layout)
      for (const testing::TypeCombo& t : testing::kTypeCombos) {
        const bool ta = layout & 2, tb = layout & 1;
        if (!v.SupportsLayout(ta, tb) || !v.SupportsTypes(t.ab, t.c) || !v.Supports(t.acc))
          continue;
        auto add = [&](float alpha, float beta, Shape s, bool in_place, bool strided) {
          cases.push_back({v.name, ta, tb, t.ab, t.c, t.acc, alpha, beta, s, in_place, strided});
        };
        const bool nn_fp16 = !ta && !tb && t.ab == DataType::kFp16 && t.c == DataType::kFp16;
        if (nn_fp16 && t.acc == Accumulation::kFp32)
          for (auto [alpha, beta] : kGrid)
            for (const Shape& s : kGridShapes) add(alpha, beta, s, false, false);
        for (const Shape& s : kFormShapes) {
          add(-0.5f, 0.25f, s, false, false);
          add(2.f, 0.f, s, false, false);
        }
        add(2.f, 1.f, kInPlace, true, false);
        add(-0.5f, 0.f, kInPlace, true, false);
        if (v.strided && t.acc == Accumulation::kFp32) add(-0.5f, 0.25f, kInPlace, false, true);
      }
  }
  return cases;
}

std::string ScaledCaseName(const ::testing::TestParamInfo<ScaledCase>& info) {
  const ScaledCase& c = info.param;
  auto number = [](float x) {  // "m0_5" for -0.5, "0_25", "2"
    std::string text = std::to_string(x);
    text.erase(text.find_last_not_of('0') + 1);
    if (text.back() == '.') text.pop_back();
    for (char& ch : text) ch = ch == '-' ? 'm' : ch == '.' ? '_' : ch;
    return text;
  };
  return c.variant + "_" + LayoutName(c.ta, c.tb) + "_" + testing::TypesTestName(c.ab, c.c) + "_" +
         AccumulationName(c.acc) + "acc_a" + number(c.alpha) + "_b" + number(c.beta) + "_" +
         std::to_string(c.shape.m) + "x" + std::to_string(c.shape.n) + "x" +
         std::to_string(c.shape.k) + (c.in_place ? "_inplace" : "") + (c.strided ? "_ld" : "");
}

using ScaledCorrectness = DeviceCase<ScaledCase>;

TEST_P(ScaledCorrectness, MatchesReferenceAndCublas) {
  const ScaledCase& c = GetParam();
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
  const size_t c_total = size_t(m) * ldc * c_bytes;  // C and C_in: m rows, ldc apart
  void* a = Alloc(size_t(a_rows) * lda * ab_bytes);
  void* b = Alloc(size_t(b_rows) * ldb * ab_bytes);
  void* out = Alloc(c_total);
  void* c_in = c.in_place ? out : Alloc(c_total);
  void* c_in_source = Alloc(c_total);  // what C_in holds before each run
  auto* ref = static_cast<float*>(Alloc(size_t(m) * n * sizeof(float)));
  ASSERT_FALSE(HasFailure());
  ASSERT_CUDA(testing::FillRandom(a, size_t(a_rows) * lda, c.ab, stream_));
  ASSERT_CUDA(testing::FillRandom(b, size_t(b_rows) * ldb, c.ab, stream_));
  if (c.beta != 0)
    ASSERT_CUDA(testing::FillRandom(c_in_source, c_total / c_bytes, c.c, stream_));
  else  // must not be read
    ASSERT_CUDA(testing::Poison(c_in_source, c_total, c.c, stream_));
  ASSERT_CUDA(testing::ReferenceGemmEx(a, b, ref, m, n, k, c.ta, c.tb, lda, ldb,
                                       c.ab == DataType::kBf16, stream_));
  std::vector<float> expected(size_t(m) * n);
  ASSERT_CUDA(cudaMemcpyAsync(expected.data(), ref, expected.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_));
  std::vector<unsigned char> c_in_bits(size_t(m) * n * c_bytes);
  ASSERT_CUDA(cudaMemcpy2DAsync(c_in_bits.data(), size_t(n) * c_bytes, c_in_source,
                                size_t(ldc) * c_bytes, size_t(n) * c_bytes, m,
                                cudaMemcpyDeviceToHost, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char* e = c_in_bits.data() + i * c_bytes;
    uint16_t bits = 0;
    if (c_bytes == 2) std::memcpy(&bits, e, 2);
    float in = 0;
    if (c.c == DataType::kFp32)
      std::memcpy(&in, e, 4);
    else
      in = c.c == DataType::kBf16 ? Bf16ToFloat(bits) : HalfToFloat(bits);
    expected[i] = float(double(c.alpha) * expected[i] + (c.beta != 0 ? double(c.beta) * in : 0.0));
  }

  GemmProblem p{a, b, out, m, n, k, c.acc};
  p.transpose_a = c.ta;
  p.transpose_b = c.tb;
  p.ab_type = c.ab;
  p.c_type = c.c;
  p.alpha = c.alpha;
  p.beta = c.beta;
  p.c_in = c_in;
  if (c.strided) {
    p.lda = lda;
    p.ldb = ldb;
    p.ldc = ldc;
  }
  LaunchContext ctx(stream_);
  if (const std::string why = CheckProblem(*v, p); !why.empty()) {
    EXPECT_NE(Launch(*v, p, ctx), "") << v->name << " launched a problem it refuses";
    GTEST_SKIP() << why;
  }
  auto run = [&](const VariantInfo& variant, ErrorStats* stats) {
    if (!c.in_place) ASSERT_CUDA(testing::Poison(out, c_total, c.c, stream_));
    ASSERT_CUDA(cudaMemcpyAsync(c_in, c_in_source, c_total, cudaMemcpyDeviceToDevice, stream_));
    ASSERT_EQ(Launch(variant, p, ctx), "");
    ASSERT_CUDA(cudaGetLastError());
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    std::vector<unsigned char> host(size_t(m) * n * c_bytes);
    ASSERT_CUDA(cudaMemcpy2D(host.data(), size_t(n) * c_bytes, out, size_t(ldc) * c_bytes,
                             size_t(n) * c_bytes, m, cudaMemcpyDeviceToHost));
    const int64_t count = int64_t(m) * n;
    if (c.c == DataType::kFp32)
      *stats =
          CompareToReference(reinterpret_cast<const float*>(host.data()), expected.data(), count);
    else if (c.c == DataType::kBf16)
      *stats = CompareBf16ToReference(reinterpret_cast<const uint16_t*>(host.data()),
                                      expected.data(), count);
    else
      *stats = CompareToReference(reinterpret_cast<const uint16_t*>(host.data()), expected.data(),
                                  count);
  };
  ErrorStats ours, theirs;
  ASSERT_NO_FATAL_FAILURE(run(*v, &ours));
  ASSERT_NO_FATAL_FAILURE(run(*cublas, &theirs));
  const double bar = testing::ToleranceFor(c.c, c.acc);
  const std::string where = ours.first_bad == SIZE_MAX ? std::string("-")
                                                       : std::to_string(ours.first_bad / n) + "," +
                                                             std::to_string(ours.first_bad % n);
  EXPECT_EQ(ours.nan_count, 0u) << ours.ToString() << " first bad (row,col)=" << where;
  EXPECT_LE(ours.rel_frobenius, bar) << ours.ToString() << " worst (row,col)=" << where;
  if (int64_t(m) * n >= 4096) {
    EXPECT_LE(ours.rel_frobenius, 2 * theirs.rel_frobenius)
        << ours.ToString() << " vs cublas " << theirs.ToString();
  }
  std::printf("[ scaled ] %-30s %s %-9s %s a=%g b=%g %5dx%5dx%5d%s%s rel_frob=%.3e cublas=%.3e\n",
              v->name.c_str(), LayoutName(c.ta, c.tb), TypesName(c.ab, c.c).c_str(),
              AccumulationName(c.acc), c.alpha, c.beta, m, n, k, c.in_place ? " in place" : "",
              c.strided ? " ld+8" : "", ours.rel_frobenius, theirs.rel_frobenius);
}

const std::vector<ScaledCase> kScaledCases = ScaledCases();
INSTANTIATE_TEST_SUITE_P(Scaled, ScaledCorrectness, ::testing::ValuesIn(kScaledCases),
                         ScaledCaseName);

// The persistent wgmma kernels (cooperative and ping-pong) with several tiles per block on a
// 132-SM H200, every form: 17×23 = 391 tiles of 128×128 (2 or 3 per block: the ping-pong
// consumers' turns end on either one) with 7 K tiles against a 6-stage ring, and 1024 tiles of
// a single K tile (7 or 8 per block: the ring's phases run on across tiles).
const Shape kPersistentShapes[] = {{17 * 128, 23 * 128, 392}, {4096, 4096, 8}};

std::vector<LayoutCase> PersistentCases() {
  std::vector<LayoutCase> cases;
  for (const VariantInfo& v : Variants()) {
    if (v.kind != VariantKind::kKernel || v.name.rfind("wgmma_", 0) != 0) continue;
    for (int layout = 0; layout < 4; ++layout)
      for (const testing::TypeCombo& t : testing::kTypeCombos)
        if (v.SupportsLayout(layout & 2, layout & 1) && v.SupportsTypes(t.ab, t.c) &&
            v.Supports(t.acc))
          for (const Shape& s : kPersistentShapes)
            cases.push_back(
                {v.name, bool(layout & 2), bool(layout & 1), t.ab, t.c, t.acc, s, false});
  }
  return cases;
}

const std::vector<LayoutCase> kPersistentCases = PersistentCases();
INSTANTIATE_TEST_SUITE_P(Persistent, LayoutCorrectness, ::testing::ValuesIn(kPersistentCases),
                         LayoutCaseName);

// A second launch of the same bucket must reuse the tuned choice.
TEST(AutoTune, CachesTheChoicePerBucket) {
  int cc = 0;
  if (!testing::HaveGpu(&cc)) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreate(&stream));
  {
    LaunchContext ctx(stream);
    const VariantInfo& first = ChooseAuto(1024, 1024, 1024, Accumulation::kFp32, ctx);
    EXPECT_EQ(first.kind, VariantKind::kKernel);
    EXPECT_TRUE(first.fp32_acc);
    EXPECT_EQ(CachedAutoChoice(1000, 1000, 1000, Accumulation::kFp32), &first);
    EXPECT_EQ(&ChooseAuto(1000, 1000, 1000, Accumulation::kFp32, ctx), &first);
    const VariantInfo& odd = ChooseAuto(1000, 1000, 999, Accumulation::kFp32, ctx);
    EXPECT_TRUE(odd.is_fallback || odd.kind == VariantKind::kPadded) << odd.name;
    std::printf("[ auto   ] 1000x1000x999 fp32 -> %s\n", odd.name.c_str());
    std::printf("[ auto   ] 1024^3 fp32 -> %s\n", first.name.c_str());
    // Under 16 rows m buckets by its own power of two: one row is not tuned for sixteen.
    const VariantInfo& one_row = ChooseAuto(1, 4096, 4096, Accumulation::kFp32, ctx);
    EXPECT_EQ(CachedAutoChoice(1, 4096, 4096, Accumulation::kFp32), &one_row);
    EXPECT_EQ(CachedAutoChoice(16, 4096, 4096, Accumulation::kFp32), nullptr);
    const VariantInfo& rows16 = ChooseAuto(16, 4096, 4096, Accumulation::kFp32, ctx);
    EXPECT_EQ(CachedAutoChoice(9, 4096, 4096, Accumulation::kFp32), &rows16);
    std::printf("[ auto   ] 1x4096x4096 fp32 -> %s, 16x4096x4096 -> %s\n", one_row.name.c_str(),
                rows16.name.c_str());
  }
  {
    // Other layouts and types: tuned per (bucket, layout, types) among the kernels that take them.
    LaunchContext ctx(stream);
    void* buf = nullptr;
    ASSERT_CUDA(cudaMalloc(&buf, 3 << 20));
    auto* base = static_cast<unsigned char*>(buf);
    GemmProblem p{base, base + (1 << 20), base + (2 << 20), 512, 512, 512, Accumulation::kFp32};
    p.transpose_b = true;
    p.ab_type = p.c_type = DataType::kBf16;
    const VariantInfo* nt = ChooseAutoFor(p, ctx);
    if (FindVariant("wgmma_128x256_s4_g8") != nullptr && cc >= 90) {
      ASSERT_NE(nt, nullptr);
      EXPECT_EQ(CheckProblem(*nt, p), "") << nt->name;
      p.m = p.n = p.k = 504;  // the same bucket (rounded up to 512)
      EXPECT_EQ(ChooseAutoFor(p, ctx), nt);
      std::printf("[ auto   ] 512^3 NT bf16 -> %s\n", nt->name.c_str());
    }
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    ASSERT_CUDA(cudaFree(buf));
  }
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace hgemm::kernels
