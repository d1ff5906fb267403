// Requests for the server's tests: a unary GemmRequest with fresh random fp16 operands (never
// all zeros). Test-only.
#ifndef HGEMM_SERVER_TEST_REQUESTS_H_
#define HGEMM_SERVER_TEST_REQUESTS_H_

#include <cstdint>
#include <random>

#include "kernels/host/cpu_gemm.h"
#include "proto/hgemm.pb.h"

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

}  // namespace hgemm

#endif  // HGEMM_SERVER_TEST_REQUESTS_H_
