// RetriedCall: one call of a GemmClient tried again as a RetryPolicy says (WithRetries,
// client/retry.h), each try given the deadline left to the call. The one way the client's
// blocking calls are retried (the C ABI's calls all go through it).
// Thread safety: as the attempt's; RetriedCall keeps no state.
#ifndef HGEMM_CLIENT_RETRIED_CALL_H_
#define HGEMM_CLIENT_RETRIED_CALL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "client/gemm_client.h"
#include "client/retry.h"

namespace hgemm {

// Runs attempt(try_options) until it succeeds or WithRetries stops (see ShouldRetry for
// `idempotent`); try_options is `options` with the deadline left as its timeout. Returns the
// last try's status.
template <typename Attempt>  // grpc::Status(const CallOptions& try_options)
grpc::Status RetriedCall(const RetryPolicy& policy, const CallOptions& options, bool idempotent,
                         Attempt&& attempt) {
  return WithRetries(policy, options.timeout, idempotent, [&](std::chrono::milliseconds remaining) {
    CallOptions try_options = options;
    try_options.timeout = remaining;
    return attempt(try_options);
  });
}

}  // namespace hgemm

#endif  // HGEMM_CLIENT_RETRIED_CALL_H_
