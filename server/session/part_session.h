// PartSession: one UploadPart call (see "Parallel parts" in proto/hgemm.proto) without its
// transport, which converts each message it reads into a PartMessage. The header claims a byte
// range of an upload in the MatrixStore (BeginPart: owner, bounds, overlap, the parts limit); each
// chunk is written into the matrix's buffer on the upload queue as it arrives; once the client is
// done, exactly the announced bytes came and every write has landed, the range counts (EndPart) and
// the call ends with the bytes the upload still misses. A part that fails in any way gives its
// range back, after its writes have landed, so that it can be sent again.
//
// The transport (PartTransport) does the reads and the finish that the session asks for. The
// session knows no gRPC (tested without it: part_session_test.cc).
// Thread safety: all methods are thread-safe; the session serialises itself (one mutex), and
// calls into its PartTransport with that mutex held.
#ifndef HGEMM_SERVER_SESSION_PART_SESSION_H_
#define HGEMM_SERVER_SESSION_PART_SESSION_H_

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <variant>

#include "server/core/wire_bytes.h"
#include "server/session/gemm_core.h"
#include "server/session/read_state.h"

namespace hgemm {

// A part's header as its client described it, unchecked: `length` bytes of the upload
// `handle` (CreateUpload's) from byte `offset`.
struct PartSpec {
  std::string handle;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One UploadPart message as read: the header, or a chunk of the part's bytes (where they
// arrived: gRPC's slices or the wire's string, never copied); monostate for a message that
// holds neither.
struct PartMessage {
  std::variant<std::monostate, PartSpec, WireBytes> content;
};

// The call under a PartSession. StartRead is answered later by OnRead or OnReadsDone, never
// from inside the call; at most one read is started at a time.
class PartTransport {
 public:
  virtual ~PartTransport() = default;
  virtual void StartRead() = 0;
  // Ends the call with `status`; when it is OK, `missing_bytes` are the bytes the upload still
  // misses. Called once; nothing is started after it.
  virtual void Finish(const absl::Status& status, int64_t missing_bytes) = 0;
};

class PartSession {
 public:
  // A part of `owner` (already identified); a message that doesn't come for `idle_timeout`
  // ends it (ExpireIdle). It starts no read: the transport starts the first one.
  // REQUIRES: `core` and `transport` outlive the session.
  PartSession(GemmCoreInterface& core, PartTransport* transport, std::string owner,
              std::chrono::seconds idle_timeout);
  // REQUIRES: the call is done (Finish was called, nothing it started is outstanding).
  ~PartSession();
  PartSession(const PartSession&) = delete;
  PartSession& operator=(const PartSession&) = delete;

  // A message was read (its chunk is moved out). A broken rule ends the call once nothing is
  // in flight. Returns the part's bytes it brought.
  int64_t OnRead(PartMessage& message);
  // The client has sent everything (or went away).
  void OnReadsDone();
  // Ends the part (DEADLINE_EXCEEDED) if no message came since before `cutoff`.
  void ExpireIdle(Clock::time_point cutoff);

 private:
  absl::Status ConsumeHeader(const PartMessage& message);
  absl::Status ConsumeChunk(WireBytes chunk);
  void Written(const absl::Status& s);
  // Ends the reads with `s` unless an earlier error stands. REQUIRES: mu_ held.
  void FailLocked(const absl::Status& s);
  void MaybeFinishLocked();

  GemmCoreInterface& core_;
  PartTransport* const transport_;
  const std::string owner_;
  const std::chrono::seconds idle_timeout_;
  // The read path's own (reads are serialised):
  PartSpec header_;
  int64_t offset_ = 0, length_ = 0;  // the part's, from the header on
  int64_t received_ = 0;

  std::mutex mu_;
  bool claimed_ = false;                    // guarded by mu_; BeginPart succeeded
  std::shared_ptr<ResidentBuffer> buffer_;  // guarded by mu_; while claimed
  int64_t writes_in_flight_ = 0;            // guarded by mu_
  absl::Status error_;                      // guarded by mu_; a broken rule, a failed write
  ReadState reads_;                         // guarded by mu_
  bool finished_ = false;                   // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_PART_SESSION_H_
