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
__device__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ float FromFloat<float>(float x) {
  return x;
}

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

// Threads run along a row (coalesced, one column each) and blocks along the rows, both
// grid-stride; each thread's loads of the s partials are independent, so they overlap. c_in
// and c are not __restrict__: C may be scaled in place (each element read, then written, by
// one thread).
template <typename CType>
__global__ void SplitKReduceKernel(const float* __restrict__ partials, int slices,
                                   int64_t slice_stride, int m, int n, const CType* c_in, CType* c,
                                   int ldc, float alpha, float beta) {
  for (int row = blockIdx.y; row < m; row += gridDim.y) {
    for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < n; col += gridDim.x * blockDim.x) {
      float sum = 0.0f;
      if (alpha != 0) {
        const float* p = partials + int64_t(row) * n + col;
        for (int i = 0; i < slices; ++i) sum += p[i * slice_stride];
      }
      const int64_t at = int64_t(row) * ldc + col;
      float value = alpha * sum;
      if (beta != 0) value += beta * ToFloat(c_in[at]);
      c[at] = FromFloat<CType>(value);
    }
  }
}

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;  // a few waves on 132 SMs; the loop covers the rest
constexpr int kMaxRowBlocks = 65535;  // gridDim.y's limit

template <typename CType>
cudaError_t Launch(const float* t, const void* c_in, void* c, int64_t count, float alpha,
                   float beta, cudaStream_t stream) {
  const int blocks = int(std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
  ScaleEpilogueKernel<CType><<<blocks, kThreads, 0, stream>>>(
      t, static_cast<const CType*>(c_in), static_cast<CType*>(c), count, alpha, beta);
  return cudaGetLastError();
}

template <typename CType>
cudaError_t LaunchReduce(const float* partials, int slices, int64_t slice_stride, int m, int n,
                         const void* c_in, void* c, int ldc, float alpha, float beta,
                         cudaStream_t stream) {
  const int column_blocks = int(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  const int row_blocks = int(std::min<int64_t>(std::min<int64_t>(m, kMaxRowBlocks),
                                               std::max<int64_t>(1, kMaxBlocks / column_blocks)));
  SplitKReduceKernel<CType><<<dim3(column_blocks, row_blocks), kThreads, 0, stream>>>(
      partials, slices, slice_stride, m, n, static_cast<const CType*>(c_in), static_cast<CType*>(c),
      ldc, alpha, beta);
  return cudaGetLastError();
}

}  // namespace

cudaError_t SplitKReduce(const float* partials, int slices, int64_t slice_stride, int m, int n,
                         const void* c_in, void* c, int ldc, float alpha, float beta,
                         DataType c_type, cudaStream_t stream) {
  if (slices < 1 || m < 1 || n < 1 || ldc < n || slice_stride < int64_t(m) * n ||
      (alpha != 0 && partials == nullptr) || (beta != 0 && c_in == nullptr) || c == nullptr)
    return cudaErrorInvalidValue;
  switch (c_type) {
    case DataType::kFp16:
      return LaunchReduce<__half>(partials, slices, slice_stride, m, n, c_in, c, ldc, alpha, beta,
                                  stream);
    case DataType::kBf16:
      return LaunchReduce<__nv_bfloat16>(partials, slices, slice_stride, m, n, c_in, c, ldc, alpha,
                                         beta, stream);
    case DataType::kFp32:
      return LaunchReduce<float>(partials, slices, slice_stride, m, n, c_in, c, ldc, alpha, beta,
                                 stream);
  }
  return cudaErrorInvalidValue;
}

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
