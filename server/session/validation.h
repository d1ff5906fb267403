// Validation of requests before any work: pure functions from a GemmSpec (gemm_spec.h) to
// either the GemmOrder the core runs or an INVALID_ARGUMENT / RESOURCE_EXHAUSTED status naming
// the field as the client sees it.
#ifndef HGEMM_SERVER_SESSION_VALIDATION_H_
#define HGEMM_SERVER_SESSION_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include <absl/status/status.h>

#include "server/backend/backend.h"
#include "server/core/job.h"
#include "server/session/gemm_spec.h"

namespace hgemm {

// What requests are checked against.
struct RequestRules {
  // Capped at kMaxElementsPerMatrix (see MaxElementsPerMatrix).
  int64_t max_elements_per_matrix = int64_t{1} << 28;
  std::vector<KernelDescription> kernels;  // the backend's; "auto" is always accepted
  // Problems one grouped GEMM (GemmRequest.group) may have; more → RESOURCE_EXHAUSTED.
  int64_t max_group_problems = 1024;
};

inline constexpr size_t kMaxRequestIdBytes = 128;

// Whether "auto" can honour `accumulation` with a layout and a type pair (bits of
// server/core/shape.h): some kernel of the rules has all three. What ListKernels reports for
// "auto" and what requests for "auto" are checked against.
// With `scaled`, the kernel must also take alpha/beta for the type pair.
bool AutoSupports(const RequestRules& rules, Accumulation accumulation,
                  unsigned layout_bit = kLayoutNNBit, unsigned types_bit = kTypesFp16Bit,
                  bool scaled = false);

// The layouts and the type pairs some kernel of the rules takes (what ListKernels reports for
// "auto").
unsigned AutoLayouts(const RequestRules& rules);
unsigned AutoTypes(const RequestRules& rules);
unsigned AutoScaledTypes(const RequestRules& rules);

// "NN", "NT", "TN", "TT" of the set bits of `layouts`, comma-separated; the same for type pairs
// ("fp16", "fp16->fp32", "bf16", "bf16->fp32").
std::string LayoutNames(unsigned layouts);
std::string TypesNames(unsigned types);

// The limit in force: rules.max_elements_per_matrix within [1, kMaxElementsPerMatrix].
int64_t MaxElementsPerMatrix(const RequestRules& rules);

// m, n, k ≥ 1 and A, B, C each within MaxElementsPerMatrix (RESOURCE_EXHAUSTED naming the
// matrix and the limit). On OK sets shape's m, n, k (its types are left as they are), and its
// sizes are safe to compute (see GemmShape).
absl::Status ValidateShape(uint32_t m, uint32_t n, uint32_t k, const RequestRules& rules,
                           GemmShape* shape);

// A GEMM as its client described it, checked in this order: options (request id, kernel,
// accumulation), form (dtype fp16 or bf16, c_dtype the same or fp32, accumulation FP32 unless
// both are fp16, a kernel taking the layout and the types), scales (alpha and beta finite,
// beta ≠ 0 only with a C_in, scales only with FP32 accumulation and a kernel taking them),
// then for a group its problems (each m, n, k ≥ 1 and within the limits, summed too, at most
// rules.max_group_problems, a kernel taking groups, inline operands only) and its operands'
// byte counts; else the shape (ValidateShape), handles and regions that name something, the
// batch (batch·(elements of each matrix) within the limit, no field that holds one matrix
// only) and the byte counts of inline operands (C_in's only with beta ≠ 0). Operands by handle
// or region are checked when they are resolved (GemmCore::Admit).
// Refusals name fields as spec.Field() does; m, n, k (ValidateShape) and group[i] bare.
// On OK fills everything of order->job but the buffers, callbacks, deadline and owner, and
// order->a, b, c_in (None without beta) and c (KeepResident for keep_c_resident);
// order->over_unix_socket is the caller's. On a refusal order->job.request_id is set once the
// request id passed its check, so that the refusal is logged with it.
absl::Status ValidateGemm(const GemmSpec& spec, const RequestRules& rules, GemmOrder* order);

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_VALIDATION_H_
