// The one place a core status (absl::Status, server/core/status.h) becomes a gRPC status:
// every Finish, every GemmDone of a stream and the authenticator's refusals go through here.
// The codes are the same numbers in both; the message is kept (already cut at 1024 characters).
// Thread safety: a pure function.
#ifndef HGEMM_SERVER_TRANSPORT_STATUS_UTIL_H_
#define HGEMM_SERVER_TRANSPORT_STATUS_UTIL_H_

#include <absl/status/status.h>
#include <grpcpp/support/status.h>

namespace hgemm {

grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_STATUS_UTIL_H_
