// UploadSession: one UploadMatrix call (see UploadMatrixRequest in proto/hgemm.proto) without
// its transport, which converts each message it reads into an UploadMessage. The header is
// validated, reserves the matrix's bytes of the owner's quota and
// starts its ArrivingBuffer on the device it will live on; each chunk goes into that buffer as
// it arrives; once the client is done and every byte has landed, the matrix is registered in
// the store and the call ends with it.
//
// The transport (UploadTransport) does the reads and the finish that the session asks for. The
// session knows no gRPC (tested without it: upload_session_test.cc).
// Thread safety: all methods are thread-safe; the session serialises itself (one mutex), and
// calls into its UploadTransport with that mutex held.
#ifndef HGEMM_SERVER_SESSION_UPLOAD_SESSION_H_
#define HGEMM_SERVER_SESSION_UPLOAD_SESSION_H_

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>

#include "server/core/wire_bytes.h"
#include "server/session/arriving_buffer.h"
#include "server/session/gemm_core.h"
#include "server/session/gemm_spec.h"
#include "server/session/read_state.h"

namespace hgemm {

// One UploadMatrix message as read: the header, or a chunk of the matrix's bytes (the wire's,
// moved here, never copied); monostate for a message that holds neither.
struct UploadMessage {
  std::variant<std::monostate, MatrixSpec, WireBytes> content;
};

// The call under an UploadSession. StartRead is answered later by OnRead or OnReadsDone,
// never from inside the call; at most one read is started at a time.
class UploadTransport {
 public:
  virtual ~UploadTransport() = default;
  virtual void StartRead() = 0;
  // Ends the call with `status`; when it is OK, `matrix` is the one now in the store. Called
  // once; nothing is started after it.
  virtual void Finish(const absl::Status& status, const ResidentMatrix& matrix) = 0;
  // Whether the client has gone away.
  virtual bool IsCancelled() const = 0;
};

class UploadSession {
 public:
  // An upload of `owner` (already identified); a message that doesn't come for `idle_timeout`
  // ends it (ExpireIdle). It starts no read: the transport starts the first one.
  // `over_unix_socket`: the call came over a Unix socket, where a header may name a region.
  // REQUIRES: `core` and `transport` outlive the session.
  UploadSession(GemmCoreInterface& core, UploadTransport* transport, std::string owner,
                std::chrono::seconds idle_timeout, bool over_unix_socket = false);
  // REQUIRES: the call is done (Finish was called, nothing it started is outstanding).
  ~UploadSession();
  UploadSession(const UploadSession&) = delete;
  UploadSession& operator=(const UploadSession&) = delete;

  // A message was read (its chunk is moved out). A broken rule ends the call with
  // INVALID_ARGUMENT once nothing is in flight. Returns the matrix bytes it brought (none for a
  // header naming a region: see region_bytes()).
  int64_t OnRead(UploadMessage& message);
  // The client has sent everything (or went away).
  void OnReadsDone();
  // Ends the upload (DEADLINE_EXCEEDED) if no message came since before `cutoff`.
  void ExpireIdle(Clock::time_point cutoff);
  // The call is over; `cancelled`: the client went away without learning the handle, so a
  // matrix registered for it is released (only now is cancellation exact).
  void OnCallDone(bool cancelled);
  // The matrix bytes read from a shared-memory region (the header's), once its header is read.
  int64_t region_bytes() const { return from_region_ ? bytes_ : 0; }

 private:
  absl::Status ConsumeHeader(const UploadMessage& message);
  absl::Status ConsumeChunk(UploadMessage& message);
  void Settled(const absl::Status& s, std::shared_ptr<ResidentBuffer> buffer);
  // Ends the reads with `s` (unless an earlier error stands) and drops what is still arriving.
  // REQUIRES: mu_ not held.
  void Fail(const absl::Status& s);
  void MaybeFinishLocked();

  GemmCoreInterface& core_;
  UploadTransport* const transport_;
  const std::string owner_;
  const std::chrono::seconds idle_timeout_;
  const bool over_unix_socket_;
  // The read path's own (reads are serialised):
  MatrixSpec header_;
  bool header_seen_ = false;
  bool from_region_ = false;  // the header named a region: the whole matrix came from it
  int64_t bytes_ = 0;         // the matrix's, from the header on
  ElementType dtype_ = ElementType::kFp16;  // the matrix's, from the header on
  int64_t received_ = 0;

  std::mutex mu_;
  QuotaReservation quota_;                    // guarded by mu_; from the header on
  std::shared_ptr<ArrivingBuffer> arriving_;  // guarded by mu_; from the header on
  bool settled_ = false;                      // guarded by mu_; arriving_ has settled
  absl::Status settled_status_;               // guarded by mu_
  std::shared_ptr<ResidentBuffer> buffer_;    // guarded by mu_; once settled OK
  absl::Status error_;                        // guarded by mu_; a broken rule
  ReadState reads_;                           // guarded by mu_
  bool finished_ = false;                     // guarded by mu_
  std::string registered_;                    // guarded by mu_; the handle once registered
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_UPLOAD_SESSION_H_
