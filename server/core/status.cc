#include "server/core/status.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <new>
#include <stdexcept>

namespace hgemm::status {
namespace {

constexpr size_t kMaxMessageBytes = 1024;

absl::Status Make(absl::StatusCode code, std::string message) {
  if (message.size() > kMaxMessageBytes) message.resize(kMaxMessageBytes);
  return absl::Status(code, message);
}

constexpr size_t kMaxQuotedBytes = 64;

}  // namespace

absl::Status FromCurrentException(const char* where) {
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

std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);  // "" outside the enum
  return name.empty() ? "UNKNOWN" : name;
}

absl::Status InvalidArgument(const std::string& field, const std::string& problem) {
  return Make(absl::StatusCode::kInvalidArgument, fmt::format("{}: {}", field, problem));
}

absl::Status NotFound(const std::string& what) { return Make(absl::StatusCode::kNotFound, what); }

absl::Status OverLimit(const std::string& what) {
  return Make(absl::StatusCode::kResourceExhausted, what);
}

absl::Status QueueFull(const std::string& what) {
  return Make(absl::StatusCode::kUnavailable, what + "; retry with backoff");
}

absl::Status ShuttingDown() {
  return Make(absl::StatusCode::kUnavailable, "server is shutting down; retry elsewhere");
}

absl::Status DeadlineExpired(double waited_ms) {
  return Make(absl::StatusCode::kDeadlineExceeded,
              fmt::format("deadline passed after {:.1f} ms in the queue; the GEMM was not run",
                          waited_ms));
}

absl::Status Cancelled() {
  return Make(absl::StatusCode::kCancelled, "cancelled by the client");
}

absl::Status Idle(const std::string& what) {
  return Make(absl::StatusCode::kDeadlineExceeded, what);
}

absl::Status BackendFailure(const std::string& what) {
  return Make(absl::StatusCode::kInternal, what);
}

absl::Status DeviceFailed(const std::string& what) {
  return Make(absl::StatusCode::kUnavailable, what + "; retry on another server");
}

absl::Status VerifyFailed(const std::string& what) {
  return Make(absl::StatusCode::kDataLoss, what);
}

absl::Status Unauthenticated(const std::string& what) {
  return Make(absl::StatusCode::kUnauthenticated, what);
}

absl::Status OutOfRange(const std::string& field, const std::string& problem) {
  return Make(absl::StatusCode::kOutOfRange, field + ": " + problem);
}

absl::Status FailedPrecondition(const std::string& what) {
  return Make(absl::StatusCode::kFailedPrecondition, what);
}

absl::Status PermissionDenied(const std::string& what) {
  return Make(absl::StatusCode::kPermissionDenied, what);
}

absl::Status WithContext(const std::string& context, const absl::Status& s) {
  return Make(s.code(), context + ": " + Message(s));
}

}  // namespace hgemm::status
