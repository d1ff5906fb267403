#include "server/backend/cuda_verify.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "server/verify/random_vector.h"

namespace hgemm {
namespace {

constexpr int kThreads = 256;
// Columns of a transposed matrix each thread sums before adding its partial sum to the row's:
// enough threads to fill the device when rows are few, few atomics per row.
constexpr int64_t kColumnChunk = 256;

__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(float x) { return x; }

__global__ void GaussianVector(uint64_t seed, int64_t n, float* r) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x) {
    r[j] = verify::GaussianAt(seed, j);
  }
}

// Adds the kPer elements packed in `raw` (16 bytes of T) times v[first..] to s, their squares
// to q. REQUIRES: v + first 16-byte aligned.
template <typename T>
__device__ __forceinline__ void Accumulate16(const uint4& raw, const float* v, float& s, float& q) {
  constexpr int kPer = 16 / sizeof(T);
  const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < kPer; e += 4) {
    const float4 w = *reinterpret_cast<const float4*>(v + e);
    const float f0 = ToFloat(x[e]), f1 = ToFloat(x[e + 1]), f2 = ToFloat(x[e + 2]),
                f3 = ToFloat(x[e + 3]);
    s += f0 * w.x + f1 * w.y + f2 * w.z + f3 * w.w;
    q += f0 * f0 + f1 * f1 + f2 * f2 + f3 * f3;
  }
}

// One warp per row of a row-major matrix: each lane sums a strided share, then the warp adds
// the lanes' sums. kVector: each lane reads 16 bytes at a time, four loads in flight (REQUIRES:
// m, v and every row start 16-byte aligned), since one element per lane leaves a warp's reads
// at 64 bytes and the pass far below the memory's speed.
template <typename T, bool kVector>
__global__ void RowMatVec(const T* m, int64_t rows, int64_t cols, const float* v, float* out,
                          float* sq) {
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* line = m + row * cols;
  float s = 0, q = 0;
  int64_t done = 0;
  if constexpr (kVector) {
    constexpr int64_t kPer = 16 / sizeof(T);  // elements per 16-byte load
    constexpr int kUnroll = 4;
    for (; done + 32 * kPer * kUnroll <= cols; done += 32 * kPer * kUnroll) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        raw[u] = *reinterpret_cast<const uint4*>(line + done + (u * 32 + lane) * kPer);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        Accumulate16<T>(raw[u], v + done + (u * 32 + lane) * kPer, s, q);
      }
    }
    for (; done + 32 * kPer <= cols; done += 32 * kPer) {
      const uint4 raw = *reinterpret_cast<const uint4*>(line + done + lane * kPer);
      Accumulate16<T>(raw, v + done + lane * kPer, s, q);
    }
  }
  for (int64_t l = done + lane; l < cols; l += 32) {
    const float f = ToFloat(line[l]);
    s += f * v[l];
    q += f * f;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    s += __shfl_down_sync(0xFFFFFFFFu, s, offset);
    q += __shfl_down_sync(0xFFFFFFFFu, q, offset);
  }
  if (lane == 0) {
    out[row] = s;
    sq[row] = q;
  }
}

// The transpose of a row-major cols×rows matrix: thread i sums column i over one chunk of
// kColumnChunk stored rows (adjacent threads read adjacent elements), then adds its partial
// sums to the row's. REQUIRES: out and sq zeroed.
template <typename T>
__global__ void ColumnMatVec(const T* m, int64_t rows, int64_t cols, const float* v, float* out,
                             float* sq) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows) return;
  const int64_t first = blockIdx.y * kColumnChunk;
  const int64_t last = first + kColumnChunk < cols ? first + kColumnChunk : cols;
  float s = 0, q = 0;
  for (int64_t l = first; l < last; ++l) {
    const float x = ToFloat(m[l * rows + i]);
    s += x * v[l];
    q += x * x;
  }
  atomicAdd(&out[i], s);
  atomicAdd(&sq[i], q);
}

template <typename T>
cudaError_t LaunchMatVec(const T* m, int64_t rows, int64_t cols, bool transposed, const float* v,
                         float* out, float* sq, cudaStream_t stream) {
  if (!transposed) {
    const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
    const uintptr_t addresses = reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v);
    const bool aligned = (cols * sizeof(T)) % 16 == 0 && addresses % 16 == 0;
    if (aligned) {
      RowMatVec<T, true><<<unsigned(blocks), kThreads, 0, stream>>>(m, rows, cols, v, out, sq);
    } else {
      RowMatVec<T, false><<<unsigned(blocks), kThreads, 0, stream>>>(m, rows, cols, v, out, sq);
    }
    return cudaGetLastError();
  }
  if (cudaError_t e = cudaMemsetAsync(out, 0, size_t(rows) * sizeof(float), stream);
      e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = cudaMemsetAsync(sq, 0, size_t(rows) * sizeof(float), stream);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(unsigned((rows + kThreads - 1) / kThreads),
                  unsigned((cols + kColumnChunk - 1) / kColumnChunk));
  ColumnMatVec<T><<<grid, kThreads, 0, stream>>>(m, rows, cols, v, out, sq);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGaussianVector(uint64_t seed, int64_t n, float* r, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  GaussianVector<<<unsigned(blocks), kThreads, 0, stream>>>(seed, n, r);
  return cudaGetLastError();
}

cudaError_t LaunchVerifyMatVec(const void* m, ElementType type, int64_t rows, int64_t cols,
                               bool transposed, const float* v, float* out, float* sq,
                               cudaStream_t stream) {
  switch (type) {
    case ElementType::kFp16:
      return LaunchMatVec(static_cast<const __half*>(m), rows, cols, transposed, v, out, sq,
                          stream);
    case ElementType::kBf16:
      return LaunchMatVec(static_cast<const __nv_bfloat16*>(m), rows, cols, transposed, v, out, sq,
                          stream);
    case ElementType::kFp32:
      return LaunchMatVec(static_cast<const float*>(m), rows, cols, transposed, v, out, sq, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace hgemm
