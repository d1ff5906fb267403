// Test and benchmark helpers: an fp32 reference GEMM on the device and error metrics.
//
// Thread safety: stateless functions.
#ifndef HGEMM_KERNELS_TESTING_H_
#define HGEMM_KERNELS_TESTING_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct __half;  // cuda_fp16.h; host callers need only cuda_runtime.h

namespace hgemm::kernels::testing {

// Enqueues ref = A·B in fp32 (fp32 products and sums, fp32 output) on `stream`: a plain
// shared-memory tiled kernel, independent of the kernels under test. Row-major, any m, n, k >= 1.
cudaError_t ReferenceGemm(const __half* a, const __half* b, float* ref, int m, int n, int k,
                          cudaStream_t stream);

struct ErrorStats {
  double rel_frobenius = 0;  // ||out - ref||_F / ||ref||_F (NaNs excluded)
  double max_abs = 0;        // max |out - ref|
  size_t nan_count = 0;      // NaN or Inf outputs (unwritten elements stay NaN-poisoned)
  size_t first_bad = SIZE_MAX;  // index of the first NaN/Inf, or of the max error
};

// Compares fp16 output (raw bits, as copied from the device) against the fp32 reference.
ErrorStats Compare(const std::vector<uint16_t>& out_bits, const std::vector<float>& ref);

// "rel_frob=... max_abs=... nan=..." for messages.
std::string ToString(const ErrorStats& s);

}  // namespace hgemm::kernels::testing

#endif  // HGEMM_KERNELS_TESTING_H_
