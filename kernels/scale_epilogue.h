// The alpha/beta epilogue of a GEMM as its own elementwise kernel: C = alpha·T + beta·C_in,
// where T = op(A)·op(B) is an fp32 result a GEMM kernel wrote first; and the split-K reduce,
// the same epilogue over T = the sum of s fp32 partial products (splitk variants). fp32 math, one
// rounding to C's type, so the service's C equals BLAS's C = alpha·op(A)·op(B) + beta·C up to that
// rounding. ScaleEpilogue is the CUDA backend's path for variants that do not apply alpha/beta
// themselves (VariantInfo::fused_scale: the wgmma epilogue reads C_in tile by tile instead;
// docs/kernels_notes.md, "α/β fused").
//
// Thread safety: stateless; each call enqueues one kernel on `stream` and returns its launch
// error.
#ifndef HGEMM_KERNELS_SCALE_EPILOGUE_H_
#define HGEMM_KERNELS_SCALE_EPILOGUE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/registry.h"

namespace hgemm::kernels {

// For i in [0, count): c[i] = alpha·t[i] + beta·c_in[i], rounded to c_type (fp16, bf16 or
// fp32; c_in has that type too). beta == 0 reads no c_in (it may be null; a NaN there stays
// out of C), alpha == 0 reads no t (BLAS: A·B is not formed). c may be t (fp32 C, in place).
// REQUIRES: count ≥ 1; t, c and (with beta ≠ 0) c_in hold count elements on the current device.
cudaError_t ScaleEpilogue(const float* t, const void* c_in, void* c, int64_t count, float alpha,
                          float beta, DataType c_type, cudaStream_t stream);

// For every row r < m and column j < n: c[r·ldc + j] = alpha·Σ_i partials[i·slice_stride +
// r·n + j] + beta·c_in[r·ldc + j] over the `slices` packed m×n fp32 partials, summed in fp32 in
// slice order and rounded once to c_type (fp16, bf16 or fp32; c_in has that type and C's row
// stride). beta == 0 reads no c_in (it may be null; a NaN there stays out of C), alpha == 0
// reads no partials. Returns cudaErrorInvalidValue for a bad argument, else the launch error.
// REQUIRES: the partials, c and (with beta ≠ 0) c_in are device memory of the current device;
// the partials overlap neither (c_in may be c: in place); slice_stride >= m·n.
cudaError_t SplitKReduce(const float* partials, int slices, int64_t slice_stride, int m, int n,
                         const void* c_in, void* c, int ldc, float alpha, float beta,
                         DataType c_type, cudaStream_t stream);

}  // namespace hgemm::kernels

#endif  // HGEMM_KERNELS_SCALE_EPILOGUE_H_
