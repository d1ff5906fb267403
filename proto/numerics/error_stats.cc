#include "proto/numerics/error_stats.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "proto/numerics/fp16.h"

namespace hgemm {

std::string ErrorStats::ToString() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "rel_frob=%.3e max_abs=%.3e nan=%zu first_bad=%zu", rel_frobenius,
                max_abs, nan_count, first_bad);
  return buf;
}

namespace {

// `value(i)`: element i of c as a double.
template <typename Value>
ErrorStats Compare(Value value, const float* reference, int64_t count) {
  ErrorStats s;
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double got = value(i);
    const double want = reference[i];
    ref2 += want * want;
    if (!std::isfinite(got)) {
      if (s.nan_count++ == 0) s.first_bad = i;
      continue;
    }
    const double d = got - want;
    diff2 += d * d;
    if (std::fabs(d) > s.max_abs) {
      s.max_abs = std::fabs(d);
      if (s.nan_count == 0) s.first_bad = i;
    }
  }
  s.rel_frobenius = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return s;
}

}  // namespace

ErrorStats CompareToReference(const uint16_t* c, const float* reference, int64_t count) {
  return Compare([c](int64_t i) { return double(HalfToFloat(c[i])); }, reference, count);
}

ErrorStats CompareBf16ToReference(const uint16_t* c, const float* reference, int64_t count) {
  return Compare(
      [c](int64_t i) {
        const uint32_t bits = uint32_t(c[i]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return double(f);
      },
      reference, count);
}

ErrorStats CompareToReference(const float* c, const float* reference, int64_t count) {
  return Compare([c](int64_t i) { return double(c[i]); }, reference, count);
}

double RelativeFrobeniusError(const uint16_t* c, const float* reference, int64_t count) {
  const ErrorStats s = CompareToReference(c, reference, count);
  return s.nan_count > 0 ? std::numeric_limits<double>::infinity() : s.rel_frobenius;
}

}  // namespace hgemm
