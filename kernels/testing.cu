#include "kernels/testing.h"

#include <cuda_fp16.h>

namespace hgemm::kernels::testing {
namespace {

constexpr int kTile = 32;

__global__ void ReferenceGemmKernel(const __half* __restrict__ a, const __half* __restrict__ b,
                                    float* __restrict__ ref, int m, int n, int k) {
  __shared__ float sa[kTile][kTile + 1];
  __shared__ float sb[kTile][kTile + 1];
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    const int ka = k0 + threadIdx.x;
    const int kb = k0 + threadIdx.y;
    sa[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? __half2float(a[size_t(row) * k + ka]) : 0.f;
    sb[threadIdx.y][threadIdx.x] = (kb < k && col < n) ? __half2float(b[size_t(kb) * n + col]) : 0.f;
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTile; ++kk) acc = fmaf(sa[threadIdx.y][kk], sb[kk][threadIdx.x], acc);
    __syncthreads();
  }
  if (row < m && col < n) ref[size_t(row) * n + col] = acc;
}

}  // namespace

cudaError_t ReferenceGemm(const __half* a, const __half* b, float* ref, int m, int n, int k,
                          cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid((n + kTile - 1) / kTile, (m + kTile - 1) / kTile);
  ReferenceGemmKernel<<<grid, block, 0, stream>>>(a, b, ref, m, n, k);
  return cudaGetLastError();
}

}  // namespace hgemm::kernels::testing
