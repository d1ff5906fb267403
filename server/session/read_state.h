// ReadState: the reads of a session of one client-streaming call (UploadSession, PartSession):
// whether they are over, whether a message is being acted on (the call can't finish under it)
// and when the last one came (the idle timeout); and ActOnRead, the start of such a session's
// OnRead.
// Thread safety: none of its own; the session guards its ReadState with its mutex.
#ifndef HGEMM_SERVER_SESSION_READ_STATE_H_
#define HGEMM_SERVER_SESSION_READ_STATE_H_

#include <absl/status/status.h>

#include <mutex>

#include "server/core/job.h"
#include "server/core/status.h"

namespace hgemm {

struct ReadState {
  bool done = false;    // no message is read any more
  bool acting = false;  // a message is being acted on
  Clock::time_point last = Clock::now();

  // Whether the reads went idle: not over, nothing acted on, no message since before `cutoff`.
  bool IdleSince(Clock::time_point cutoff) const { return !done && !acting && last < cutoff; }
};

// Acts on one message read by a session guarded by `mu`: false, and nothing runs, once its
// reads are over; else marks them acting and stamps them under `mu`, then runs `consume()`
// without it; what it returns, or its exception (FromCurrentException(rpc)), goes to *status.
// The caller clears reads.acting under `mu` as it acts on *status.
// REQUIRES: `mu` not held.
template <typename Consume>
bool ActOnRead(std::mutex& mu, ReadState& reads, const char* rpc, Consume consume,
               absl::Status* status) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (reads.done) return false;
    reads.acting = true;
    reads.last = Clock::now();
  }
  try {
    *status = consume();
  } catch (...) {
    *status = status::FromCurrentException(rpc);
  }
  return true;
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_READ_STATE_H_
