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

__device__ __forceinline__ float Load(const void* m, ElementType type, int64_t index) {
  switch (type) {
    case ElementType::kFp16:
      return __half2float(static_cast<const __half*>(m)[index]);
    case ElementType::kBf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(m)[index]);
    case ElementType::kFp32:
      return static_cast<const float*>(m)[index];
  }
  return 0;
}

__global__ void GaussianVector(uint64_t seed, int64_t n, float* r) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x) {
    r[j] = verify::GaussianAt(seed, j);
  }
}

// One warp per row of a row-major matrix: each lane sums a strided share, then the warp adds
// the lanes' sums.
__global__ void RowMatVec(const void* m, ElementType type, int64_t rows, int64_t cols,
                          const float* v, float* out, float* sq) {
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float s = 0, q = 0;
  for (int64_t l = lane; l < cols; l += 32) {
    const float x = Load(m, type, row * cols + l);
    s += x * v[l];
    q += x * x;
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
__global__ void ColumnMatVec(const void* m, ElementType type, int64_t rows, int64_t cols,
                             const float* v, float* out, float* sq) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows) return;
  const int64_t first = blockIdx.y * kColumnChunk;
  const int64_t last = first + kColumnChunk < cols ? first + kColumnChunk : cols;
  float s = 0, q = 0;
  for (int64_t l = first; l < last; ++l) {
    const float x = Load(m, type, l * rows + i);
    s += x * v[l];
    q += x * x;
  }
  atomicAdd(&out[i], s);
  atomicAdd(&sq[i], q);
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
  if (!transposed) {
    const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
    RowMatVec<<<unsigned(blocks), kThreads, 0, stream>>>(m, type, rows, cols, v, out, sq);
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
  ColumnMatVec<<<grid, kThreads, 0, stream>>>(m, type, rows, cols, v, out, sq);
  return cudaGetLastError();
}

}  // namespace hgemm
