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

// The wire's DataType, or false for a value outside the enum. UNSPECIFIED gives `unspecified`.
bool FromProto(v1::DataType type, ElementType unspecified, ElementType* out);

// The limit in force: rules.max_elements_per_matrix within [1, kMaxElementsPerMatrix].
int64_t MaxElementsPerMatrix(const RequestRules& rules);

// m, n, k ≥ 1 and A, B, C each within MaxElementsPerMatrix (RESOURCE_EXHAUSTED naming the
// matrix and the limit). On OK sets shape's m, n, k (its types are left as they are), and its
// sizes are safe to compute (see GemmShape).
absl::Status ValidateShape(uint32_t m, uint32_t n, uint32_t k, const RequestRules& rules,
                           GemmShape* shape);

// Request id, kernel name and accumulation. `field` prefixes field names ("options",
// "header.options"). Fills job->request_id first (a refusal of any later field is logged with
// it), then job->kernel and job->accumulation. The two below check options before the rest.
absl::Status ValidateOptions(const v1::GemmOptions& options, const RequestRules& rules,
                             const std::string& field, GemmJob* job);

// Layout and types (fields 11–14 of GemmRequest and GemmHeader; `prefix` is "" or "header."):
// dtype fp16 or bf16, c_dtype the same or fp32, the accumulation FP32 unless both are fp16,
// and the kernel (job->kernel, "auto" included) taking the layout and the types. Fills
// job->transpose_a/b and job->shape's ab_type and c_type. REQUIRES: ValidateOptions passed.
absl::Status ValidateForm(bool transpose_a, bool transpose_b, v1::DataType dtype,
                          v1::DataType c_dtype, const RequestRules& rules,
                          const std::string& prefix, GemmJob* job);

// Scales (fields 15–16; `prefix` is "" or "header."): alpha (1 when unset) and beta finite;
// beta ≠ 0 only with a C input (`has_c_in`); alpha ≠ 1 or beta ≠ 0 only with FP32
// accumulation and a kernel (job->kernel, "auto" included) that takes them for the types.
// Fills job->alpha, job->beta and job->shape.c_input (beta ≠ 0). REQUIRES: ValidateForm passed.
absl::Status ValidateScale(bool has_alpha, float alpha, float beta, bool has_c_in,
                           const RequestRules& rules, const std::string& prefix, GemmJob* job);

// Strided-batched (field 60; `prefix` is "" or "header."): batch 0 or 1 is one GEMM; more
// needs batch·(elements of each of A, B, C) within MaxElementsPerMatrix (RESOURCE_EXHAUSTED
// naming the batch's matrix and the limit) and no field that holds one matrix only
// (`single_matrix_field`, e.g. "a_handle" or "keep_c_resident"; "" when none is set:
// INVALID_ARGUMENT naming it). Fills job->shape.batch. REQUIRES: ValidateShape passed.
absl::Status ValidateBatch(uint32_t batch, const std::string& single_matrix_field,
                           const RequestRules& rules, const std::string& prefix, GemmJob* job);

// Grouped (field 70 of GemmRequest, non-empty): m, n, k 0 and batch ≤ 1 (INVALID_ARGUMENT
// naming them), at most rules.max_group_problems problems (RESOURCE_EXHAUSTED), each with
// m, n, k ≥ 1 (INVALID_ARGUMENT naming "group[i].m") and its matrices within the limit, and
// each of A, B, C summed over the group within MaxElementsPerMatrix (RESOURCE_EXHAUSTED, in
// checked arithmetic), the kernel (job->kernel, "auto" included) taking groups, and no operand
// or C by handle or region, nor a kept C. Fills job->shape.group. REQUIRES: ValidateOptions
// passed.
absl::Status ValidateGroup(const v1::GemmRequest& request, const RequestRules& rules,
                           GemmJob* job);

// A whole unary request: options, form, shape, a handle set only if non-empty, and a/b of
// exactly batch·m·k and batch·k·n elements of the dtype unless given by handle, the scales, the
// batch, and an inline C_in (read only with beta ≠ 0) of exactly batch·m·n elements of c_dtype;
// a grouped one (ValidateGroup) with a, b and C_in of exactly the group's summed sizes. Fills
// everything of `job` but the buffers and callbacks.
absl::Status ValidateGemmRequest(const v1::GemmRequest& request, const RequestRules& rules,
                                 GemmJob* job);

// A stream header: options, form, scales, shape and batch (its operands arrive later in
// chunks, unless by handle).
absl::Status ValidateGemmHeader(const v1::GemmHeader& header, const RequestRules& rules,
                                GemmJob* job);

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_VALIDATION_H_
