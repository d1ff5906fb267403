#include "proto/numerics/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "proto/numerics/fp16.h"

namespace hgemm {

std::vector<float> CInToFloat(const void* c_in, int64_t count, const GemmForm& form) {
  std::vector<float> c32(count);
  if (form.c_fp32) {
    std::memcpy(c32.data(), c_in, count * sizeof(float));
  } else if (form.bf16) {
    Bf16ToFloat(static_cast<const uint16_t*>(c_in), c32.data(), count);
  } else {
    HalfToFloat(static_cast<const uint16_t*>(c_in), c32.data(), count);
  }
  return c32;
}

std::vector<float> ReferenceGemm(const uint16_t* a, const uint16_t* b, int64_t m, int64_t n,
                                 int64_t k, const GemmForm& form, const GemmScale& scale) {
  std::vector<float> a32(m * k), b32(k * n);
  // sgemm with beta 0 does not read C (zeros here anyway): C_in is read only when it counts.
  std::vector<float> c32 =
      scale.beta != 0 ? CInToFloat(scale.c_in, m * n, form) : std::vector<float>(m * n);
  if (form.bf16) {
    Bf16ToFloat(a, a32.data(), a32.size());
    Bf16ToFloat(b, b32.data(), b32.size());
  } else {
    HalfToFloat(a, a32.data(), a32.size());
    HalfToFloat(b, b32.data(), b32.size());
  }
  cblas_sgemm(CblasRowMajor, form.transpose_a ? CblasTrans : CblasNoTrans,
              form.transpose_b ? CblasTrans : CblasNoTrans, m, n, k, scale.alpha, a32.data(),
              form.transpose_a ? m : k, b32.data(), form.transpose_b ? k : n, scale.beta,
              c32.data(), n);
  return c32;
}

void CpuGemm(const uint16_t* a, const uint16_t* b, void* c, int64_t m, int64_t n, int64_t k,
             const GemmForm& form, const GemmScale& scale) {
  std::vector<float> c32 = ReferenceGemm(a, b, m, n, k, form, scale);
  if (form.c_fp32) {
    std::memcpy(c, c32.data(), c32.size() * sizeof(float));
  } else if (form.bf16) {
    FloatToBf16(c32.data(), static_cast<uint16_t*>(c), c32.size());
  } else {
    FloatToHalf(c32.data(), static_cast<uint16_t*>(c), c32.size());
  }
}

ErrorStats CompareToReference(const void* c, const float* reference, int64_t count,
                              const GemmForm& form) {
  if (form.c_fp32) return CompareToReference(static_cast<const float*>(c), reference, count);
  if (form.bf16) return CompareBf16ToReference(static_cast<const uint16_t*>(c), reference, count);
  return CompareToReference(static_cast<const uint16_t*>(c), reference, count);
}

double ServiceTolerance(bool fp16_accumulation, const GemmForm& form) {
  const double tolerance = kServiceTolerance.For(fp16_accumulation);
  return form.bf16 && !form.c_fp32 ? std::max(tolerance, kKernelToleranceBf16) : tolerance;
}

std::vector<uint16_t> RandomHalfMatrix(int64_t count, std::mt19937_64& rng, bool bf16) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  std::vector<uint16_t> half(count);
  if (bf16) {
    FloatToBf16(values.data(), half.data(), count);
  } else {
    FloatToHalf(values.data(), half.data(), count);
  }
  return half;
}

std::string HalfBytes(const std::vector<uint16_t>& half) {
  return std::string(reinterpret_cast<const char*>(half.data()), 2 * half.size());
}

}  // namespace hgemm
