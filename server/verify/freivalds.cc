#include "server/verify/freivalds.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <random>

#include "proto/numerics/fp16.h"
#include "server/verify/random_vector.h"

namespace hgemm::verify {
namespace {

constexpr double kU32 = 0x1p-24;  // unit roundoff of fp32

// Unit roundoff of C's type: its rounding of the fp32 result.
double UnitOf(ElementType type) {
  switch (type) {
    case ElementType::kFp16:
      return 0x1p-11;
    case ElementType::kBf16:
      return 0x1p-8;
    case ElementType::kFp32:
      return kU32;
  }
  return 0x1p-8;
}

// Half the smallest subnormal of `type`: the absolute error of rounding into its underflow.
double UnderflowOf(ElementType type) {
  switch (type) {
    case ElementType::kFp16:
      return 0x1p-25;
    case ElementType::kBf16:
      return 0x1p-134;
    case ElementType::kFp32:
      return 0x1p-150;
  }
  return 0x1p-25;
}

// The largest finite value of `type`.
double LargestOf(ElementType type) { return type == ElementType::kFp16 ? 65504.0 : 3.38e38; }

// `count` elements of `type` from element `offset` of `data`, as fp32.
void ToFloat(const void* data, ElementType type, int64_t offset, int64_t count, float* out) {
  switch (type) {
    case ElementType::kFp16:
      HalfToFloat(static_cast<const uint16_t*>(data) + offset, out, size_t(count));
      return;
    case ElementType::kBf16:
      Bf16ToFloat(static_cast<const uint16_t*>(data) + offset, out, size_t(count));
      return;
    case ElementType::kFp32:
      std::copy_n(static_cast<const float*>(data) + offset, count, out);
      return;
  }
}

// out_i = Σ_l M'(i, l)·v_l and sq_i = Σ_l M'(i, l)² for M' (rows×cols) = M as stored
// (row-major rows×cols) or, when `transposed`, the transpose of M stored cols×rows. One fp32
// running sum per element, as the bound assumes.
void MatVec(const void* m, ElementType type, int64_t rows, int64_t cols, bool transposed,
            const float* v, float* out, float* sq) {
  std::fill_n(out, rows, 0.0f);
  std::fill_n(sq, rows, 0.0f);
  if (!transposed) {
    std::vector<float> row(cols);
    for (int64_t i = 0; i < rows; ++i) {
      ToFloat(m, type, i * cols, cols, row.data());
      float s = 0, q = 0;
      for (int64_t l = 0; l < cols; ++l) {
        s += row[l] * v[l];
        q += row[l] * row[l];
      }
      out[i] = s;
      sq[i] = q;
    }
    return;
  }
  std::vector<float> stored(rows);  // row l of M as stored: column l of M'
  for (int64_t l = 0; l < cols; ++l) {
    ToFloat(m, type, l * rows, rows, stored.data());
    for (int64_t i = 0; i < rows; ++i) {
      out[i] += stored[i] * v[l];
      sq[i] += stored[i] * stored[i];
    }
  }
}

std::vector<float> RandomVector(uint64_t seed, int64_t n) {
  std::vector<float> r(n);
  for (int64_t j = 0; j < n; ++j) r[j] = GaussianAt(seed, j);
  return r;
}

}  // namespace

Form FormOf(const GemmJob& job, const ProblemDims& p) {
  return {.m = p.m,
          .n = p.n,
          .k = p.k,
          .transpose_a = job.transpose_a,
          .transpose_b = job.transpose_b,
          .ab_type = job.shape.ab_type,
          .c_type = job.shape.c_type,
          .accumulation = job.accumulation,
          .alpha = job.alpha,
          .beta = job.shape.c_input ? job.beta : 0.0f};
}

double Tolerance(const Form& form, double a_sq, double b_sq, double c_sq, double c_in_sq) {
  const double k = double(form.k), n = double(form.n);
  const bool fp16_acc = form.accumulation == Accumulation::kFp16;
  const double u_acc = fp16_acc ? 0x1p-11 : kU32;
  const double e_ab =
      2 * u_acc * (std::sqrt(k) + k / 16) + kU32 * (std::sqrt(n) + std::sqrt(k) + 3);
  const double e_in = kU32 * (std::sqrt(n) + 3);
  const double e_c = UnitOf(form.c_type) + kU32 * (std::sqrt(n) + 1);
  double sigma = e_c * std::sqrt(c_sq);
  if (form.alpha != 0) {
    sigma += std::fabs(double(form.alpha)) * e_ab * std::sqrt(a_sq) * std::sqrt(b_sq);
  }
  if (form.beta != 0) sigma += std::fabs(double(form.beta)) * e_in * std::sqrt(c_in_sq);
  // Underflow: of C into its type, of an fp16 running sum (k roundings), of the check's fp32
  // products.
  const double underflow = UnderflowOf(form.c_type) +
                           (fp16_acc ? std::fabs(double(form.alpha)) * k * 0x1p-25 : 0) +
                           n * 0x1p-149;
  sigma += std::sqrt(n) * underflow;
  return kSigmas * sigma;
}

bool MayOverflow(const Form& form, double a_sq, double b_sq, double c_in_sq) {
  const double ab = std::sqrt(a_sq) * std::sqrt(b_sq);  // bounds every partial sum of the row
  constexpr double kMargin = 0.99;                      // the norms' own rounding
  if (form.accumulation == Accumulation::kFp16 && ab >= kMargin * LargestOf(ElementType::kFp16)) {
    return true;
  }
  const double c = std::fabs(double(form.alpha)) * ab +
                   (form.beta != 0 ? std::fabs(double(form.beta)) * std::sqrt(c_in_sq) : 0);
  return !std::isfinite(c) || c >= kMargin * LargestOf(form.c_type);
}

std::string CheckRows(const Form& form, const RowSums& sums) {
  for (int64_t i = 0; i < form.m; ++i) {
    const double expected = sums.expected[i];
    if (!std::isfinite(expected)) continue;
    const double c_in_sq = sums.c_in_sq.empty() ? 0 : sums.c_in_sq[i];
    const double cr = sums.cr[i];
    if (!std::isfinite(cr) || !std::isfinite(sums.c_sq[i])) {
      if (MayOverflow(form, sums.a_sq[i], sums.b_sq, c_in_sq)) continue;
      return fmt::format(
          "row {}: C·r is {} (an infinity or NaN in the row, or values past fp32's range), "
          "though no value of the row can overflow",
          i, cr);
    }
    const double tolerance = Tolerance(form, sums.a_sq[i], sums.b_sq, sums.c_sq[i], c_in_sq);
    const double deviation = std::fabs(cr - expected);
    if (!(deviation <= tolerance)) {
      return fmt::format(
          "row {}: |C·r - (alpha·A·(B·r) + beta·C_in·r)| = {:.4g} exceeds the bound {:.4g}", i,
          deviation, tolerance);
    }
  }
  return "";
}

uint64_t FreshSeed() {
  static std::atomic<uint64_t> counter{[] {
    std::random_device device;
    return (uint64_t(device()) << 32) ^ device();
  }()};
  return Mix64(counter.fetch_add(1, std::memory_order_relaxed));
}

HostBSide HostB(const Form& form, const uint16_t* b, uint64_t seed) {
  HostBSide side{.seed = seed, .x = std::vector<float>(form.k)};
  const std::vector<float> r = RandomVector(seed, form.n);
  std::vector<float> sq(form.k);
  // op(B) is k×n: B as stored (k×n), or the transpose of B stored n×k.
  MatVec(b, form.ab_type, form.k, form.n, form.transpose_b, r.data(), side.x.data(), sq.data());
  for (float q : sq) side.b_sq += q;
  return side;
}

void HostExpected(const Form& form, const uint16_t* a, const void* c_in, const HostBSide& b,
                  RowSums* sums) {
  sums->expected.resize(form.m);
  sums->a_sq.resize(form.m);
  sums->b_sq = b.b_sq;
  std::vector<float> ax(form.m);
  MatVec(a, form.ab_type, form.m, form.k, form.transpose_a, b.x.data(), ax.data(),
         sums->a_sq.data());
  std::vector<float> c_in_r;
  if (form.beta != 0) {
    const std::vector<float> r = RandomVector(b.seed, form.n);
    c_in_r.resize(form.m);
    sums->c_in_sq.resize(form.m);
    MatVec(c_in, form.c_type, form.m, form.n, false, r.data(), c_in_r.data(), sums->c_in_sq.data());
  } else {
    sums->c_in_sq.clear();
  }
  for (int64_t i = 0; i < form.m; ++i) {
    sums->expected[i] = form.alpha * ax[i] + (form.beta != 0 ? form.beta * c_in_r[i] : 0.0f);
  }
}

void HostCr(const Form& form, const void* c, uint64_t seed, RowSums* sums) {
  const std::vector<float> r = RandomVector(seed, form.n);
  sums->cr.resize(form.m);
  sums->c_sq.resize(form.m);
  MatVec(c, form.c_type, form.m, form.n, false, r.data(), sums->cr.data(), sums->c_sq.data());
}

}  // namespace hgemm::verify
