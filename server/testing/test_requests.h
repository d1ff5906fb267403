// Requests for the server's tests: a unary GemmRequest with fresh random fp16 operands (never
// all zeros), and one of any layout and types (batched or grouped) with its float64 reference.
// Test-only.
#ifndef HGEMM_SERVER_TESTING_TEST_REQUESTS_H_
#define HGEMM_SERVER_TESTING_TEST_REQUESTS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "proto/hgemm.pb.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/fp16.h"

namespace hgemm {

inline v1::GemmRequest RandomRequest(uint32_t m, uint32_t n, uint32_t k, std::mt19937_64& rng) {
  v1::GemmRequest r;
  r.set_m(m);
  r.set_n(n);
  r.set_k(k);
  auto a = RandomHalfMatrix(int64_t(m) * k, rng), b = RandomHalfMatrix(int64_t(k) * n, rng);
  r.set_a(reinterpret_cast<const char*>(a.data()), 2 * a.size());
  r.set_b(reinterpret_cast<const char*>(b.data()), 2 * b.size());
  return r;
}

// A request of any layout and types: random operands as stored (A k×m when transpose_a, B n×k
// when transpose_b) of `dtype` (FP16 or BF16), C of `c_dtype`; `batch` of each, packed.
inline v1::GemmRequest FormRequest(uint32_t m, uint32_t n, uint32_t k, bool transpose_a,
                                   bool transpose_b, v1::DataType dtype, v1::DataType c_dtype,
                                   std::mt19937_64& rng, uint32_t batch = 0) {
  v1::GemmRequest r;
  r.set_batch(batch);
  const int64_t count = std::max<uint32_t>(batch, 1);
  r.set_m(m);
  r.set_n(n);
  r.set_k(k);
  r.set_transpose_a(transpose_a);
  r.set_transpose_b(transpose_b);
  r.set_dtype(dtype);
  r.set_c_dtype(c_dtype);
  const bool bf16 = dtype == v1::DATA_TYPE_BF16;
  auto a = RandomHalfMatrix(count * m * k, rng, bf16);
  auto b = RandomHalfMatrix(count * k * n, rng, bf16);
  r.set_a(reinterpret_cast<const char*>(a.data()), 2 * a.size());
  r.set_b(reinterpret_cast<const char*>(b.data()), 2 * b.size());
  return r;
}

// A grouped request (GemmRequest.group) of `problems` (m, n, k each) and one form: random
// operands of each problem as stored, packed in order.
inline v1::GemmRequest GroupRequest(
    const std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>& problems, bool transpose_a,
    bool transpose_b, v1::DataType dtype, v1::DataType c_dtype, std::mt19937_64& rng) {
  v1::GemmRequest r;
  r.set_transpose_a(transpose_a);
  r.set_transpose_b(transpose_b);
  r.set_dtype(dtype);
  r.set_c_dtype(c_dtype);
  const bool bf16 = dtype == v1::DATA_TYPE_BF16;
  for (auto [m, n, k] : problems) {
    v1::GroupedProblem* p = r.add_group();
    p->set_m(m);
    p->set_n(n);
    p->set_k(k);
    r.mutable_a()->append(HalfBytes(RandomHalfMatrix(int64_t(m) * k, rng, bf16)));
    r.mutable_b()->append(HalfBytes(RandomHalfMatrix(int64_t(k) * n, rng, bf16)));
  }
  return r;
}

// The problems of a request in the order of its matrices: its group, or batch × (m, n, k).
inline std::vector<std::tuple<int64_t, int64_t, int64_t>> RequestProblems(
    const v1::GemmRequest& r) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> problems;
  for (const v1::GroupedProblem& p : r.group()) problems.emplace_back(p.m(), p.n(), p.k());
  if (r.group_size() == 0) problems.assign(std::max<uint32_t>(r.batch(), 1), {r.m(), r.n(), r.k()});
  return problems;
}

// An inline C_in for `r` (m×n of its c_dtype per problem): random values, never all zeros.
inline void SetRandomCIn(v1::GemmRequest* r, std::mt19937_64& rng) {
  int64_t count = 0;
  for (auto [m, n, k] : RequestProblems(*r)) count += m * n;
  if (r->c_dtype() == v1::DATA_TYPE_FP32) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> c(count);
    for (float& v : c) v = uniform(rng);
    r->set_c_in(reinterpret_cast<const char*>(c.data()), 4 * c.size());
    return;
  }
  r->set_c_in(HalfBytes(RandomHalfMatrix(count, rng, r->dtype() == v1::DATA_TYPE_BF16)));
}

// alpha·op(A)·op(B) + beta·C_in of a request with inline operands (C_in read only when beta
// ≠ 0, as the service does), in float64 by the definition (no BLAS).
// With r.batch() > 1 or a group, the problems' C_i one after the other.
inline std::vector<double> Float64Reference(const v1::GemmRequest& r) {
  const bool bf16 = r.dtype() == v1::DATA_TYPE_BF16;
  auto value = [bf16](const std::string& bytes, int64_t i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return double(bf16 ? Bf16ToFloat(h) : HalfToFloat(h));
  };
  auto c_in = [&](int64_t i) {
    if (r.c_dtype() != v1::DATA_TYPE_FP32) return value(r.c_in(), i);
    float f;
    std::memcpy(&f, r.c_in().data() + 4 * i, 4);
    return double(f);
  };
  const double alpha = r.has_alpha() ? r.alpha() : 1.0, beta = r.beta();
  std::vector<double> c;
  int64_t a0 = 0, b0 = 0;  // the problem's first element of A and B
  for (auto [m, n, k] : RequestProblems(r)) {
    const int64_t c0 = int64_t(c.size());
    c.resize(c0 + m * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          sum += value(r.a(), a0 + (r.transpose_a() ? p * m + i : i * k + p)) *
                 value(r.b(), b0 + (r.transpose_b() ? j * k + p : p * n + j));
        }
        c[c0 + i * n + j] = alpha * sum + (beta != 0 ? beta * c_in(c0 + i * n + j) : 0.0);
      }
    }
    a0 += m * k;
    b0 += k * n;
  }
  return c;
}

// The relative Frobenius error of `c` (m·n elements of the request's C type; NaN or a wrong size
// gives infinity) against Float64Reference(r).
inline double RelativeErrorOfC(const v1::GemmRequest& r, const std::string& c) {
  const std::vector<double> reference = Float64Reference(r);
  const bool fp32 = r.c_dtype() == v1::DATA_TYPE_FP32;
  const bool bf16 = !fp32 && r.dtype() == v1::DATA_TYPE_BF16;
  if (c.size() != (fp32 ? 4 : 2) * reference.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    double got;
    if (fp32) {
      float f;
      std::memcpy(&f, c.data() + 4 * i, 4);
      got = f;
    } else {
      uint16_t h;
      std::memcpy(&h, c.data() + 2 * i, 2);
      got = bf16 ? Bf16ToFloat(h) : HalfToFloat(h);
    }
    if (!std::isfinite(got)) return INFINITY;
    diff += (got - reference[i]) * (got - reference[i]);
    norm += reference[i] * reference[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_TEST_REQUESTS_H_
