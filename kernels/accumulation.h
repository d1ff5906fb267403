// Accumulation: the precision a GEMM accumulates in. The one definition every layer uses
// (kernels, backends, scheduler, transport); the wire has its own enum (hgemm.v1.Accumulation),
// mapped in the transport.
//
// Plain C++17 with no includes, so that nvcc and host code, with or without CUDA, take it.
#ifndef HGEMM_KERNELS_ACCUMULATION_H_
#define HGEMM_KERNELS_ACCUMULATION_H_

namespace hgemm {

enum class Accumulation { kFp16, kFp32 };

// Returns "fp16" or "fp32".
constexpr const char* AccumulationName(Accumulation acc) {
  return acc == Accumulation::kFp16 ? "fp16" : "fp32";
}

}  // namespace hgemm

#endif  // HGEMM_KERNELS_ACCUMULATION_H_
