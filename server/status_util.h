// Every gRPC status the server returns is made here, so that each code keeps one meaning:
//   INVALID_ARGUMENT    the request is malformed (the message names the field)
//   RESOURCE_EXHAUSTED  the request is larger than a configured limit; retrying will not help
//   UNAVAILABLE         the server is busy (queue full) or shutting down; retry with backoff
//   DEADLINE_EXCEEDED   the call's deadline passed while it waited; it was not run
//   CANCELLED           the client went away
//   INTERNAL            the backend failed (GPU fault, ...)
// Messages are cut at 1024 characters, as TF Serving does.
#ifndef HGEMM_SERVER_STATUS_UTIL_H_
#define HGEMM_SERVER_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include <string>

namespace hgemm::status {

grpc::Status InvalidArgument(const std::string& field, const std::string& problem);
grpc::Status OverLimit(const std::string& what);
grpc::Status QueueFull(const std::string& what);
grpc::Status ShuttingDown();
grpc::Status DeadlineExpired(double waited_ms);
grpc::Status Cancelled();
grpc::Status BackendFailure(const std::string& what);

}  // namespace hgemm::status

#endif  // HGEMM_SERVER_STATUS_UTIL_H_
