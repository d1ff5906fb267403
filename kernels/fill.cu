#include "kernels/fill.h"

#include <cuda_fp16.h>

namespace hgemm::kernels {
namespace {

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void FillUniformKernel(__half* data, size_t count, uint64_t seed, float lo, float span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = SplitMix64(seed * 0x100000001B3ull + i);
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // 24 random bits in [0, 1)
    data[i] = __float2half(lo + span * u);
  }
}

__global__ void FillBitsKernel(__half* data, size_t count, uint16_t bits) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x)
    data[i] = __ushort_as_half(bits);
}

unsigned GridFor(size_t count) {
  const size_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks ? blocks : 1) : 4096);
}

}  // namespace

cudaError_t FillUniform(__half* data, size_t count, uint64_t seed, float lo, float hi,
                        cudaStream_t stream) {
  FillUniformKernel<<<GridFor(count), 256, 0, stream>>>(data, count, seed, lo, hi - lo);
  return cudaGetLastError();
}

cudaError_t FillBits(__half* data, size_t count, uint16_t bits, cudaStream_t stream) {
  FillBitsKernel<<<GridFor(count), 256, 0, stream>>>(data, count, bits);
  return cudaGetLastError();
}

}  // namespace hgemm::kernels
