#include "client/retry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "client/error_details.h"

namespace hgemm {
namespace {

// A server from before error details said it ran nothing in these words only; gRPC says
// them for a connection never made.
constexpr std::string_view kNotRunMarkers[] = {"retry with backoff", "server is shutting down",
                                               "failed to connect"};

}  // namespace

grpc::Status RetryPolicy::Check() const {
  if (attempts >= 1 && initial_backoff.count() >= 0 && max_backoff >= initial_backoff &&
      backoff_multiplier >= 1) {
    return grpc::Status::OK;
  }
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      fmt::format("retry policy: attempts {} must be at least 1, 0 <= initial_backoff_ms {} "
                  "<= max_backoff_ms {}, and backoff_multiplier {} at least 1",
                  attempts, initial_backoff.count(), max_backoff.count(), backoff_multiplier));
}

std::chrono::microseconds RetryPolicy::Delay(int retry, std::mt19937_64& rng) const {
  const double us = std::min(double(std::chrono::microseconds(max_backoff).count()),
                             double(std::chrono::microseconds(initial_backoff).count()) *
                                 std::pow(backoff_multiplier, retry));
  return std::chrono::microseconds(
      int64_t(us * std::uniform_real_distribution<double>(0.5, 1.0)(rng)));
}

bool UnavailableNotRun(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  if (ErrorDetailsOf(status).retry_delay) return true;
  return std::any_of(std::begin(kNotRunMarkers), std::end(kNotRunMarkers), [&](std::string_view m) {
    return status.error_message().find(m) != std::string::npos;
  });
}

bool ShouldRetry(const grpc::Status& status, bool idempotent) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         (idempotent || UnavailableNotRun(status));
}

grpc::Status WithRetries(
    const RetryPolicy& policy, std::chrono::milliseconds timeout, bool idempotent,
    const std::function<grpc::Status(std::chrono::milliseconds remaining)>& attempt,
    const std::function<void(std::chrono::microseconds)>& sleep) {
  using Clock = std::chrono::steady_clock;
  const bool has_deadline = timeout.count() > 0;
  const Clock::time_point deadline = Clock::now() + timeout;
  thread_local std::mt19937_64 rng(std::random_device{}());
  for (int tried = 0;; ++tried) {
    std::chrono::milliseconds remaining{0};
    if (has_deadline) {
      remaining =
          std::max(std::chrono::milliseconds(1),
                   std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    }
    grpc::Status status = attempt(remaining);
    if (status.ok() || tried + 1 >= policy.attempts || !ShouldRetry(status, idempotent)) {
      return status;
    }
    std::chrono::microseconds delay = policy.Delay(tried, rng);
    if (const auto asked = ErrorDetailsOf(status).retry_delay) {
      delay = std::max<std::chrono::microseconds>(delay, *asked);
    }
    if (has_deadline && Clock::now() + delay >= deadline) return status;
    sleep(delay);
  }
}

}  // namespace hgemm
