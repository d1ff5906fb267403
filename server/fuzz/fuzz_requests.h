// Pieces of requests that the service-level fuzz targets (service_fuzz, transport_fuzz) draw
// alike: operand bytes, handles and GemmOptions. Thread safety: stateless.
#ifndef HGEMM_SERVER_FUZZ_FUZZ_REQUESTS_H_
#define HGEMM_SERVER_FUZZ_FUZZ_REQUESTS_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "proto/hgemm.pb.h"
#include "server/fuzz/fuzz_util.h"

namespace hgemm::fuzz {

// Mostly the exact 2·rows·cols bytes (when small), else a short wrong length.
inline std::string OperandBytes(FuzzedDataProvider& in, uint32_t rows, uint32_t cols) {
  const unsigned __int128 exact = Bytes(rows, cols);
  if (in.ConsumeIntegralInRange<int>(0, 3) != 0 && exact <= (1u << 16)) {
    return std::string(size_t(exact), '\0');
  }
  return std::string(in.ConsumeIntegralInRange<size_t>(0, 64), '\0');
}

// "", fuzz bytes, an over-long name, or mostly a handle an earlier call of the input got.
inline std::string Handle(FuzzedDataProvider& in, const std::vector<std::string>& handles) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return "";
    case 1: return in.ConsumeRandomLengthString(64);
    case 2: return std::string(in.ConsumeIntegralInRange<size_t>(1, 100000), 'h');
    default:
      return handles.empty() ? "" : handles[in.ConsumeIntegralInRange<size_t>(0, handles.size() - 1)];
  }
}

// A kernel name (known, "auto", unknown) and an accumulation (one past the enum too).
inline void Options(FuzzedDataProvider& in, v1::GemmOptions* o) {
  static const char* kKernels[] = {"", "auto", "openblas_sgemm", "nope"};
  o->set_kernel(kKernels[in.ConsumeIntegralInRange<int>(0, 3)]);
  o->set_accumulation(v1::Accumulation(in.ConsumeIntegralInRange<int>(0, 3)));
}

}  // namespace hgemm::fuzz

#endif  // HGEMM_SERVER_FUZZ_FUZZ_REQUESTS_H_
