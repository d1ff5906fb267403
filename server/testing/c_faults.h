// Corruptions of a computed C as a faulty device makes them: the tests' fault injector for
// Freivalds' check (server/verify), applied on the host through CpuBackendOptions::after_gemm.
// Test-only.
// A check of one repetition misses a fault confined to one element about 0.3 % of the time, however
// large: the element also raises its row's norm, and with it the tolerance (docs/verification.md,
// "Detection probability"). A test that needs the check to fail uses kRowZeroed, or several
// repetitions.
// Thread safety: pure functions on the caller's memory.
#ifndef HGEMM_SERVER_TESTING_C_FAULTS_H_
#define HGEMM_SERVER_TESTING_C_FAULTS_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "proto/numerics/fp16.h"
#include "server/core/shape.h"

namespace hgemm {

enum class CFault {
  kMantissaBit,  // the top bit of the mantissa of one element flipped
  kExponentBit,  // the top bit of its exponent flipped
  kSignBit,      // its sign flipped
  kSmallError,   // one element off by 1/64
  kLargeError,   // one element off by 1000
  kRowZeroed,    // a whole row of C zeroed
};
inline constexpr CFault kAllCFaults[] = {CFault::kMantissaBit, CFault::kExponentBit,
                                         CFault::kSignBit,     CFault::kSmallError,
                                         CFault::kLargeError,  CFault::kRowZeroed};

inline std::string CFaultName(CFault fault) {
  switch (fault) {
    case CFault::kMantissaBit:
      return "mantissa_bit";
    case CFault::kExponentBit:
      return "exponent_bit";
    case CFault::kSignBit:
      return "sign_bit";
    case CFault::kSmallError:
      return "small_error";
    case CFault::kLargeError:
      return "large_error";
    case CFault::kRowZeroed:
      return "row_zeroed";
  }
  return "?";
}

// Applies `fault` to element (row, col) of C (m×n of `type`, row-major), or to its whole row.
inline void CorruptC(CFault fault, ElementType type, int64_t n, void* c, int64_t row, int64_t col) {
  char* element = static_cast<char*>(c) + (row * n + col) * ElementBytes(type);
  const bool fp32 = type == ElementType::kFp32;
  const int bits = fp32 ? 32 : 16;
  const int mantissa_top = fp32 ? 22 : type == ElementType::kFp16 ? 9 : 6;
  auto flip = [&](int bit) {
    if (fp32) {
      uint32_t word;
      std::memcpy(&word, element, 4);
      word ^= 1u << bit;
      std::memcpy(element, &word, 4);
    } else {
      uint16_t word;
      std::memcpy(&word, element, 2);
      word ^= uint16_t(1u << bit);
      std::memcpy(element, &word, 2);
    }
  };
  auto add = [&](float delta) {
    if (fp32) {
      float value;
      std::memcpy(&value, element, 4);
      value += delta;
      std::memcpy(element, &value, 4);
      return;
    }
    uint16_t word;
    std::memcpy(&word, element, 2);
    const bool fp16 = type == ElementType::kFp16;
    const float value = (fp16 ? HalfToFloat(word) : Bf16ToFloat(word)) + delta;
    word = fp16 ? FloatToHalf(value) : FloatToBf16(value);
    std::memcpy(element, &word, 2);
  };
  switch (fault) {
    case CFault::kMantissaBit:
      flip(mantissa_top);
      return;
    case CFault::kExponentBit:
      flip(bits - 2);
      return;
    case CFault::kSignBit:
      flip(bits - 1);
      return;
    case CFault::kSmallError:
      add(1.0f / 64);
      return;
    case CFault::kLargeError:
      add(1000.0f);
      return;
    case CFault::kRowZeroed:
      std::memset(static_cast<char*>(c) + row * n * ElementBytes(type), 0,
                  size_t(n * ElementBytes(type)));
      return;
  }
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_C_FAULTS_H_
