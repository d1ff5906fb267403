// Test and benchmark helpers: an fp32 reference GEMM on the device (compare its output with
// CompareToReference, proto/numerics/error_stats.h).
//
// Thread safety: stateless functions.
#ifndef HGEMM_KERNELS_TESTING_H_
#define HGEMM_KERNELS_TESTING_H_

#include <cuda_runtime.h>

struct __half;  // cuda_fp16.h; host callers need only cuda_runtime.h

namespace hgemm::kernels::testing {

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
