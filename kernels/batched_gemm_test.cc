// Strided batches and groups on the GPU: every variant × layout × type pair it takes,
// odd batch counts and odd shapes, against a float64 reference computed on the host from the
// very inputs the kernel read. C is poisoned with NaN first, and the gaps between a batch's
// items (strides past the packed ones) must still hold the poison afterwards: a one-launch
// batch (the wgmma family's 3-D tensor maps) may write nothing outside its items. Skips
// without a GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/assert_cuda.h"
#include "kernels/registry.h"
#include "kernels/testing.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"

namespace hgemm::kernels {
namespace {

struct Form {
  std::string variant;
  bool ta, tb;
  DataType ab, c;
  Accumulation acc;
};

std::vector<Form> Forms() {
  std::vector<Form> forms;
  for (const VariantInfo& v : Variants())
    for (int layout = 0; layout < 4; ++layout)
      for (const testing::TypeCombo& t : testing::kTypeCombos)
        if (v.SupportsLayout(layout & 2, layout & 1) && v.SupportsTypes(t.ab, t.c) &&
            v.Supports(t.acc))
          forms.push_back({v.name, bool(layout & 2), bool(layout & 1), t.ab, t.c, t.acc});
  return forms;
}

std::string FormName(const ::testing::TestParamInfo<Form>& info) {
  const Form& f = info.param;
  return f.variant + "_" + LayoutName(f.ta, f.tb) + "_" + testing::TypesTestName(f.ab, f.c) + "_" +
         AccumulationName(f.acc) + "acc";
}

// One GEMM shape of a batch or group, with `gap` elements between consecutive items' matrices
// (0: packed).
struct Shape {
  int batch, m, n, k, gap;
};

class BatchedGemm : public ::testing::TestWithParam<Form> {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu(&cc_)) GTEST_SKIP() << "no CUDA device";
    variant_ = FindVariant(GetParam().variant);
    ASSERT_NE(variant_, nullptr);
    if (variant_->min_sm > cc_) GTEST_SKIP() << variant_->name << " needs sm_" << variant_->min_sm;
    ASSERT_CUDA(cudaStreamCreate(&stream_));
    ctx_ = std::make_unique<LaunchContext>(stream_);
  }
  void TearDown() override {
    ctx_.reset();
    for (void* p : buffers_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }

  // A problem of `s` in this form with fresh random A and B (gaps included) and C all NaN.
  GemmProblem MakeProblem(const Shape& s) {
    const Form& f = GetParam();
    GemmProblem p{nullptr, nullptr, nullptr, s.m, s.n, s.k, f.acc};
    p.transpose_a = f.ta;
    p.transpose_b = f.tb;
    p.ab_type = f.ab;
    p.c_type = f.c;
    p.batch = s.batch;
    const int64_t a = int64_t(s.m) * s.k + s.gap, b = int64_t(s.k) * s.n + s.gap,
                  c = int64_t(s.m) * s.n + s.gap;
    if (s.gap > 0) {
      p.stride_a = a;
      p.stride_b = b;
      p.stride_c = c;
    }
    const size_t ab_bytes = DataTypeBytes(f.ab);
    p.a = Alloc(size_t(a) * s.batch * ab_bytes);
    p.b = Alloc(size_t(b) * s.batch * ab_bytes);
    p.c = Alloc(size_t(c) * s.batch * DataTypeBytes(f.c));
    if (HasFailure()) return p;
    EXPECT_EQ(testing::FillRandom(const_cast<void*>(p.a), size_t(a) * s.batch, f.ab, stream_),
              cudaSuccess);
    EXPECT_EQ(testing::FillRandom(const_cast<void*>(p.b), size_t(b) * s.batch, f.ab, stream_),
              cudaSuccess);
    EXPECT_EQ(testing::Poison(p.c, size_t(c) * s.batch * DataTypeBytes(f.c), f.c, stream_),
              cudaSuccess);
    return p;
  }

  // Gives `p` alpha and beta and a C_in of C's type, shape and strides: its own buffer of
  // fresh random values, or (in_place) C itself refilled so; with beta 0, all NaN instead (it
  // must not be read). *host gets C_in as floats, items StridesOf(p).c apart, for the reference.
  void Scale(GemmProblem& p, float alpha, float beta, bool in_place, std::vector<float>* host) {
    const Form& f = GetParam();
    const int64_t count = StridesOf(p).c * p.batch;
    const size_t bytes = size_t(count) * DataTypeBytes(f.c);
    void* c_in = in_place ? p.c : Alloc(bytes);
    if (HasFailure()) return;
    EXPECT_EQ(beta != 0 ? testing::FillRandom(c_in, size_t(count), f.c, stream_)
                        : testing::Poison(c_in, bytes, f.c, stream_),
              cudaSuccess);
    p.alpha = alpha;
    p.beta = beta;
    p.c_in = c_in;
    ToFloat(c_in, count, f.c, host);
  }

  // `count` elements of `type` at `device` as floats (synchronous).
  void ToFloat(const void* device, int64_t count, DataType type, std::vector<float>* out) {
    const size_t bytes = DataTypeBytes(type);
    std::vector<unsigned char> raw(size_t(count) * bytes);
    ASSERT_CUDA(cudaMemcpy(raw.data(), device, raw.size(), cudaMemcpyDeviceToHost));
    out->resize(count);
    if (type == DataType::kFp32)
      std::memcpy(out->data(), raw.data(), raw.size());
    else if (type == DataType::kBf16)
      Bf16ToFloat(reinterpret_cast<const uint16_t*>(raw.data()), out->data(), count);
    else
      HalfToFloat(reinterpret_cast<const uint16_t*>(raw.data()), out->data(), count);
  }

  // Checks every item of `p` (run and synchronized) against float64 sums of its inputs (times
  // p.alpha, plus p.beta times `c_in`, Scale's copy, where beta is not 0), and that the gaps
  // between items still hold the poison.
  void ExpectMatchesFloat64(const GemmProblem& p, const std::vector<float>& c_in = {}) {
    const Form& f = GetParam();
    const BatchStrides st = StridesOf(p);
    const size_t c_bytes = DataTypeBytes(f.c);
    std::vector<float> a, b, c;
    ASSERT_NO_FATAL_FAILURE(ToFloat(p.a, st.a * p.batch, f.ab, &a));
    ASSERT_NO_FATAL_FAILURE(ToFloat(p.b, st.b * p.batch, f.ab, &b));
    std::vector<unsigned char> raw_c(size_t(st.c) * p.batch * c_bytes);
    ASSERT_CUDA(cudaMemcpy(raw_c.data(), p.c, raw_c.size(), cudaMemcpyDeviceToHost));
    ASSERT_NO_FATAL_FAILURE(ToFloat(p.c, st.c * p.batch, f.c, &c));
    const int64_t lda = f.ta ? p.m : p.k, ldb = f.tb ? p.k : p.n, items = int64_t(p.m) * p.n;
    std::vector<float> ours, reference;  // the items' C, packed
    int64_t gap_writes = 0;
    for (int t = 0; t < p.batch; ++t) {
      const float* at = a.data() + t * st.a;
      const float* bt = b.data() + t * st.b;
      for (int i = 0; i < p.m; ++i)
        for (int j = 0; j < p.n; ++j) {
          double sum = 0;
          for (int l = 0; l < p.k; ++l)
            sum += double(f.ta ? at[l * lda + i] : at[i * lda + l]) *
                   double(f.tb ? bt[j * ldb + l] : bt[l * ldb + j]);
          const size_t at = size_t(t * st.c + int64_t(i) * p.n + j);
          reference.push_back(
              float(double(p.alpha) * sum + (p.beta != 0 ? double(p.beta) * c_in[at] : 0.0)));
          ours.push_back(c[at]);
        }
      // The gap after item t: every byte still the poison's.
      for (int64_t e = t * st.c + items; e < (t + 1) * st.c; ++e)
        for (size_t byte = 0; byte < c_bytes; byte += 2) {
          uint16_t bits;
          std::memcpy(&bits, raw_c.data() + e * c_bytes + byte, 2);
          gap_writes += bits != testing::PoisonBits(f.c);
        }
    }
    EXPECT_EQ(gap_writes, 0) << "elements written between items";
    const ErrorStats stats =
        CompareToReference(ours.data(), reference.data(), int64_t(ours.size()));
    const double bar = testing::ToleranceFor(f.c, f.acc);
    EXPECT_EQ(stats.nan_count, 0u) << stats.ToString();
    EXPECT_LE(stats.rel_frobenius, bar) << stats.ToString();
    std::printf("[ batch ] %-26s %s %-9s %s %dx%dx%dx%d stride_c %lld a=%g b=%g%s rel_frob=%.3e\n",
                variant_->name.c_str(), LayoutName(f.ta, f.tb), TypesName(f.ab, f.c).c_str(),
                AccumulationName(f.acc), p.batch, p.m, p.n, p.k, (long long)st.c, p.alpha, p.beta,
                p.c_in == p.c ? " in place" : "", stats.rel_frobenius);
  }

  int cc_ = 0;
  const VariantInfo* variant_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LaunchContext> ctx_;
  std::vector<void*> buffers_;
};

// Odd batch counts; odd M (a transposed A refuses it in the wgmma family: then Launch must
// refuse too); gaps of 8 and 64 elements between items.
const Shape kBatches[] = {
    {3, 72, 136, 40, 0}, {5, 129, 264, 104, 0}, {7, 33, 72, 24, 64},
    {1, 64, 128, 64, 0}, {9, 264, 520, 136, 8}, {2, 7, 8, 8, 0},
};

TEST_P(BatchedGemm, StridedBatchMatchesFloat64) {
  for (const Shape& s : kBatches) {
    SCOPED_TRACE(std::to_string(s.batch) + "x" + std::to_string(s.m) + "x" + std::to_string(s.n) +
                 "x" + std::to_string(s.k) + " gap " + std::to_string(s.gap));
    const GemmProblem p = MakeProblem(s);
    ASSERT_FALSE(HasFailure());
    if (!CheckProblem(*variant_, p).empty()) {
      EXPECT_NE(Launch(*variant_, p, *ctx_), "") << "launched a batch it refuses";
      continue;
    }
    ASSERT_EQ(Launch(*variant_, p, *ctx_), "");
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesFloat64(p));
  }
}

// A group of different shapes through LaunchGrouped (cublas: cublasGemmGroupedBatchedEx;
// the kernels: a loop of launches), each problem against its float64 reference.
TEST_P(BatchedGemm, GroupMatchesFloat64) {
  const Shape kGroup[] = {{1, 72, 136, 40, 0},   {1, 33, 264, 104, 0}, {1, 129, 72, 24, 0},
                          {1, 264, 520, 136, 0}, {1, 8, 8, 8, 0},      {1, 200, 64, 512, 0}};
  std::vector<GemmProblem> problems;
  for (const Shape& s : kGroup) {
    problems.push_back(MakeProblem(s));
    ASSERT_FALSE(HasFailure());
    if (!CheckProblem(*variant_, problems.back()).empty()) {
      EXPECT_NE(LaunchGrouped(*variant_, problems, *ctx_), "") << "launched a group it refuses";
      problems.pop_back();
    }
  }
  if (problems.size() < 2) GTEST_SKIP() << variant_->name << " takes too few of the group's shapes";
  const std::string error = LaunchGrouped(*variant_, problems, *ctx_);
  if (variant_->kind == VariantKind::kCublas && GetParam().acc == Accumulation::kFp16) {
    EXPECT_NE(error.find("fp32 only"), std::string::npos) << error;
    return;
  }
  ASSERT_EQ(error, "");
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  for (const GemmProblem& p : problems) ASSERT_NO_FATAL_FAILURE(ExpectMatchesFloat64(p));
}

// α/β on batches and groups, for the variants that apply them (fused_scale): each item's and
// each problem's own C_in (the item stride of C; a group: per-problem C_in), C_in aliasing C,
// and β = 0 with C_in all NaN.
TEST_P(BatchedGemm, ScaledBatchAndGroupMatchFloat64) {
  if (!variant_->fused_scale) GTEST_SKIP() << variant_->name << " does not apply alpha/beta";
  struct Scaled {
    Shape shape;
    float alpha, beta;
    bool in_place;
  };
  const Scaled kScaled[] = {{{5, 129, 264, 104, 8}, -0.5f, 0.25f, false},
                            {{3, 72, 136, 40, 0}, 2.f, 1.f, true},
                            {{7, 33, 72, 24, 64}, 2.f, 0.f, false}};
  for (const Scaled& sc : kScaled) {
    const Shape& s = sc.shape;
    SCOPED_TRACE(std::to_string(s.batch) + "x" + std::to_string(s.m) + "x" + std::to_string(s.n) +
                 "x" + std::to_string(s.k) + " alpha " + std::to_string(sc.alpha) + " beta " +
                 std::to_string(sc.beta) + (sc.in_place ? " in place" : ""));
    GemmProblem p = MakeProblem(s);
    std::vector<float> c_in;
    Scale(p, sc.alpha, sc.beta, sc.in_place, &c_in);
    ASSERT_FALSE(HasFailure());
    if (!CheckProblem(*variant_, p).empty()) {
      EXPECT_NE(Launch(*variant_, p, *ctx_), "") << "launched a batch it refuses";
      continue;
    }
    ASSERT_EQ(Launch(*variant_, p, *ctx_), "");
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesFloat64(p, c_in));
  }
  if (variant_->kind == VariantKind::kCublas && GetParam().acc == Accumulation::kFp16)
    return;  // cublasGemmGroupedBatchedEx: fp32 only (GroupMatchesFloat64)
  const Shape kGroup[] = {{1, 72, 136, 40, 0}, {1, 136, 264, 104, 0}, {1, 8, 8, 8, 0}};
  std::vector<GemmProblem> problems;
  std::vector<std::vector<float>> c_ins;
  for (const Shape& s : kGroup) {
    problems.push_back(MakeProblem(s));
    c_ins.emplace_back();
    Scale(problems.back(), -0.5f, 0.25f, /*in_place=*/false, &c_ins.back());
    ASSERT_FALSE(HasFailure());
    if (!CheckProblem(*variant_, problems.back()).empty()) {
      problems.pop_back();
      c_ins.pop_back();
    }
  }
  if (problems.size() < 2) return;
  ASSERT_EQ(LaunchGrouped(*variant_, problems, *ctx_), "");
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < problems.size(); ++i)
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesFloat64(problems[i], c_ins[i]));
}

const std::vector<Form> kForms = Forms();
INSTANTIATE_TEST_SUITE_P(Batches, BatchedGemm, ::testing::ValuesIn(kForms), FormName);

}  // namespace
}  // namespace hgemm::kernels
