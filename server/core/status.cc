#include "server/core/status.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <exception>
#include <new>
#include <stdexcept>

namespace hgemm::status {
namespace {

constexpr size_t kMaxMessageBytes = 1024;

// Where each part of Details is kept (payload type URLs of this server's own).
constexpr char kReasonPayload[] = "hgemm.status/reason";
constexpr char kFieldPayload[] = "hgemm.status/field";
constexpr char kFieldProblemPayload[] = "hgemm.status/field_problem";
constexpr char kLimitPayload[] = "hgemm.status/limit";
constexpr char kRetryDelayPayload[] = "hgemm.status/retry_delay_ms";

std::string Cut(std::string text) {
  if (text.size() > kMaxMessageBytes) text.resize(kMaxMessageBytes);
  return text;
}

// `reason`: Details::reason.
absl::Status Make(absl::StatusCode code, std::string message, const char* reason) {
  absl::Status s(code, Cut(std::move(message)));
  s.SetPayload(kReasonPayload, absl::Cord(reason));
  return s;
}

// A status about one field of the request: "<field>: <problem>".
absl::Status MakeForField(absl::StatusCode code, const std::string& field,
                          const std::string& problem, const char* reason) {
  absl::Status s = Make(code, field + ": " + problem, reason);
  s.SetPayload(kFieldPayload, absl::Cord(field));
  s.SetPayload(kFieldProblemPayload, absl::Cord(Cut(problem)));
  return s;
}

absl::Status WithRetryDelay(absl::Status s, std::chrono::milliseconds delay) {
  s.SetPayload(kRetryDelayPayload, absl::Cord(std::to_string(delay.count())));
  return s;
}

std::string PayloadOf(const absl::Status& s, const char* url) {
  const auto payload = s.GetPayload(url);
  return payload ? std::string(*payload) : std::string();
}

constexpr size_t kMaxQuotedBytes = 64;

}  // namespace

absl::Status FromCurrentException(const char* where) {
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    spdlog::error("{}: out of memory ({})", where, e.what());
    return OverLimit("host_memory", fmt::format("{}: out of host memory", where));
  } catch (const std::length_error& e) {
    spdlog::error("{}: {}", where, e.what());
    return OverLimit("host_memory",
                     fmt::format("{}: too large for this server ({})", where, e.what()));
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
  return MakeForField(absl::StatusCode::kInvalidArgument, field, problem, "INVALID_FIELD");
}

absl::Status NotFound(const std::string& what) {
  return Make(absl::StatusCode::kNotFound, what, "NOT_FOUND");
}

absl::Status OverLimit(const std::string& limit, const std::string& what) {
  absl::Status s = Make(absl::StatusCode::kResourceExhausted, what, "OVER_LIMIT");
  s.SetPayload(kLimitPayload, absl::Cord(limit));
  return s;
}

absl::Status QueueFull(const std::string& what) {
  return WithRetryDelay(
      Make(absl::StatusCode::kUnavailable, what + "; retry with backoff", "QUEUE_FULL"),
      kQueueFullRetryDelay);
}

absl::Status ShuttingDown() {
  return WithRetryDelay(Make(absl::StatusCode::kUnavailable,
                             "server is shutting down; retry elsewhere", "SHUTTING_DOWN"),
                        std::chrono::milliseconds(0));
}

absl::Status DeadlineExpired(double waited_ms) {
  return Make(
      absl::StatusCode::kDeadlineExceeded,
      fmt::format("deadline passed after {:.1f} ms in the queue; the GEMM was not run", waited_ms),
      "DEADLINE_PASSED");
}

absl::Status Cancelled() {
  return Make(absl::StatusCode::kCancelled, "cancelled by the client", "CANCELLED");
}

absl::Status Idle(const std::string& what) {
  return Make(absl::StatusCode::kDeadlineExceeded, what, "IDLE");
}

absl::Status BackendFailure(const std::string& what) {
  return Make(absl::StatusCode::kInternal, what, "BACKEND_FAILURE");
}

absl::Status DeviceFailed(const std::string& what) {
  return Make(absl::StatusCode::kUnavailable, what + "; retry on another server", "DEVICE_FAILED");
}

absl::Status VerifyFailed(const std::string& what) {
  return Make(absl::StatusCode::kDataLoss, what, "VERIFICATION_FAILED");
}

absl::Status Unauthenticated(const std::string& what) {
  return Make(absl::StatusCode::kUnauthenticated, what, "UNAUTHENTICATED");
}

absl::Status OutOfRange(const std::string& field, const std::string& problem) {
  return MakeForField(absl::StatusCode::kOutOfRange, field, problem, "OUT_OF_RANGE");
}

absl::Status FailedPrecondition(const std::string& what) {
  return Make(absl::StatusCode::kFailedPrecondition, what, "FAILED_PRECONDITION");
}

absl::Status PermissionDenied(const std::string& what) {
  return Make(absl::StatusCode::kPermissionDenied, what, "PERMISSION_DENIED");
}

absl::Status WithContext(const std::string& context, const absl::Status& s) {
  absl::Status out(s.code(), Cut(context + ": " + Message(s)));
  s.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

Details DetailsOf(const absl::Status& s) {
  Details details{.reason = PayloadOf(s, kReasonPayload),
                  .field = PayloadOf(s, kFieldPayload),
                  .field_problem = PayloadOf(s, kFieldProblemPayload),
                  .limit = PayloadOf(s, kLimitPayload)};
  const std::string delay = PayloadOf(s, kRetryDelayPayload);
  int64_t ms = 0;
  if (!delay.empty() &&
      std::from_chars(delay.data(), delay.data() + delay.size(), ms).ec == std::errc()) {
    details.retry_delay = std::chrono::milliseconds(ms);
  }
  return details;
}

}  // namespace hgemm::status
