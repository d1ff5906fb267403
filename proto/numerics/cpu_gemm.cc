#include "proto/numerics/cpu_gemm.h"

#include <cblas.h>

#include "proto/numerics/fp16.h"

namespace hgemm {

std::vector<float> ReferenceGemm(const uint16_t* a, const uint16_t* b, int64_t m, int64_t n,
                                 int64_t k) {
  std::vector<float> a32(m * k), b32(k * n), c32(m * n);
  HalfToFloat(a, a32.data(), a32.size());
  HalfToFloat(b, b32.data(), b32.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a32.data(), k,
              b32.data(), n, 0.0f, c32.data(), n);
  return c32;
}

void CpuGemm(const uint16_t* a, const uint16_t* b, uint16_t* c, int64_t m, int64_t n, int64_t k) {
  std::vector<float> c32 = ReferenceGemm(a, b, m, n, k);
  FloatToHalf(c32.data(), c, c32.size());
}

std::vector<uint16_t> RandomHalfMatrix(int64_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  std::vector<uint16_t> half(count);
  FloatToHalf(values.data(), half.data(), count);
  return half;
}

std::string HalfBytes(const std::vector<uint16_t>& half) {
  return std::string(reinterpret_cast<const char*>(half.data()), 2 * half.size());
}

}  // namespace hgemm
