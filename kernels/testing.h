// Test and benchmark helpers: an fp32 reference GEMM on the device (compare its output with
// CompareToReference, proto/numerics/error_stats.h), and what the kernel tests share around it:
// the GPU probe, fresh random inputs and poisoned outputs by element type, the tolerance of a
// C type, the element type combinations a variant may take.
//
// Thread safety: stateless functions, except NextSeed (one counter; call it from one thread).
#ifndef HGEMM_KERNELS_TESTING_H_
#define HGEMM_KERNELS_TESTING_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/accumulation.h"
#include "kernels/registry.h"

struct __half;  // cuda_fp16.h; host callers need only cuda_runtime.h

namespace hgemm::kernels::testing {

// True if a CUDA device is usable, with device 0's compute capability (e.g. 90) in *cc; false
// (and the CUDA error cleared) without one.
bool HaveGpu(int* cc);

// A fresh seed per call (a counter): every buffer filled in a test process gets its own values.
uint64_t NextSeed();

// Fills count elements of `type` (fp16, bf16, or fp32 for a C input) at `data` with values
// uniform in [-1, 1), the inputs kKernelTolerance is set for, from a fresh seed.
cudaError_t FillRandom(void* data, size_t count, DataType type, cudaStream_t stream);

// The NaN bit pattern of a C of `type` (fp16 0x7E00; bf16 0x7FC0, and over fp32 C 0x7FC0 in both
// halves is a NaN too), and a fill of `bytes` bytes of C with it: elements a kernel does not
// write stay NaN and fail the check.
uint16_t PoisonBits(DataType type);
cudaError_t Poison(void* c, size_t bytes, DataType type, cudaStream_t stream);

// The largest relative Frobenius error against the reference that a correct C of `c_type`
// computed with `acc` has (proto/numerics/error_stats.h's kernel tolerances).
double ToleranceFor(DataType c_type, Accumulation acc);

// An element type combination a variant may take: A and B, C, accumulation.
struct TypeCombo {
  DataType ab, c;
  Accumulation acc;
};
// All of them: fp16 with either accumulation, fp16→fp32, bf16, bf16→fp32.
inline constexpr TypeCombo kTypeCombos[] = {
    {DataType::kFp16, DataType::kFp16, Accumulation::kFp32},
    {DataType::kFp16, DataType::kFp16, Accumulation::kFp16},
    {DataType::kFp16, DataType::kFp32, Accumulation::kFp32},
    {DataType::kBf16, DataType::kBf16, Accumulation::kFp32},
    {DataType::kBf16, DataType::kFp32, Accumulation::kFp32},
};

// TypesName (registry.h) fit for a GoogleTest parameter name: "fp16_to_fp32" for "fp16→fp32".
std::string TypesTestName(DataType ab, DataType c);

// Enqueues ref = A·B in fp32 (fp32 products and sums, fp32 output) on `stream`: a plain
// shared-memory tiled kernel, independent of the kernels under test. Row-major, any m, n, k >= 1.
cudaError_t ReferenceGemm(const __half* a, const __half* b, float* ref, int m, int n, int k,
                          cudaStream_t stream);

// The same for ref = op(A)·op(B) with GemmProblem's conventions (kernels/registry.h): op(A) m×k
// (A stored k×m if transpose_a), op(B) k×n (B stored n×k if transpose_b), stored rows lda / ldb
// elements apart (0: packed); elements fp16 or, with `bf16`, bf16. ref is m×n, packed.
cudaError_t ReferenceGemmEx(const void* a, const void* b, float* ref, int m, int n, int k,
                            bool transpose_a, bool transpose_b, int lda, int ldb, bool bf16,
                            cudaStream_t stream);

}  // namespace hgemm::kernels::testing

#endif  // HGEMM_KERNELS_TESTING_H_
