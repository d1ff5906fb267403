// The Freivalds check's matrix-vector kernels (cuda_verify.h) against float64 products on the
// host (skips without a GPU): every element type, stored and transposed, row lengths that take
// the 16-byte path, its tail and the element-wise path, and a matrix that starts off alignment.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/fp16.h"
#include "server/backend/cuda_verify.h"

namespace hgemm {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

double ElementAt(const std::vector<char>& bytes, ElementType type, int64_t i) {
  if (type == ElementType::kFp32) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return type == ElementType::kFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

struct Case {
  ElementType type;
  int64_t rows, cols;
  bool transposed;
  int64_t offset_elements;  // where the matrix starts in its allocation
};

void CheckMatVec(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "type " << int(c.type) << ", " << c.rows << "x" << c.cols
                                  << (c.transposed ? " transposed" : "") << ", offset "
                                  << c.offset_elements);
  const int64_t count = c.rows * c.cols, bytes_per = ElementBytes(c.type);
  std::vector<char> m((count + c.offset_elements) * bytes_per);
  if (c.type == ElementType::kFp32) {
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < count + c.offset_elements; ++i) {
      const float f = normal(rng);
      std::memcpy(m.data() + 4 * i, &f, 4);
    }
  } else {
    const auto h = RandomHalfMatrix(count + c.offset_elements, rng, c.type == ElementType::kBf16);
    std::memcpy(m.data(), h.data(), m.size());
  }
  std::vector<float> v(c.cols);
  std::normal_distribution<float> normal;
  for (float& x : v) x = normal(rng);

  void* d_m = nullptr;
  float *d_v = nullptr, *d_out = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_m, m.size()));
  ASSERT_CUDA(cudaMalloc(&d_v, v.size() * sizeof(float)));
  ASSERT_CUDA(cudaMalloc(&d_out, 2 * c.rows * sizeof(float)));
  ASSERT_CUDA(cudaMemcpy(d_m, m.data(), m.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(d_v, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(d_out, 0xFF, 2 * c.rows * sizeof(float)));  // NaN: poisoned
  const char* start = static_cast<const char*>(d_m) + c.offset_elements * bytes_per;
  ASSERT_CUDA(LaunchVerifyMatVec(start, c.type, c.rows, c.cols, c.transposed, d_v, d_out,
                                 d_out + c.rows, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<float> got(2 * c.rows);
  ASSERT_CUDA(cudaMemcpy(got.data(), d_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaFree(d_m));
  ASSERT_CUDA(cudaFree(d_v));
  ASSERT_CUDA(cudaFree(d_out));

  for (int64_t i = 0; i < c.rows; ++i) {
    double sum = 0, squares = 0, magnitude = 0;
    for (int64_t l = 0; l < c.cols; ++l) {
      const int64_t at = c.offset_elements + (c.transposed ? l * c.rows + i : i * c.cols + l);
      const double x = ElementAt(m, c.type, at);
      sum += x * v[l];
      squares += x * x;
      magnitude += std::fabs(x * v[l]);
    }
    // fp32 sums of cols terms: a few units of fp32's roundoff times √cols of the terms' size.
    ASSERT_NEAR(got[i], sum, 1e-5 * magnitude + 1e-6) << "row " << i;
    ASSERT_NEAR(got[c.rows + i], squares, 1e-5 * squares + 1e-6) << "row " << i;
  }
}

TEST(CudaVerifyMatVec, MatchesTheHostProductForEveryTypeLayoutAndLength) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no usable GPU";
  }
  std::mt19937_64 rng(31);
  for (ElementType type : {ElementType::kFp16, ElementType::kBf16, ElementType::kFp32}) {
    for (bool transposed : {false, true}) {
      // 4096 and 8200: the 16-byte path with four loads in flight (and its one-load tail at
      // 8200); 264: one-load steps only; 1, 7 and 1001: the element-wise path.
      for (int64_t cols : {1, 7, 264, 1001, 4096, 8200}) {
        CheckMatVec({type, 37, cols, transposed, 0}, rng);
      }
      CheckMatVec({type, 19, 4096, transposed, 1}, rng);  // misaligned: the element-wise path
    }
  }
}

}  // namespace
}  // namespace hgemm
