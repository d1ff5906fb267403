// Every gRPC status the server returns is made here, so that each code keeps one meaning:
//   INVALID_ARGUMENT    the request is malformed (the message names the field)
//   RESOURCE_EXHAUSTED  the request is larger than a configured limit; retrying will not help
//   UNAVAILABLE         the server is busy (queue full) or shutting down; retry with backoff
//   DEADLINE_EXCEEDED   the call's deadline passed while it waited; it was not run (or, for
//                       a streamed GEMM or upload, its chunks stopped coming: Idle)
//   CANCELLED           the client went away
//   INTERNAL            the backend failed (GPU fault, ...)
// Messages are cut at 1024 characters, as TF Serving does.
#ifndef HGEMM_SERVER_STATUS_UTIL_H_
#define HGEMM_SERVER_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include <string>
#include <string_view>

namespace hgemm::status {

grpc::Status InvalidArgument(const std::string& field, const std::string& problem);
grpc::Status OverLimit(const std::string& what);
grpc::Status QueueFull(const std::string& what);
grpc::Status ShuttingDown();
grpc::Status DeadlineExpired(double waited_ms);
grpc::Status Cancelled();
// A streamed GEMM or upload whose chunks stopped coming (DEADLINE_EXCEEDED).
grpc::Status Idle(const std::string& what);
grpc::Status BackendFailure(const std::string& what);

// Inside a `catch (...)`: the status the exception in flight becomes (RESOURCE_EXHAUSTED for
// std::bad_alloc and std::length_error: a size the machine can't hold; INTERNAL otherwise),
// logged with `where`. Lets reactors and worker threads answer their call instead of dying.
grpc::Status FromCurrentException(const char* where);

// A client-supplied string (handle, kernel name, client id) for a message: in quotes, at most
// its first 64 bytes, bytes outside printable ASCII escaped (\xHH), and its length if it was
// cut. Keeps a 100 000-byte handle from turning NOT_FOUND into an oversized trailer.
std::string Quote(std::string_view client_string);

// The canonical name of a gRPC status code ("OK", "INVALID_ARGUMENT", ...), as in logs and in
// the `code` label of hgemm_requests_total; "UNKNOWN" for a value outside the enum.
const char* CodeName(grpc::StatusCode code);

}  // namespace hgemm::status

#endif  // HGEMM_SERVER_STATUS_UTIL_H_
