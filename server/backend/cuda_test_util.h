// Helpers of the CUDA fault tests: one GEMM on fresh random fp16 inputs with a poisoned C,
// checked against the fp32 reference. Header-only, test code.
// Thread safety: a RandomGemm is used by one thread; different ones may run concurrently.
#ifndef HGEMM_SERVER_BACKEND_CUDA_TEST_UTIL_H_
#define HGEMM_SERVER_BACKEND_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/backend.h"

namespace hgemm {

// A GEMM of m×n×k with random operands; C starts as NaN (0xFFFF) so that an unwritten
// element fails the check.
struct RandomGemm {
  RandomGemm(int64_t m, int64_t n, int64_t k, uint64_t seed) : m(m), n(n), k(k) {
    std::mt19937_64 rng(seed);
    a = RandomHalfMatrix(m * k, rng);
    b = RandomHalfMatrix(k * n, rng);
    c.assign(m * n, 0xFFFF);
    job.shape = {.m = m, .n = n, .k = k};
    job.kernel = "auto";
    job.accumulation = Accumulation::kFp32;
    job.a = a.data();
    job.b = b.data();
    job.c = c.data();
  }

  absl::Status Run(Backend& backend, int slot) { return backend.Run(slot, job, &report); }

  // Relative Frobenius error of `result` (default: c) against the fp32 reference.
  double Error(const std::vector<uint16_t>* result = nullptr) const {
    std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
    return RelativeFrobeniusError((result ? *result : c).data(), reference.data(), m * n);
  }
  bool Correct(const std::vector<uint16_t>* result = nullptr) const {
    return Error(result) <= kKernelTolerance.fp32_acc;
  }

  const int64_t m, n, k;
  std::vector<uint16_t> a, b, c;
  GemmJob job;
  GemmReport report;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CUDA_TEST_UTIL_H_
