#include "kernels/testing.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hgemm::kernels::testing {
namespace {

constexpr int kTile = 32;

__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

// op(A)[r][c] of a row-major A stored with rows `ld` apart (transposed: A[c][r]).
template <typename T>
__device__ __forceinline__ float At(const T* x, bool transposed, int ld, int r, int c) {
  return ToFloat(transposed ? x[size_t(c) * ld + r] : x[size_t(r) * ld + c]);
}

// @tparam T  element type of A and B (__half or __nv_bfloat16).
template <typename T>
__global__ void ReferenceGemmKernel(const T* __restrict__ a, const T* __restrict__ b,
                                    float* __restrict__ ref, int m, int n, int k, bool ta, bool tb,
                                    int lda, int ldb) {
  __shared__ float sa[kTile][kTile + 1];
  __shared__ float sb[kTile][kTile + 1];
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    const int ka = k0 + threadIdx.x;
    const int kb = k0 + threadIdx.y;
    sa[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? At(a, ta, lda, row, ka) : 0.f;
    sb[threadIdx.y][threadIdx.x] = (kb < k && col < n) ? At(b, tb, ldb, kb, col) : 0.f;
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTile; ++kk) acc = fmaf(sa[threadIdx.y][kk], sb[kk][threadIdx.x], acc);
    __syncthreads();
  }
  if (row < m && col < n) ref[size_t(row) * n + col] = acc;
}

}  // namespace

cudaError_t ReferenceGemmEx(const void* a, const void* b, float* ref, int m, int n, int k,
                            bool transpose_a, bool transpose_b, int lda, int ldb, bool bf16,
                            cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid((n + kTile - 1) / kTile, (m + kTile - 1) / kTile);
  if (lda == 0) lda = transpose_a ? m : k;
  if (ldb == 0) ldb = transpose_b ? k : n;
  if (bf16)
    ReferenceGemmKernel<<<grid, block, 0, stream>>>(static_cast<const __nv_bfloat16*>(a),
                                                    static_cast<const __nv_bfloat16*>(b), ref, m, n,
                                                    k, transpose_a, transpose_b, lda, ldb);
  else
    ReferenceGemmKernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(a),
                                                    static_cast<const __half*>(b), ref, m, n, k,
                                                    transpose_a, transpose_b, lda, ldb);
  return cudaGetLastError();
}

cudaError_t ReferenceGemm(const __half* a, const __half* b, float* ref, int m, int n, int k,
                          cudaStream_t stream) {
  return ReferenceGemmEx(a, b, ref, m, n, k, false, false, 0, 0, false, stream);
}

}  // namespace hgemm::kernels::testing
