// Helpers shared by the libFuzzer targets: dimensions biased towards the boundaries where size
// arithmetic breaks, and exact (128-bit) products to check the server's arithmetic against.
#ifndef HGEMM_SERVER_FUZZ_FUZZ_UTIL_H_
#define HGEMM_SERVER_FUZZ_FUZZ_UTIL_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace hgemm::fuzz {

// What the service harnesses (session_harness.h, transport_harness.h) give their server. 128x128
// matrices at most: a GEMM at the limit costs ~4 MFLOP, so executions go to the protocol, not
// to OpenBLAS; the limits' edges are there all the same. Small C chunks: a GEMM's answer is
// several writes.
inline constexpr int64_t kMaxElementsPerMatrix = 1 << 14;
inline constexpr int64_t kStreamChunkBytes = 16 << 10;
inline constexpr int64_t kMaxPendingBytes = 64 << 20;  // per stream and per client
inline constexpr int64_t kQuotaBytesPerClient = 16 << 20;
inline constexpr int64_t kBackendBytes = 64 << 20;  // the CPU backend's largest job and budget
// Shared-memory regions one client may hold at once, and their bytes: the quota's edge is
// within an input's reach.
inline constexpr int kRegionsPerClient = 4;
inline constexpr int64_t kRegionBytesPerClient = 160 << 10;
inline constexpr int kCpuWorkers = 2;
inline constexpr int kUploadThreads = 2;
// A call not answered within this never will be: a hang.
inline constexpr auto kCallDeadline = std::chrono::seconds(5);

// 0, 1, small, powers of two, and the values whose products wrap 32 or 64 bits.
inline uint32_t Dim(FuzzedDataProvider& in) {
  static constexpr uint32_t kBoundary[] = {
      0u,          1u,          2u,          3u,          7u,          64u,      255u,
      256u,        1024u,       46341u,      65536u,      1u << 20,    1u << 31, 4294967295u,
      3037000499u, 3037000500u, 3037000501u, 2147483647u, 4294967294u, 65535u};
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return in.ConsumeIntegralInRange<uint32_t>(1, 16);
    case 1:
      return in.ConsumeIntegralInRange<uint32_t>(1, 300);
    case 2:
      return kBoundary[in.ConsumeIntegralInRange<size_t>(0, std::size(kBoundary) - 1)];
    default:
      return in.ConsumeIntegral<uint32_t>();
  }
}

// 2·rows·cols without overflow.
inline unsigned __int128 Bytes(uint32_t rows, uint32_t cols) {
  return (unsigned __int128)2 * rows * cols;
}

// What a 64-bit signed 2·rows·cols wraps to (the value a buggy check would compare with).
inline int64_t WrappedBytes(uint32_t rows, uint32_t cols) {
  return int64_t(uint64_t(2) * uint64_t(rows) * uint64_t(cols));
}

// A status message must not show a wrapped (negative) size: "-" and 4 or more digits. A
// client's own enum value echoed back ("unknown value -33818674", "enum value -1610612744":
// proto3 enums are any int32) is what it sent, not a wrap, so a number right after "value "
// does not count, nor does a float (digits then '.' or 'e': "beta: -249909.12" is the client's
// scale factor, printed with a decimal point or an exponent even when integral; sizes are
// integers), nor does anything inside a client's own string quoted by status::Quote ("matrix
// '...=-0383...' does not exist": Quote escapes every quote inside, so its quotes pair up).
inline bool ShowsNegativeNumber(const std::string& message) {
  static constexpr char kEchoedEnum[] = "value ";
  constexpr size_t kEchoedEnumLength = sizeof(kEchoedEnum) - 1;
  bool in_client_string = false;
  for (size_t i = 0; i + 4 < message.size(); ++i) {
    // Quote's opening quote follows no letter or digit; a prose apostrophe ("operand's") does.
    if (message[i] == '\'' &&
        (in_client_string || i == 0 || !std::isalnum(uint8_t(message[i - 1])))) {
      in_client_string = !in_client_string;
    }
    if (in_client_string) continue;
    auto digit = [&](size_t j) { return message[j] >= '0' && message[j] <= '9'; };
    const bool echoed_enum =
        i >= kEchoedEnumLength &&
        message.compare(i - kEchoedEnumLength, kEchoedEnumLength, kEchoedEnum) == 0;
    if (message[i] == '-' && digit(i + 1) && digit(i + 2) && digit(i + 3) && digit(i + 4) &&
        !echoed_enum &&
        (i == 0 || message[i - 1] == ' ' || message[i - 1] == '(' || message[i - 1] == '=')) {
      size_t end = i + 5;
      while (end < message.size() && digit(end)) ++end;
      const bool a_float = end < message.size() && (message[end] == '.' || message[end] == 'e');
      if (!a_float) return true;
    }
  }
  return false;
}

[[noreturn]] inline void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FUZZ INVARIANT BROKEN: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace hgemm::fuzz

#endif  // HGEMM_SERVER_FUZZ_FUZZ_UTIL_H_
