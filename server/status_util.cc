#include "server/status_util.h"

#include <fmt/format.h>

namespace hgemm::status {
namespace {

constexpr size_t kMaxMessageBytes = 1024;

grpc::Status Make(grpc::StatusCode code, std::string message) {
  if (message.size() > kMaxMessageBytes) message.resize(kMaxMessageBytes);
  return grpc::Status(code, message);
}

}  // namespace

grpc::Status InvalidArgument(const std::string& field, const std::string& problem) {
  return Make(grpc::StatusCode::INVALID_ARGUMENT, fmt::format("{}: {}", field, problem));
}

grpc::Status OverLimit(const std::string& what) {
  return Make(grpc::StatusCode::RESOURCE_EXHAUSTED, what);
}

grpc::Status QueueFull(const std::string& what) {
  return Make(grpc::StatusCode::UNAVAILABLE, what + "; retry with backoff");
}

grpc::Status ShuttingDown() {
  return Make(grpc::StatusCode::UNAVAILABLE, "server is shutting down");
}

grpc::Status DeadlineExpired(double waited_ms) {
  return Make(grpc::StatusCode::DEADLINE_EXCEEDED,
              fmt::format("deadline passed after {:.1f} ms in the queue; the GEMM was not run",
                          waited_ms));
}

grpc::Status Cancelled() {
  return Make(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

grpc::Status BackendFailure(const std::string& what) {
  return Make(grpc::StatusCode::INTERNAL, what);
}

}  // namespace hgemm::status
