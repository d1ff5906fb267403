// BulkGrants: the capabilities of the bulk channel (proto/hgemm.proto, "Bulk channel"). The
// control call (OpenBulk) asks for lanes over a byte range of a matrix; each lane gets a
// capability, 32 bytes from the system's CSPRNG, that the server maps to (owner, handle,
// direction, the lane's bytes, expiry). The bulk connection that presents a capability claims
// it: once, before it expires; it then acts as that owner on those bytes alone, so a copied
// capability is worth one transfer of one range into or out of its owner's matrix, and only
// until it is used or expires.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_SESSION_BULK_GRANTS_H_
#define HGEMM_SERVER_SESSION_BULK_GRANTS_H_

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "proto/bulk_wire.h"
#include "server/core/job.h"

namespace hgemm {

enum class BulkDirection { kPut, kGet };

// What a claimed capability allows: `length` bytes of `owner`'s matrix `handle` from byte
// `offset`, in `direction`.
struct BulkTicket {
  std::string owner;
  std::string handle;
  BulkDirection direction = BulkDirection::kPut;
  int64_t offset = 0;
  int64_t length = 0;
};

// One lane of a grant: its capability and its bytes.
struct BulkLane {
  std::string capability;  // bulk::kCapabilityBytes
  int64_t offset = 0;
  int64_t length = 0;
};

struct BulkGrantsOptions {
  // Lanes one owner may hold granted and not yet claimed; also the most one grant may have.
  int max_lanes = 64;
  // How long a capability may wait for its connection.
  std::chrono::milliseconds lifetime{30000};
};

class BulkGrants {
 public:
  explicit BulkGrants(BulkGrantsOptions options) : options_(options) {}
  BulkGrants(const BulkGrants&) = delete;
  BulkGrants& operator=(const BulkGrants&) = delete;

  // Splits bytes [offset, offset + length) of `handle` into `lanes` lanes of nearly equal
  // size (none empty: fewer lanes when there are fewer bytes, or when the owner already holds
  // lanes and `lanes` more would pass max_lanes) with a capability each, for `owner`.
  // INVALID_ARGUMENT (lanes outside 1..max_lanes, length < 1, a negative offset or offset +
  // length past 2^63 - 1), RESOURCE_EXHAUSTED ("max_bulk_lanes": the owner holds max_lanes).
  // The caller has checked the range against the matrix where it can.
  absl::Status Grant(const std::string& owner, const std::string& handle, BulkDirection direction,
                     int64_t offset, int64_t length, int lanes, Clock::time_point now,
                     std::vector<BulkLane>* granted);

  // The ticket of `capability`, which is then void. PERMISSION_DENIED for a capability that
  // was never granted, was used, or expired (one message for all three: a guesser learns
  // nothing).
  absl::Status Claim(std::string_view capability, Clock::time_point now, BulkTicket* ticket);

  const BulkGrantsOptions& options() const { return options_; }

 private:
  struct Entry {
    BulkTicket ticket;
    Clock::time_point expiry;
  };
  void ExpireLocked(Clock::time_point now);
  void ForgetLocked(std::map<std::string, Entry>::iterator it);

  const BulkGrantsOptions options_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;       // guarded by mu_; by capability
  std::map<std::string, int> lanes_by_owner_;  // guarded by mu_; owners with > 0
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_BULK_GRANTS_H_
