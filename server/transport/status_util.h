// The one place a core status (absl::Status, server/core/status.h) becomes a gRPC status:
// every Finish, every GemmDone of a stream and the authenticator's refusals go through here.
// The codes are the same numbers in both; the message is kept (already cut at 1024 characters);
// the status's Details become google.rpc.Status details (docs/errors.md): an ErrorInfo
// (domain "hgemm", the reason, else the code's name) always, a BadRequest with the field, a
// QuotaFailure with the limit and a RetryInfo with the delay when the status names them.
// Thread safety: pure functions.
#ifndef HGEMM_SERVER_TRANSPORT_STATUS_UTIL_H_
#define HGEMM_SERVER_TRANSPORT_STATUS_UTIL_H_

#include <absl/status/status.h>
#include <grpcpp/support/status.h>

#include "google/rpc/status.pb.h"

namespace hgemm {

// ErrorInfo.domain of every error the server sends.
inline constexpr char kErrorDomain[] = "hgemm";

// The google.rpc.Status of a failed `s` (code, message and details). REQUIRES: !s.ok().
google::rpc::Status ToRpcStatus(const absl::Status& s);

// `s` as gRPC sends it: its google.rpc.Status serialized as the error details, which gRPC
// sends in the "grpc-status-details-bin" trailer.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_STATUS_UTIL_H_
