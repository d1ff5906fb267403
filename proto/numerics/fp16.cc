#include "proto/numerics/fp16.h"

#include <immintrin.h>

#include <cstring>

namespace hgemm {

float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

uint16_t FloatToHalf(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

void HalfToFloat(const uint16_t* in, float* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < count; ++i) out[i] = HalfToFloat(in[i]);
}

void FloatToHalf(const float* in, uint16_t* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < count; ++i) out[i] = FloatToHalf(in[i]);
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040u);  // NaN
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even
  return uint16_t(bits >> 16);
}

void Bf16ToFloat(const uint16_t* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(in[i]);
}

void FloatToBf16(const float* in, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = FloatToBf16(in[i]);
}

}  // namespace hgemm
