#include "server/session/bulk_grants.h"

#include <gtest/gtest.h>

#include <set>

#include "server/core/status.h"

namespace hgemm {
namespace {

using std::chrono::milliseconds;

TEST(BulkGrants, LanesCoverTheRangeInOrderWithDistinctCapabilities) {
  BulkGrants grants({});
  std::vector<BulkLane> lanes;
  const Clock::time_point now = Clock::now();
  ASSERT_TRUE(grants.Grant("alice", "m-1", BulkDirection::kPut, 100, 1003, 4, now, &lanes).ok());
  ASSERT_EQ(lanes.size(), 4u);
  int64_t next = 100;
  std::set<std::string> seen;
  for (const BulkLane& lane : lanes) {
    EXPECT_EQ(lane.offset, next);
    EXPECT_GE(lane.length, 250);
    EXPECT_LE(lane.length, 251);
    EXPECT_EQ(lane.capability.size(), bulk::kCapabilityBytes);
    seen.insert(lane.capability);
    next += lane.length;
  }
  EXPECT_EQ(next, 1103);
  EXPECT_EQ(seen.size(), 4u);
  BulkTicket ticket;
  ASSERT_TRUE(grants.Claim(lanes[2].capability, now, &ticket).ok());
  EXPECT_EQ(ticket.owner, "alice");
  EXPECT_EQ(ticket.handle, "m-1");
  EXPECT_EQ(ticket.direction, BulkDirection::kPut);
  EXPECT_EQ(ticket.offset, lanes[2].offset);
  EXPECT_EQ(ticket.length, lanes[2].length);
}

TEST(BulkGrants, FewerBytesThanLanesGiveOneLanePerByte) {
  BulkGrants grants({});
  std::vector<BulkLane> lanes;
  ASSERT_TRUE(grants.Grant("a", "m", BulkDirection::kGet, 0, 3, 8, Clock::now(), &lanes).ok());
  ASSERT_EQ(lanes.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lanes[i].length, 1);
}

TEST(BulkGrants, ACapabilityIsClaimedOnce) {
  BulkGrants grants({});
  std::vector<BulkLane> lanes;
  const Clock::time_point now = Clock::now();
  ASSERT_TRUE(grants.Grant("a", "m", BulkDirection::kGet, 0, 10, 1, now, &lanes).ok());
  BulkTicket ticket;
  ASSERT_TRUE(grants.Claim(lanes[0].capability, now, &ticket).ok());
  const absl::Status again = grants.Claim(lanes[0].capability, now, &ticket);
  EXPECT_EQ(again.code(), absl::StatusCode::kPermissionDenied) << again;
}

TEST(BulkGrants, UnknownAndExpiredCapabilitiesAreRefusedAlike) {
  BulkGrants grants({.lifetime = milliseconds(100)});
  std::vector<BulkLane> lanes;
  const Clock::time_point now = Clock::now();
  ASSERT_TRUE(grants.Grant("a", "m", BulkDirection::kPut, 0, 10, 1, now, &lanes).ok());
  BulkTicket ticket;
  std::string guess = lanes[0].capability;
  guess[0] ^= 1;
  const absl::Status unknown = grants.Claim(guess, now, &ticket);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kPermissionDenied);
  const absl::Status expired = grants.Claim(lanes[0].capability, now + milliseconds(100), &ticket);
  EXPECT_EQ(expired.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(unknown.message(), expired.message());
  const absl::Status empty = grants.Claim("", now, &ticket);
  EXPECT_EQ(empty.code(), absl::StatusCode::kPermissionDenied);
}

TEST(BulkGrants, AnOwnerHoldsAtMostMaxLanesUnclaimed) {
  BulkGrants grants({.max_lanes = 4});
  std::vector<BulkLane> lanes, more;
  const Clock::time_point now = Clock::now();
  ASSERT_TRUE(grants.Grant("a", "m", BulkDirection::kPut, 0, 100, 3, now, &lanes).ok());
  // Two asked for, one left: the whole range in one lane.
  std::vector<BulkLane> last;
  ASSERT_TRUE(grants.Grant("a", "m", BulkDirection::kPut, 0, 100, 2, now, &last).ok());
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].offset, 0);
  EXPECT_EQ(last[0].length, 100);
  const absl::Status over = grants.Grant("a", "m", BulkDirection::kPut, 0, 100, 2, now, &more);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ(status::DetailsOf(over).limit, "max_bulk_lanes");
  // Another owner has its own lanes; a claimed or expired lane is given back.
  EXPECT_TRUE(grants.Grant("b", "m", BulkDirection::kPut, 0, 100, 4, now, &more).ok());
  BulkTicket ticket;
  ASSERT_TRUE(grants.Claim(lanes[0].capability, now, &ticket).ok());
  ASSERT_TRUE(grants.Claim(lanes[1].capability, now, &ticket).ok());
  EXPECT_TRUE(grants.Grant("a", "m", BulkDirection::kPut, 0, 100, 2, now, &more).ok());
  EXPECT_EQ(more.size(), 2u);
  EXPECT_TRUE(
      grants.Grant("a", "m", BulkDirection::kPut, 0, 100, 4, now + grants.options().lifetime, &more)
          .ok());
}

TEST(BulkGrants, BadRequestsNameTheirField) {
  BulkGrants grants({.max_lanes = 8});
  std::vector<BulkLane> lanes;
  const Clock::time_point now = Clock::now();
  for (int bad_lanes : {0, -1, 9}) {
    const absl::Status s =
        grants.Grant("a", "m", BulkDirection::kPut, 0, 10, bad_lanes, now, &lanes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status::DetailsOf(s).field, "lanes");
  }
  const absl::Status empty = grants.Grant("a", "m", BulkDirection::kPut, 0, 0, 1, now, &lanes);
  EXPECT_EQ(status::DetailsOf(empty).field, "length");
  const absl::Status negative = grants.Grant("a", "m", BulkDirection::kPut, -1, 10, 1, now, &lanes);
  EXPECT_EQ(status::DetailsOf(negative).field, "offset");
  // Found by transport_fuzz: a range whose end overflows int64.
  const absl::Status wraps =
      grants.Grant("a", "m", BulkDirection::kPut, INT64_MAX - 5, 10, 2, now, &lanes);
  EXPECT_EQ(wraps.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status::DetailsOf(wraps).field, "offset");
}

}  // namespace
}  // namespace hgemm
