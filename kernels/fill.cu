#include "kernels/fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hgemm::kernels {
namespace {

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ void Store(__half* p, float x) { *p = __float2half(x); }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void Store(float* p, float x) { *p = x; }

// @tparam T  __half, __nv_bfloat16 or float.
template <typename T>
__global__ void FillUniformKernel(T* data, size_t count, uint64_t seed, float lo, float span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = SplitMix64(seed * 0x100000001B3ull + i);
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // 24 random bits in [0, 1)
    Store(data + i, lo + span * u);
  }
}

__global__ void FillBitsKernel(__half* data, size_t count, uint16_t bits) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x)
    data[i] = __ushort_as_half(bits);
}

__global__ void CopyPaddedKernel(uint16_t* __restrict__ dst, int dst_rows, int dst_cols,
                                 const uint16_t* __restrict__ src, int rows, int cols, int src_ld,
                                 bool src_transposed) {
  const size_t count = size_t(dst_rows) * dst_cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const int r = int(i / dst_cols), c = int(i % dst_cols);
    const size_t at = src_transposed ? size_t(c) * src_ld + r : size_t(r) * src_ld + c;
    dst[i] = (r < rows && c < cols) ? src[at] : uint16_t{0};  // +0 in fp16 and bf16
  }
}

unsigned GridFor(size_t count) {
  const size_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks < 16384 ? (blocks ? blocks : 1) : 16384);
}

}  // namespace

cudaError_t FillUniform(__half* data, size_t count, uint64_t seed, float lo, float hi,
                        cudaStream_t stream) {
  FillUniformKernel<<<GridFor(count), 256, 0, stream>>>(data, count, seed, lo, hi - lo);
  return cudaGetLastError();
}

cudaError_t FillUniform(__nv_bfloat16* data, size_t count, uint64_t seed, float lo, float hi,
                        cudaStream_t stream) {
  FillUniformKernel<<<GridFor(count), 256, 0, stream>>>(data, count, seed, lo, hi - lo);
  return cudaGetLastError();
}

cudaError_t FillUniform(float* data, size_t count, uint64_t seed, float lo, float hi,
                        cudaStream_t stream) {
  FillUniformKernel<<<GridFor(count), 256, 0, stream>>>(data, count, seed, lo, hi - lo);
  return cudaGetLastError();
}

cudaError_t CopyPadded(uint16_t* dst, int dst_rows, int dst_cols, const uint16_t* src, int rows,
                       int cols, int src_ld, bool src_transposed, cudaStream_t stream) {
  const size_t count = size_t(dst_rows) * dst_cols;
  CopyPaddedKernel<<<GridFor(count), 256, 0, stream>>>(dst, dst_rows, dst_cols, src, rows, cols,
                                                       src_ld, src_transposed);
  return cudaGetLastError();
}

cudaError_t FillBits(__half* data, size_t count, uint16_t bits, cudaStream_t stream) {
  FillBitsKernel<<<GridFor(count), 256, 0, stream>>>(data, count, bits);
  return cudaGetLastError();
}

}  // namespace hgemm::kernels
