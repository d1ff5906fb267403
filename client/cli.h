// What hgemm_client checks and prints, apart from main(): parsing --release (--shape is parsed
// by client/gemm_dims.h), the size arithmetic of a GEMM (overflow-checked, in uint64), the
// check of a GEMM against the server's limits (GetServerInfo.limits) before anything is
// allocated, and the --list table.
// Thread safety: pure functions.
#ifndef HGEMM_CLIENT_CLI_H_
#define HGEMM_CLIENT_CLI_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/gemm_dims.h"
#include "proto/hgemm.pb.h"

namespace hgemm::cli {

// Checks that a .npy matrix's rows and cols fit a GEMM dimension (uint32, ≥ 1); `what` names
// it in the message ("A (m x k)"). Returns "" or what is wrong.
std::string CheckMatrixDims(const std::string& what, int64_t rows, int64_t cols);

// 2·rows·cols (fp16 bytes of a rows×cols matrix) and sums of such: nullopt on uint64 overflow.
std::optional<uint64_t> MatrixBytes(uint64_t rows, uint64_t cols);
std::optional<uint64_t> CheckedAdd(std::optional<uint64_t> a, std::optional<uint64_t> b);

// How the CLI will send one GEMM.
struct Plan {
  bool unary = false;       // one unary Gemm message (A and B inline, unless resident)
  bool resident_a = false;  // A is uploaded once (UploadMatrix) and sent by handle
  bool resident_b = false;  // B likewise
  bool keep_c = false;      // C stays on the server (keep_c_resident)
  // More than one run: with keep_c, the previous run's C is released only after the next one
  // is kept, so two Cs are held at once.
  bool repeated = false;
};

// The bytes of a unary GemmRequest beyond its operands (fields, tags, options): a generous
// bound, so that a request this much under max_message_bytes is accepted.
inline constexpr uint64_t kUnaryOverheadBytes = 4096;

// Checks `dims` sent as `plan` against the server's `limits`, before anything is allocated:
// elements of A, B and C (max_elements_per_matrix), operand + result bytes of one GEMM
// (max_queued_bytes), a unary request's size (max_message_bytes), resident bytes of this
// client (resident_quota_bytes). A limit of 0 is taken as "not reported" and skipped.
// Returns "" or a message naming the operand, its size and the limit, e.g.
// "C (m x n) is 40000x40000 = 1600000000 elements; the server takes at most 268435456
// (max_elements_per_matrix)". Sizes are computed in checked uint64: never a wrapped number.
std::string CheckLimits(const GemmDims& dims, const v1::Limits& limits, const Plan& plan);

// The bytes one GemmRequest moves over the wire. up: the operands it carries inline (A, B and
// C_in, every item of a batch; nothing of a resident or shared-memory operand). down: C inline,
// c_element_bytes per element of every item of a batch; 0 if C stays on the server
// (keep_c_resident) or is written into a shared-memory region (c_region).
struct WireBytes {
  uint64_t up = 0;
  uint64_t down = 0;
};
WireBytes RequestWireBytes(const v1::GemmRequest& request, uint64_t c_element_bytes);

// Parses "MxNxK,MxNxK,..." (--group): at least one problem, each as ParseGemmDims takes it.
// Returns "" or what is wrong, naming the problem by position ("problem 2: ..."); *group is
// untouched on failure.
std::string ParseGroup(const std::string& text, std::vector<GemmDims>* group);

// Checks a grouped GEMM (GemmRequest.group: A and B of 2 bytes per element, C of 4 with
// `c_fp32` else 2, C_in too with `c_input`) against the server's `limits`, before anything is
// allocated: a server that takes no groups (max_group_problems 0: from before them), the
// number of problems, each operand's elements summed over the group (max_elements_per_matrix),
// operand + result bytes (max_queued_bytes), and the one unary message it travels in
// (max_message_bytes). Returns "" or a message naming the limit. Checked uint64 arithmetic.
std::string CheckGroupLimits(const std::vector<GemmDims>& group, bool c_fp32, bool c_input,
                             const v1::Limits& limits);

// Parses "H1,H2,..." (--release): non-empty handles, no duplicates. Returns "" or what is wrong.
std::string ParseHandleList(const std::string& text, std::vector<std::string>* handles);

// The --list table: one line per resident matrix (handle, shape, bytes, device, age, idle,
// time left before expiry or "never", label), then the client's total and quota.
std::string FormatMatrixList(const v1::ListMatricesResponse& list);

}  // namespace hgemm::cli

#endif  // HGEMM_CLIENT_CLI_H_
