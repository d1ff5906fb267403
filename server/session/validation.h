// Validation of requests before any work: pure functions from protobuf messages to either a
// GemmJob's fields or an INVALID_ARGUMENT / RESOURCE_EXHAUSTED status naming the field.
#ifndef HGEMM_SERVER_SESSION_VALIDATION_H_
#define HGEMM_SERVER_SESSION_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include <absl/status/status.h>

#include "proto/hgemm.pb.h"
#include "server/backend/backend.h"
#include "server/core/job.h"

namespace hgemm {

// What requests are checked against.
struct RequestRules {
  // Capped at kMaxElementsPerMatrix (see MaxElementsPerMatrix).
  int64_t max_elements_per_matrix = int64_t{1} << 28;
  std::vector<KernelDescription> kernels;  // the backend's; "auto" is always accepted
};

inline constexpr size_t kMaxRequestIdBytes = 128;

// Whether "auto" can honour `accumulation`: some kernel of the rules has it. What ListKernels
// reports for "auto" and what requests for "auto" are checked against.
bool AutoSupports(const RequestRules& rules, Accumulation accumulation);

// The limit in force: rules.max_elements_per_matrix within [1, kMaxElementsPerMatrix].
int64_t MaxElementsPerMatrix(const RequestRules& rules);

// m, n, k ≥ 1 and A, B, C each within MaxElementsPerMatrix (RESOURCE_EXHAUSTED naming the
// matrix and the limit). On OK, `shape`'s sizes are safe to compute (see GemmShape).
absl::Status ValidateShape(uint32_t m, uint32_t n, uint32_t k, const RequestRules& rules,
                           GemmShape* shape);

// Request id, kernel name and accumulation. `field` prefixes field names ("options",
// "header.options"). Fills job->request_id first (a refusal of any later field is logged with
// it), then job->kernel and job->accumulation. The two below check options before the rest.
absl::Status ValidateOptions(const v1::GemmOptions& options, const RequestRules& rules,
                             const std::string& field, GemmJob* job);

// A whole unary request: shape, options, a handle set only if non-empty, and a/b of exactly
// 2·m·k and 2·k·n bytes unless given by handle. Fills
// everything of `job` but the buffers and callbacks.
absl::Status ValidateGemmRequest(const v1::GemmRequest& request, const RequestRules& rules,
                                 GemmJob* job);

// A stream header: shape and options (its operands arrive later in chunks, unless by handle).
absl::Status ValidateGemmHeader(const v1::GemmHeader& header, const RequestRules& rules,
                                GemmJob* job);

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_VALIDATION_H_
