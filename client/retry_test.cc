#include "client/retry.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace hgemm {
namespace {

const grpc::Status kQueueFull(grpc::StatusCode::UNAVAILABLE, "queue is full; retry with backoff");
const grpc::Status kReset(grpc::StatusCode::UNAVAILABLE, "Connection reset by peer");

// Runs WithRetries over `answers` (one per try, the last repeated); returns how many tries
// were made, the backoffs asked for in *sleeps.
int Tries(const RetryPolicy& policy, std::chrono::milliseconds timeout, bool idempotent,
          const std::vector<grpc::Status>& answers, grpc::Status* last,
          std::vector<std::chrono::microseconds>* sleeps = nullptr) {
  int tries = 0;
  *last = WithRetries(
      policy, timeout, idempotent,
      [&](std::chrono::milliseconds remaining) {
        EXPECT_EQ(remaining.count() > 0, timeout.count() > 0);
        return answers[std::min<size_t>(tries++, answers.size() - 1)];
      },
      [&](std::chrono::microseconds d) {
        if (sleeps != nullptr) sleeps->push_back(d);
      });
  return tries;
}

TEST(Retry, APolicyChecksItsValues) {
  EXPECT_TRUE(RetryPolicy().Check().ok());
  for (int broken = 0; broken < 4; ++broken) {
    RetryPolicy policy;
    if (broken == 0) policy.attempts = 0;
    if (broken == 1) policy.initial_backoff = std::chrono::milliseconds(-1);
    if (broken == 2) policy.max_backoff = std::chrono::milliseconds(10);  // below initial 50
    if (broken == 3) policy.backoff_multiplier = std::nan("");
    const grpc::Status s = policy.Check();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << broken;
    EXPECT_NE(s.error_message().find("retry policy"), std::string::npos) << s.error_message();
  }
}

TEST(Retry, QueueFullIsRetriedUntilItSucceeds) {
  grpc::Status last;
  EXPECT_EQ(Tries({}, std::chrono::milliseconds(0), false, {kQueueFull, kQueueFull, {}}, &last), 3);
  EXPECT_TRUE(last.ok());
}

TEST(Retry, OtherUnavailableIsRetriedOnlyWhenIdempotent) {
  grpc::Status last;
  EXPECT_EQ(Tries({}, std::chrono::milliseconds(0), false, {kReset, {}}, &last), 1);
  EXPECT_EQ(last.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Tries({}, std::chrono::milliseconds(0), true, {kReset, {}}, &last), 2);
  EXPECT_TRUE(last.ok());
  EXPECT_TRUE(UnavailableNotRun(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses")));
  EXPECT_FALSE(UnavailableNotRun(kReset));
}

// An UNAVAILABLE whose message says nothing of a full queue, with a RetryInfo of `delay_ms`.
grpc::Status UnavailableWithRetryInfo(int delay_ms) {
  google::rpc::RetryInfo retry;
  retry.mutable_retry_delay()->set_nanos(delay_ms * 1000000);
  google::rpc::Status details;
  details.set_code(int(grpc::StatusCode::UNAVAILABLE));
  details.add_details()->PackFrom(retry);
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "busy", details.SerializeAsString());
}

TEST(Retry, RetryInfoSaysNotRunAndBoundsTheBackoffFromBelow) {
  const grpc::Status busy = UnavailableWithRetryInfo(900);
  EXPECT_TRUE(UnavailableNotRun(busy));
  RetryPolicy policy;
  policy.initial_backoff = std::chrono::milliseconds(10);
  grpc::Status last;
  std::vector<std::chrono::microseconds> sleeps;
  EXPECT_EQ(Tries(policy, std::chrono::milliseconds(0), false, {busy, {}}, &last, &sleeps), 2);
  ASSERT_EQ(sleeps.size(), 1u);
  EXPECT_EQ(sleeps[0], std::chrono::milliseconds(900));
}

TEST(Retry, OtherCodesAreNeverRetried) {
  grpc::Status last;
  const grpc::Status not_found(grpc::StatusCode::NOT_FOUND, "no such matrix");
  EXPECT_EQ(Tries({}, std::chrono::milliseconds(0), true, {not_found, {}}, &last), 1);
  EXPECT_EQ(last.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(Retry, AttemptsBoundTheTriesAndBackoffGrowsWithJitter) {
  RetryPolicy policy;
  policy.attempts = 4;
  grpc::Status last;
  std::vector<std::chrono::microseconds> sleeps;
  EXPECT_EQ(Tries(policy, std::chrono::milliseconds(0), true, {kQueueFull}, &last, &sleeps), 4);
  EXPECT_EQ(last.error_message(), kQueueFull.error_message());
  ASSERT_EQ(sleeps.size(), 3u);
  for (size_t i = 0; i < sleeps.size(); ++i) {  // 50, 100, 200 ms, each times [0.5, 1)
    const int64_t full_us = 50'000 << i;
    EXPECT_GE(sleeps[i].count(), full_us / 2) << i;
    EXPECT_LT(sleeps[i].count(), full_us) << i;
  }
  policy.attempts = 1;  // retries off
  EXPECT_EQ(Tries(policy, std::chrono::milliseconds(0), true, {kQueueFull}, &last), 1);
}

TEST(Retry, BackoffCapsAtItsMaximum) {
  RetryPolicy policy;
  std::mt19937_64 rng(1);
  EXPECT_LT(policy.Delay(30, rng), std::chrono::microseconds(2'000'001));
  EXPECT_GE(policy.Delay(30, rng), std::chrono::microseconds(1'000'000));
}

TEST(Retry, NoBackoffPastTheDeadline) {
  RetryPolicy policy;
  policy.initial_backoff = std::chrono::seconds(10);  // longer than the call's whole timeout
  grpc::Status last;
  EXPECT_EQ(Tries(policy, std::chrono::milliseconds(100), true, {kQueueFull, {}}, &last), 1);
  EXPECT_EQ(last.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace hgemm
