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

// How a GEMM's operands and result are stored (hgemm.v1's transpose_a/b, dtype, c_dtype):
// C = op(A)·op(B), BLAS semantics on row-major storage. The default is the original problem.
struct GemmForm {
  bool transpose_a = false;  // A is stored k×m (else m×k)
  bool transpose_b = false;  // B is stored n×k (else k×n)
  bool bf16 = false;         // A and B are bf16 (else fp16)
  bool c_fp32 = false;       // C is fp32 (else the type of A and B)
};

// The scales of C = alpha·op(A)·op(B) + beta·C_in (hgemm.v1's alpha, beta, c_in). C_in is m×n
// of the form's C type and is read only when beta ≠ 0 (BLAS: a NaN there stays out of C).
struct GemmScale {
  float alpha = 1;
  float beta = 0;
  const void* c_in = nullptr;  // REQUIRES: set when beta ≠ 0
};

// C_in as fp32 (m·n elements of form's C type), for a reference.
std::vector<float> CInToFloat(const void* c_in, int64_t count, const GemmForm& form);

// C (m×n, fp32) = alpha·op(A)·op(B) + beta·C_in, accumulated in fp32 (OpenBLAS sgemm's
// transposes and scales on fp32 copies of A, B and C_in as stored).
std::vector<float> ReferenceGemm(const uint16_t* a, const uint16_t* b, int64_t m, int64_t n,
                                 int64_t k, const GemmForm& form = {}, const GemmScale& scale = {});

// C (m×n, of form's C type) = alpha·op(A)·op(B) + beta·C_in, accumulated in fp32 and rounded
// once to C's type. c may be scale.c_in (in place). REQUIRES: c holds m·n elements of that type.
void CpuGemm(const uint16_t* a, const uint16_t* b, void* c, int64_t m, int64_t n, int64_t k,
             const GemmForm& form = {}, const GemmScale& scale = {});

// A computed C of form's C type (fp16, bf16 or fp32 elements) against an fp32 reference.
ErrorStats CompareToReference(const void* c, const float* reference, int64_t count,
                              const GemmForm& form);

// The relative Frobenius error a server's C of this form may have (kServiceTolerance, and for a
// bf16 C at least bf16's own rounding, kKernelToleranceBf16).
double ServiceTolerance(bool fp16_accumulation, const GemmForm& form);

// `count` fp16 values drawn uniformly from [-1, 1) (never all zeros); with `bf16`, bf16 values.
std::vector<uint16_t> RandomHalfMatrix(int64_t count, std::mt19937_64& rng, bool bf16 = false);

// fp16 values as the little-endian bytes a request or an upload carries.
std::string HalfBytes(const std::vector<uint16_t>& half);

}  // namespace hgemm

#endif  // HGEMM_PROTO_NUMERICS_CPU_GEMM_H_
