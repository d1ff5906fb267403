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

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    default: return "UNKNOWN";
  }
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
