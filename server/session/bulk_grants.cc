#include "server/session/bulk_grants.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <stdexcept>

#include "server/core/status.h"

namespace hgemm {

namespace {

// From the kernel's CSPRNG (getrandom blocks only before it is seeded, at early boot).
std::string NewCapability() {
  std::string bytes(bulk::kCapabilityBytes, '\0');
  size_t filled = 0;
  while (filled < bytes.size()) {
    const ssize_t n = getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(fmt::format("getrandom: errno {}", errno));
    filled += size_t(n);
  }
  return bytes;
}

}  // namespace

absl::Status BulkGrants::Grant(const std::string& owner, const std::string& handle,
                               BulkDirection direction, int64_t offset, int64_t length, int lanes,
                               Clock::time_point now, std::vector<BulkLane>* granted) {
  if (lanes < 1 || lanes > options_.max_lanes) {
    return status::InvalidArgument(
        "lanes", fmt::format("must be 1 to {} (limits.max_bulk_lanes)", options_.max_lanes));
  }
  if (length < 1) return status::InvalidArgument("length", "must be at least 1");
  if (offset < 0 || length > INT64_MAX - offset) {
    return status::InvalidArgument("offset", "offset + length must be below 2^63");
  }
  lanes = int(std::min<int64_t>(lanes, length));
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  int& held = lanes_by_owner_[owner];
  if (held >= options_.max_lanes) {
    return status::OverLimit(
        "max_bulk_lanes",
        fmt::format("{} bulk lanes granted and not yet connected, {} more asked for; the limit "
                    "is {}",
                    held, lanes, options_.max_lanes));
  }
  // Fewer lanes than asked for rather than none: the range is the same, in fewer pieces.
  lanes = std::min(lanes, options_.max_lanes - held);
  granted->clear();
  for (int i = 0; i < lanes; ++i) {
    // Equal shares, the remainder spread over the first lanes.
    const int64_t begin = offset + length / lanes * i + std::min<int64_t>(i, length % lanes);
    const int64_t size = length / lanes + (i < length % lanes ? 1 : 0);
    BulkLane lane{NewCapability(), begin, size};
    entries_[lane.capability] = {{owner, handle, direction, begin, size}, now + options_.lifetime};
    granted->push_back(std::move(lane));
  }
  held += lanes;
  return absl::OkStatus();
}

absl::Status BulkGrants::Claim(std::string_view capability, Clock::time_point now,
                               BulkTicket* ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  auto it = entries_.find(std::string(capability));
  if (it == entries_.end()) {
    return status::PermissionDenied(
        "bulk channel: the capability is unknown, used or expired; ask OpenBulk for another");
  }
  *ticket = it->second.ticket;
  ForgetLocked(it);
  return absl::OkStatus();
}

void BulkGrants::ExpireLocked(Clock::time_point now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.expiry <= now) ForgetLocked(it);
    it = next;
  }
}

void BulkGrants::ForgetLocked(std::map<std::string, Entry>::iterator it) {
  auto owner = lanes_by_owner_.find(it->second.ticket.owner);
  if (--owner->second == 0) lanes_by_owner_.erase(owner);
  entries_.erase(it);
}

}  // namespace hgemm
