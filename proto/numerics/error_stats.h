// How far a computed fp16 C is from an fp32 reference (the one error metric of every check:
// kernel tests, kernel_bench, hgemm_client --check, hgemm_load's guard, the soak, server tests),
// and the one table of how far a correct C may be.
//
// C is raw binary16 bits (or bf16 bits, or fp32), the reference fp32, both row-major with
// `count` elements.
// Thread safety: pure functions and constants.
#ifndef HGEMM_PROTO_NUMERICS_ERROR_STATS_H_
#define HGEMM_PROTO_NUMERICS_ERROR_STATS_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace hgemm {

struct ErrorStats {
  double rel_frobenius = 0;  // ‖c − reference‖_F / ‖reference‖_F over the finite elements
  double max_abs = 0;        // max |c − reference| over the finite elements
  size_t nan_count = 0;      // NaN or Inf elements of c (unwritten outputs poisoned with NaN)
  size_t first_bad = SIZE_MAX;  // index of the first NaN/Inf, else of the largest error

  // "rel_frob=... max_abs=... nan=... first_bad=..." for messages.
  std::string ToString() const;
};

// Compares c with reference. An all-zero reference gives the absolute Frobenius norm.
ErrorStats CompareToReference(const uint16_t* c, const float* reference, int64_t count);

// The same for a C of bf16 bits (the upper 16 bits of an fp32), and for an fp32 C.
ErrorStats CompareBf16ToReference(const uint16_t* c, const float* reference, int64_t count);
ErrorStats CompareToReference(const float* c, const float* reference, int64_t count);

// ‖c − reference‖_F / ‖reference‖_F, or +Inf if c holds a NaN or Inf anywhere.
// REQUIRES: `reference` is not all zeros.
double RelativeFrobeniusError(const uint16_t* c, const float* reference, int64_t count);

// The largest relative Frobenius error a correct C has on inputs uniform in [-1, 1), per
// accumulation.
struct Tolerance {
  double fp16_acc;
  double fp32_acc;

  constexpr double For(bool fp16_accumulation) const {
    return fp16_accumulation ? fp16_acc : fp32_acc;
  }
};

// One kernel variant against the fp32 reference (gemm_correctness_test, kernel_bench), at any
// K the variant takes (docs/kernels.md, "What fp16 accumulation means").
inline constexpr Tolerance kKernelTolerance{.fp16_acc = 5e-3, .fp32_acc = 5e-4};

// A bf16 C (bf16 inputs, fp32 accumulation) against the fp32 reference of the same bf16 inputs:
// bf16's rounding of C alone is ~1.6e-3 relative Frobenius (8 significant bits), so twice that,
// rounded up. An fp32 C (fp16 or bf16 inputs, fp32 accumulation) takes kKernelTolerance.fp32_acc.
inline constexpr double kKernelToleranceBf16 = 4e-3;

// A C returned by a server, whatever backend and kernel ran it (hgemm_client --check,
// hgemm_load's guard, the soak, the client and server tests).
inline constexpr Tolerance kServiceTolerance{.fp16_acc = 2e-2, .fp32_acc = 1e-3};

}  // namespace hgemm

#endif  // HGEMM_PROTO_NUMERICS_ERROR_STATS_H_
