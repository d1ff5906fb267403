#include "server/core/status.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace hgemm::status {
namespace {

TEST(Status, NamedConstructorsKeepOneCodeEach) {
  EXPECT_EQ(InvalidArgument("m", "must be at least 1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InvalidArgument("m", "must be at least 1").message(), "m: must be at least 1");
  EXPECT_EQ(OverLimit("max_queued_bytes", "too big").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(QueueFull("queue full").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(QueueFull("queue full").message(), "queue full; retry with backoff");
  EXPECT_EQ(ShuttingDown().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Idle("no chunk").code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(DeadlineExpired(1.5).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Cancelled().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(NotFound("gone").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(BackendFailure("fault").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(DeviceFailed("device 0: illegal address").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(DeviceFailed("device 0: illegal address").message(),
            "device 0: illegal address; retry on another server");
  EXPECT_EQ(VerifyFailed("C failed its check twice").code(), absl::StatusCode::kDataLoss);
}

TEST(Status, MessagesAreCutAt1024Bytes) {
  EXPECT_EQ(BackendFailure(std::string(5000, 'x')).message().size(), 1024u);
  EXPECT_EQ(WithContext(std::string(5000, 'y'), OverLimit("l", "z")).message().size(), 1024u);
}

TEST(Status, WithContextKeepsTheCode) {
  absl::Status s = WithContext("keep_c_resident", OverLimit("resident_quota_bytes", "quota"));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "keep_c_resident: quota");
}

TEST(StatusDetails, NameTheFieldTheLimitAndTheRetryDelay) {
  const Details bad = DetailsOf(InvalidArgument("header.m", "must be at least 1"));
  EXPECT_EQ(bad.reason, "INVALID_FIELD");
  EXPECT_EQ(bad.field, "header.m");
  EXPECT_EQ(bad.field_problem, "must be at least 1");
  EXPECT_FALSE(bad.retry_delay);
  const Details past = DetailsOf(OutOfRange("a_region", "past the end"));
  EXPECT_EQ(past.reason, "OUT_OF_RANGE");
  EXPECT_EQ(past.field, "a_region");
  const Details over = DetailsOf(OverLimit("max_queued_bytes", "too big"));
  EXPECT_EQ(over.reason, "OVER_LIMIT");
  EXPECT_EQ(over.limit, "max_queued_bytes");
  const Details full = DetailsOf(QueueFull("queue full"));
  EXPECT_EQ(full.reason, "QUEUE_FULL");
  ASSERT_TRUE(full.retry_delay);
  EXPECT_EQ(*full.retry_delay, kQueueFullRetryDelay);
  const Details stopping = DetailsOf(ShuttingDown());
  EXPECT_EQ(stopping.reason, "SHUTTING_DOWN");
  ASSERT_TRUE(stopping.retry_delay);
  EXPECT_EQ(stopping.retry_delay->count(), 0);
  const Details failed = DetailsOf(DeviceFailed("device 0"));
  EXPECT_EQ(failed.reason, "DEVICE_FAILED");
  EXPECT_FALSE(failed.retry_delay) << "a failed device is not retried on the same server";
  EXPECT_EQ(DetailsOf(absl::InternalError("made elsewhere")).reason, "");
}

TEST(StatusDetails, EveryConstructorGivesItsOwnReason) {
  std::set<std::string> reasons;
  for (const absl::Status& s :
       {InvalidArgument("f", "p"), NotFound("x"), OverLimit("l", "x"), QueueFull("x"),
        ShuttingDown(), DeadlineExpired(1), Cancelled(), Idle("x"), BackendFailure("x"),
        DeviceFailed("x"), VerifyFailed("x"), Unauthenticated("x"), OutOfRange("f", "p"),
        FailedPrecondition("x"), PermissionDenied("x")}) {
    const std::string reason = DetailsOf(s).reason;
    EXPECT_FALSE(reason.empty()) << s;
    reasons.insert(reason);
  }
  EXPECT_EQ(reasons.size(), 15u);
}

TEST(StatusDetails, SurviveWithContext) {
  const Details field = DetailsOf(WithContext("gemm_id 3", InvalidArgument("header.k", "0")));
  EXPECT_EQ(field.field, "header.k");
  EXPECT_EQ(field.field_problem, "0");
  EXPECT_EQ(DetailsOf(WithContext("keep_c_resident", OverLimit("resident_quota_bytes", "q"))).limit,
            "resident_quota_bytes");
  const Details full = DetailsOf(WithContext("gemm_id 1", QueueFull("queue full")));
  EXPECT_EQ(full.reason, "QUEUE_FULL");
  EXPECT_TRUE(full.retry_delay);
}

TEST(Status, FromCurrentExceptionMapsBadAllocToResourceExhausted) {
  absl::Status s;
  try {
    throw std::bad_alloc();
  } catch (...) {
    s = FromCurrentException("test");
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(DetailsOf(s).limit, "host_memory");
  try {
    throw std::runtime_error("boom");
  } catch (...) {
    s = FromCurrentException("test");
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "test: boom");
}

// Moved from server/metrics_test.cc (the names label hgemm_requests_total).
TEST(StatusCodeName, NamesEveryCode) {
  EXPECT_EQ(CodeName(absl::StatusCode::kOk), "OK");
  EXPECT_EQ(CodeName(absl::StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_EQ(CodeName(absl::StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(CodeName(absl::StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  EXPECT_EQ(CodeName(absl::StatusCode(99)), "UNKNOWN");
  std::set<std::string> names;
  for (int c = 0; c <= 16; ++c) names.insert(CodeName(absl::StatusCode(c)));
  EXPECT_EQ(names.size(), 17u) << "each code has its own name";
}

TEST(Status, QuoteCutsAndEscapesClientStrings) {
  EXPECT_EQ(Quote("abc"), "'abc'");
  EXPECT_EQ(Quote("a'b"), "'a\\x27b'");
  EXPECT_NE(Quote(std::string(100, 'h')).find("(100 bytes)"), std::string::npos);
}

}  // namespace
}  // namespace hgemm::status
