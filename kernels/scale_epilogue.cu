#include "kernels/scale_epilogue.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace hgemm::kernels {
namespace {

__device__ float ToFloat(__half x) { return __half2float(x); }
__device__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float ToFloat(float x) { return x; }

template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ float FromFloat<float>(float x) { return x; }

// Grid-stride: any count (up to the 2^40 elements of a matrix) with a bounded grid. t and c
// are not __restrict__: an fp32 C is scaled in place.
template <typename CType>
__global__ void ScaleEpilogueKernel(const float* t, const CType* __restrict__ c_in, CType* c,
                                    int64_t count, float alpha, float beta) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float value = alpha != 0 ? alpha * t[i] : 0.0f;
    if (beta != 0) value += beta * ToFloat(c_in[i]);
    c[i] = FromFloat<CType>(value);
  }
}

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;  // a few waves on 132 SMs; the loop covers the rest

template <typename CType>
cudaError_t Launch(const float* t, const void* c_in, void* c, int64_t count, float alpha,
                   float beta, cudaStream_t stream) {
  const int blocks = int(std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
  ScaleEpilogueKernel<CType><<<blocks, kThreads, 0, stream>>>(
      t, static_cast<const CType*>(c_in), static_cast<CType*>(c), count, alpha, beta);
  return cudaGetLastError();
}

}  // namespace

cudaError_t ScaleEpilogue(const float* t, const void* c_in, void* c, int64_t count, float alpha,
                          float beta, DataType c_type, cudaStream_t stream) {
  if (count < 1) return cudaErrorInvalidValue;
  switch (c_type) {
    case DataType::kFp16:
      return Launch<__half>(t, c_in, c, count, alpha, beta, stream);
    case DataType::kBf16:
      return Launch<__nv_bfloat16>(t, c_in, c, count, alpha, beta, stream);
    case DataType::kFp32:
      return Launch<float>(t, c_in, c, count, alpha, beta, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace hgemm::kernels
