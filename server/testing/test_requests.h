// Requests for the server's tests: a unary GemmRequest with fresh random fp16 operands (never
// all zeros), and the header and chunk messages of a GemmStream. Test-only.
#ifndef HGEMM_SERVER_TESTING_TEST_REQUESTS_H_
#define HGEMM_SERVER_TESTING_TEST_REQUESTS_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "proto/numerics/cpu_gemm.h"
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

// A GemmStream header announcing gemm `id` of m×n×k (A by `a_handle` unless "").
inline v1::GemmStreamRequest StreamHeader(uint64_t id, uint32_t m, uint32_t n, uint32_t k,
                                          const std::string& a_handle = "") {
  v1::GemmStreamRequest message;
  v1::GemmHeader* h = message.mutable_header();
  h->set_gemm_id(id);
  h->set_m(m);
  h->set_n(n);
  h->set_k(k);
  h->set_a_handle(a_handle);
  return message;
}

// A GemmStream chunk: `data` at byte `offset` of `operand` of gemm `id`.
inline v1::GemmStreamRequest StreamChunk(uint64_t id, v1::Operand operand, uint64_t offset,
                                         std::string data) {
  v1::GemmStreamRequest message;
  v1::MatrixChunk* c = message.mutable_chunk();
  c->set_gemm_id(id);
  c->set_operand(operand);
  c->set_offset(offset);
  c->set_data(std::move(data));
  return message;
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_TEST_REQUESTS_H_
