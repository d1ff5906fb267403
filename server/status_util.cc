#include "server/status_util.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <new>
#include <stdexcept>

namespace hgemm::status {
namespace {

constexpr size_t kMaxMessageBytes = 1024;

grpc::Status Make(grpc::StatusCode code, std::string message) {
  if (message.size() > kMaxMessageBytes) message.resize(kMaxMessageBytes);
  return grpc::Status(code, message);
}

constexpr size_t kMaxQuotedBytes = 64;

}  // namespace

grpc::Status FromCurrentException(const char* where) {
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    spdlog::error("{}: out of memory ({})", where, e.what());
    return OverLimit(fmt::format("{}: out of host memory", where));
  } catch (const std::length_error& e) {
    spdlog::error("{}: {}", where, e.what());
    return OverLimit(fmt::format("{}: too large for this server ({})", where, e.what()));
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", where, e.what());
    return BackendFailure(fmt::format("{}: {}", where, e.what()));
  } catch (...) {
    spdlog::error("{}: unknown exception", where);
    return BackendFailure(fmt::format("{}: unknown failure", where));
  }
}

std::string Quote(std::string_view client_string) {
  std::string out = "'";
  for (unsigned char c : client_string.substr(0, kMaxQuotedBytes)) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += char(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  out += "'";
  if (client_string.size() > kMaxQuotedBytes) {
    out += fmt::format("... ({} bytes)", client_string.size());
  }
  return out;
}

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

grpc::Status Idle(const std::string& what) {
  return Make(grpc::StatusCode::DEADLINE_EXCEEDED, what);
}

grpc::Status BackendFailure(const std::string& what) {
  return Make(grpc::StatusCode::INTERNAL, what);
}

}  // namespace hgemm::status
