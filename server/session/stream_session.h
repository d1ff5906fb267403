// StreamSession: one GemmStream call (see GemmStreamRequest in proto/hgemm.proto) without its
// transport. It owns the call's StreamAssembler (the order rules) and keeps the books of every
// GEMM from its header to its answer: admission through the GemmCore (size limits, resident
// operands, the client's pending bytes) and the stream's own pending bytes, the ArrivingBuffers
// its chunks go to, the job it becomes, and what goes back to the client
// and when: C chunk by chunk while it comes off the device, then its GemmDone, one write at a
// time, in the order the GEMMs became ready. The call ends once the client has stopped sending
// (or broke a rule, or the server is draining and nothing is half-received), every allocation,
// copy and admitted GEMM is done and every answer is written.
//
// The transport (StreamTransport) does the reads, writes and finish that the session asks for,
// and tells the session what came of them; it knows no GEMM bookkeeping. The session knows no
// gRPC: it is tested without it (stream_session_test.cc).
// Thread safety: all methods are thread-safe; the session serialises itself (one mutex), and
// calls into its StreamTransport with that mutex held.
#ifndef HGEMM_SERVER_SESSION_STREAM_SESSION_H_
#define HGEMM_SERVER_SESSION_STREAM_SESSION_H_

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "server/session/arriving_buffer.h"
#include "server/session/gemm_core.h"
#include "server/session/stream_assembler.h"

namespace hgemm {

// The limits every GemmStream session of a service works with.
struct StreamOptions {
  // Size of the C chunks written back.
  int64_t stream_chunk_bytes = int64_t{1} << 20;
  // Operand bytes one stream's incomplete GEMMs may hold (see StreamAssembler).
  int64_t max_stream_pending_bytes = int64_t{4} << 30;
  // Named in the answer of a GEMM that ExpireIdle refuses.
  std::chrono::seconds idle_timeout{60};
};

// The call under a session: what the session asks of the wire. Each Start* is answered later
// by the session's matching On* method, never from inside the Start* call (the session holds
// its mutex while it calls in). At most one read and one write are started at a time.
class StreamTransport {
 public:
  virtual ~StreamTransport() = default;

  // Reads the next message: StreamSession::OnRead, or OnReadsDone when there is none.
  virtual void StartRead() = 0;
  // Writes bytes [offset, offset + data.size()) of the C of `gemm_id`; then OnWriteDone.
  // `data` is valid only during the call.
  virtual void StartWriteChunk(uint64_t gemm_id, int64_t offset, std::string_view data) = 0;
  // Writes the answer of `gemm` (its GemmDone): `status`, and when it is OK the `report` and,
  // for keep_c, result.kept_c (now in the store). Then OnWriteDone.
  virtual void StartWriteDone(const AnnouncedGemm& gemm, const absl::Status& status,
                              const GemmResult& result) = 0;
  // Ends the call with `status`. Called once; nothing is started after it.
  virtual void Finish(const absl::Status& status) = 0;
  // Whether the client has gone away. Called from any thread, with or without the mutex.
  virtual bool IsCancelled() const = 0;
};

class StreamSession {
 public:
  // A session of `owner` (already identified) whose GEMMs get the call's `deadline` and
  // `traceparent` ("" if none). It starts no read: the transport starts the first one.
  // REQUIRES: `core`, `options` and `transport` outlive the session.
  StreamSession(GemmCoreInterface& core, const StreamOptions& options, StreamTransport* transport,
                std::string owner, Clock::time_point deadline, std::string traceparent);
  // Waits for whoever called Finish to let go of the session. REQUIRES: the call is done
  // (Finish was called and nothing it started is outstanding).
  ~StreamSession();
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  // A message was read (its chunk data is moved out). A GEMM refused for a reason of its own
  // is answered at once and the stream reads on; a broken order rule stops the reads, and the
  // call ends with INVALID_ARGUMENT once what was admitted is answered. Returns the operand
  // bytes of the message taken for a GEMM (0 for a header, or a chunk of a refused GEMM).
  int64_t OnRead(StreamMessage& message);
  // The client closed its side (or the call was cancelled). GEMMs still missing chunks then
  // make the call end with INVALID_ARGUMENT.
  void OnReadsDone();
  // The write started last is done; `ok` false: the client is gone, nothing more is written
  // and the call ends CANCELLED.
  void OnWriteDone(bool ok);

  // The server is shutting down: new GEMMs are refused with UNAVAILABLE, and the call ends
  // UNAVAILABLE as soon as nothing is half-received and every admitted GEMM is answered.
  void Drain();
  // Refuses (DEADLINE_EXCEEDED) the GEMMs that have waited for a chunk since before `cutoff`;
  // their operands are dropped, and so are the chunks the client still sends for them.
  void ExpireIdle(Clock::time_point cutoff);

 private:
  struct Gemm;

  void Start(AnnouncedGemm header);
  absl::Status Admit(Gemm& gemm);
  void ReceiveLocked(const std::shared_ptr<Gemm>& gemm);
  void Settled(const std::shared_ptr<Gemm>& gemm, int operand, const absl::Status& s,
               std::shared_ptr<ResidentBuffer> buffer, double copy_ms);
  void DropArriving(Gemm& gemm, const absl::Status& why);
  int64_t Place(OperandChunk chunk);
  void AbandonReceiving();
  void Submit(std::shared_ptr<Gemm> gemm);
  void Complete(std::shared_ptr<Gemm> gemm, const absl::Status& status, GemmResult result);
  void QueueLocked(const std::shared_ptr<Gemm>& gemm);
  void NextWriteLocked();
  void MaybeFinishLocked();

  GemmCoreInterface& core_;
  const StreamOptions& options_;
  StreamTransport* const transport_;
  const std::string owner_;
  const Clock::time_point deadline_;
  const std::string traceparent_;

  std::mutex mu_;
  StreamAssembler assembler_;                            // guarded by mu_
  absl::Status error_;                                   // guarded by mu_; the call's final status
  bool reads_done_ = false;                              // guarded by mu_
  std::map<uint64_t, std::shared_ptr<Gemm>> receiving_;  // guarded by mu_; chunks still to come
  int64_t arriving_ = 0;                        // guarded by mu_; ArrivingBuffers not settled yet
  int64_t in_flight_ = 0;                       // guarded by mu_; submitted, not completed
  std::deque<std::shared_ptr<Gemm>> outgoing_;  // guarded by mu_
  bool writing_ = false;                        // guarded by mu_
  bool broken_ = false;                         // guarded by mu_; a write failed
  bool reading_ = false;   // guarded by mu_; a message is being acted on outside mu_
  bool draining_ = false;  // guarded by mu_; see Drain()
  bool finished_ = false;  // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_STREAM_SESSION_H_
