// Device-side fills for fp16 (and bf16, fp32) buffers: seeded uniform random values (tests,
// benchmarks, tuning scratch), a constant bit pattern (poisoning outputs before a check), and a
// zero-padding copy.
//
// Thread safety: stateless; each call enqueues one kernel on `stream` and returns its launch error.
#ifndef HGEMM_KERNELS_FILL_H_
#define HGEMM_KERNELS_FILL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

struct __half;         // cuda_fp16.h; host callers need only cuda_runtime.h
struct __nv_bfloat16;  // cuda_bf16.h

namespace hgemm::kernels {

// Fills data[0..count) with values uniform in [lo, hi), a pure function of (seed, index).
cudaError_t FillUniform(__half* data, size_t count, uint64_t seed, float lo, float hi,
                        cudaStream_t stream);

// The same for bf16 data (values rounded to bf16).
cudaError_t FillUniform(__nv_bfloat16* data, size_t count, uint64_t seed, float lo, float hi,
                        cudaStream_t stream);

// The same for fp32 data (a C input of fp32 C, α/β tests).
cudaError_t FillUniform(float* data, size_t count, uint64_t seed, float lo, float hi,
                        cudaStream_t stream);

// Sets every element of data[0..count) to the fp16 bit pattern `bits` (0x7E00 is a quiet NaN;
// for bf16 data 0x7FC0, and over fp32 data 0x7FC0 in both halves is a NaN too).
cudaError_t FillBits(__half* data, size_t count, uint16_t bits, cudaStream_t stream);

// Copies the logical matrix S (rows × cols, 2-byte elements: fp16 or bf16 bits) into the packed
// row-major dst (dst_rows × dst_cols): dst[r][c] = S[r][c] where both exist, 0 elsewhere in dst.
// S is stored row-major with src_ld elements between rows, or transposed (S[r][c] at
// src[c * src_ld + r]) when src_transposed: a padded copy is also an NN, packed one.
cudaError_t CopyPadded(uint16_t* dst, int dst_rows, int dst_cols, const uint16_t* src, int rows,
                       int cols, int src_ld, bool src_transposed, cudaStream_t stream);

}  // namespace hgemm::kernels

#endif  // HGEMM_KERNELS_FILL_H_
