// The CUDA backend's passes of Freivalds' check (server/verify/freivalds.h) as kernels: the
// same matrix-vector products the host passes compute, in fp32, on the slot's stream, so that
// the check reads A, B, C_in and C where the GEMM left them.
// Thread safety: launchers only; each queues work on the caller's stream.
#ifndef HGEMM_SERVER_BACKEND_CUDA_VERIFY_H_
#define HGEMM_SERVER_BACKEND_CUDA_VERIFY_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "server/core/shape.h"

namespace hgemm {

// Writes r_j = verify::GaussianAt(seed, j) for j < n into `r` (device, n floats).
cudaError_t LaunchGaussianVector(uint64_t seed, int64_t n, float* r, cudaStream_t stream);

// out_i = Σ_l M'(i, l)·v_l and sq_i = Σ_l M'(i, l)² for i < rows, M' (rows×cols) being `m` as
// stored (row-major rows×cols of `type`) or, when `transposed`, the transpose of `m` stored
// cols×rows. `v` (cols floats), `out` and `sq` (rows floats each) are device memory on the
// stream's device.
cudaError_t LaunchVerifyMatVec(const void* m, ElementType type, int64_t rows, int64_t cols,
                               bool transposed, const float* v, float* out, float* sq,
                               cudaStream_t stream);

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CUDA_VERIFY_H_
