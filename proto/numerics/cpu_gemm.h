// GEMM on the CPU with fp32 accumulation (OpenBLAS sgemm): the CPU backend's kernel and the
// reference that tests and `hgemm_client --check` compare against (with the error metric of
// proto/numerics/error_stats.h, included here for them).
//
// Matrices are row-major; fp16 matrices are raw binary16 bit patterns.
// Thread safety: pure functions; OpenBLAS parallelises each call internally.
#ifndef HGEMM_PROTO_NUMERICS_CPU_GEMM_H_
#define HGEMM_PROTO_NUMERICS_CPU_GEMM_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "proto/numerics/error_stats.h"

namespace hgemm {

// C (m×n, fp32) = A (m×k, fp16) · B (k×n, fp16), accumulated in fp32.
std::vector<float> ReferenceGemm(const uint16_t* a, const uint16_t* b, int64_t m, int64_t n,
                                 int64_t k);

// C (m×n, fp16) = fp16(A · B), accumulated in fp32. REQUIRES: c holds m·n elements.
void CpuGemm(const uint16_t* a, const uint16_t* b, uint16_t* c, int64_t m, int64_t n, int64_t k);

// `count` fp16 values drawn uniformly from [-1, 1) (never all zeros).
std::vector<uint16_t> RandomHalfMatrix(int64_t count, std::mt19937_64& rng);

// fp16 values as the little-endian bytes a request or an upload carries.
std::string HalfBytes(const std::vector<uint16_t>& half);

}  // namespace hgemm

#endif  // HGEMM_PROTO_NUMERICS_CPU_GEMM_H_
