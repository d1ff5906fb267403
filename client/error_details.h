// ErrorDetails: what a failed call's google.rpc.Status says beyond its code and message
// (docs/errors.md, "Details"), so that a program acts on a field, a limit or a retry delay
// without reading the message. Read from a grpc::Status's error_details(): gRPC's
// "grpc-status-details-bin" trailer, or, for one GEMM of a stream, its GemmDone.status, which
// GemmClient (StatusOf) and the C ABI put there.
// Thread safety: pure functions.
#ifndef HGEMM_CLIENT_ERROR_DETAILS_H_
#define HGEMM_CLIENT_ERROR_DETAILS_H_

#include <grpcpp/support/status.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "proto/hgemm.pb.h"

namespace hgemm {

struct FieldViolation {
  std::string field;        // the field's path in the request, e.g. "header.options.kernel"
  std::string description;  // what is wrong with it
};

struct QuotaViolation {
  std::string subject;  // the limit, e.g. "max_queued_bytes" (a server flag's name)
  std::string description;
};

struct ErrorDetails {
  std::string reason;  // ErrorInfo.reason, e.g. "QUEUE_FULL"; empty without an ErrorInfo
  std::string domain;  // ErrorInfo.domain: "hgemm" for the server's errors
  std::vector<FieldViolation> field_violations;  // BadRequest
  std::vector<QuotaViolation> quota_violations;  // QuotaFailure
  // RetryInfo: the request ran nothing; send it again after at least this long.
  std::optional<std::chrono::milliseconds> retry_delay;
};

// The details of `status`; all empty for an OK status, for one without details (gRPC's own
// errors, a server from before them) and for details that do not parse. Detail types other
// than the four above are skipped.
ErrorDetails ErrorDetailsOf(const grpc::Status& status);

// The status a stream's GemmDone reports: its code and message, and its google.rpc.Status
// (GemmDone.status) as the error details, as a unary call's status would carry them.
grpc::Status StatusOf(const v1::GemmDone& done);

// The name of a gRPC status code's value ("DEADLINE_EXCEEDED"), as grpc::StatusCode spells
// it; "UNKNOWN" for a value it does not define (an int: such a value is no grpc::StatusCode).
// Static storage.
const char* StatusCodeName(int code);

}  // namespace hgemm

#endif  // HGEMM_CLIENT_ERROR_DETAILS_H_
