// RetryPolicy and WithRetries: when the client core tries a call again, the one implementation
// (the Python client's native core uses it through the C ABI; its grpcio core's _retry.py has
// the same semantics).
//
// UNAVAILABLE is retried with exponential backoff and jitter: always when the request certainly
// did not run (the server said so with a RetryInfo, or, before error details, with the words of
// a full queue or a shutdown; or no connection was made), for any other UNAVAILABLE only when
// the call is idempotent (repeating cannot change anything). A backoff is at least the
// RetryInfo's delay. Never past the call's deadline: a backoff that would end after it is not
// taken.
// Thread safety: RetryPolicy is a value; WithRetries keeps no state between calls.
#ifndef HGEMM_CLIENT_RETRY_H_
#define HGEMM_CLIENT_RETRY_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <random>
#include <thread>

namespace hgemm {

struct RetryPolicy {
  int attempts = 5;  // tries in all, the first included; 1 turns retries off
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  double backoff_multiplier = 2.0;

  // The backoff before retry number `retry` (0 for the first): min(max_backoff, initial_backoff
  // · multiplier^retry), times a jitter drawn uniformly from [0.5, 1).
  std::chrono::microseconds Delay(int retry, std::mt19937_64& rng) const;

  // INVALID_ARGUMENT naming the values unless attempts >= 1, 0 <= initial_backoff <=
  // max_backoff and backoff_multiplier >= 1; OK otherwise.
  grpc::Status Check() const;
};

// An UNAVAILABLE that certainly did not run the request: safe to repeat whatever the call.
bool UnavailableNotRun(const grpc::Status& status);
bool ShouldRetry(const grpc::Status& status, bool idempotent);

// Runs attempt(remaining) until it succeeds or must stop: a failure ShouldRetry refuses, the
// policy's attempts used up, or a backoff that would pass the deadline (timeout from now; 0:
// none). remaining is the deadline left for that try (0: none; else at least 1 ms). Returns the
// last try's status. sleep waits out a backoff (tests pass their own).
grpc::Status WithRetries(
    const RetryPolicy& policy, std::chrono::milliseconds timeout, bool idempotent,
    const std::function<grpc::Status(std::chrono::milliseconds remaining)>& attempt,
    const std::function<void(std::chrono::microseconds)>& sleep = [](std::chrono::microseconds d) {
      std::this_thread::sleep_for(d);
    });

}  // namespace hgemm

#endif  // HGEMM_CLIENT_RETRY_H_
