// StreamSession: one GemmStream call (see GemmStreamRequest in proto/hgemm.proto) without its
// transport. It owns the call's StreamAssembler (the order rules) and keeps the books of every
// GEMM from its header to its answer: admission (size limits, resident operands, the stream's
// and the client's pending bytes), where its chunks go (allocated on an upload thread, never in
// a reaction), the copies of its chunks, the job it becomes, and what goes back to the client
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
#ifndef HGEMM_SERVER_STREAM_SESSION_H_
#define HGEMM_SERVER_STREAM_SESSION_H_

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "proto/hgemm.pb.h"
#include "server/backend/backend.h"
#include "server/host_buffer_pool.h"
#include "server/metrics.h"
#include "server/resident/matrix_store.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/upload_queue.h"
#include "server/session/resident_resolver.h"
#include "server/stream_assembler.h"
#include "server/validation.h"

namespace hgemm {

// Operand bytes that each client's streamed GEMMs hold while their chunks are still arriving,
// over all of the client's streams, bounded per client.
// Thread safety: all methods are thread-safe.
class ClientPendingBudget {
 public:
  explicit ClientPendingBudget(int64_t max_bytes_per_client)
      : max_bytes_per_client_(max_bytes_per_client) {}

  // Takes `bytes` of `owner`'s budget, or RESOURCE_EXHAUSTED (nothing taken).
  absl::Status Charge(const std::string& owner, int64_t bytes);
  // Gives back `bytes` that Charge took for `owner`.
  void Release(const std::string& owner, int64_t bytes);

 private:
  const int64_t max_bytes_per_client_;
  std::mutex mu_;
  std::map<std::string, int64_t> pending_bytes_;  // guarded by mu_; owners with > 0
};

// What the sessions of one service work with. Every pointer but `metrics` is required, and
// every pointee must outlive the sessions.
struct StreamServices {
  const RequestRules* rules = nullptr;  // what headers are validated against
  Scheduler* scheduler = nullptr;
  Backend* backend = nullptr;
  UploadQueue* uploads = nullptr;
  const ResidentResolver* resolver = nullptr;
  ClientPendingBudget* client_pending = nullptr;
  HostBufferPool* result_buffers = nullptr;  // for the Cs on their way out
  ServiceMetrics* metrics = nullptr;         // may be null: nothing counted
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
  // for keep_c, the `kept_c` the store now holds. Then OnWriteDone.
  virtual void StartWriteDone(const AnnouncedGemm& gemm, const absl::Status& status,
                              const GemmReport& report, const ResidentMatrix& kept_c) = 0;
  // Ends the call with `status`. Called once; nothing is started after it.
  virtual void Finish(const absl::Status& status) = 0;
  // Whether the client has gone away. Called from any thread, with or without the mutex.
  virtual bool IsCancelled() const = 0;
};

class StreamSession {
 public:
  // A session of `owner` (already identified) whose GEMMs get the call's `deadline` and
  // `traceparent` ("" if none). It starts no read: the transport starts the first one.
  // REQUIRES: `services`' pointees and `transport` outlive the session.
  StreamSession(const StreamServices& services, StreamTransport* transport, std::string owner,
                Clock::time_point deadline, std::string traceparent);
  // Waits for whoever called Finish to let go of the session. REQUIRES: the call is done
  // (Finish was called and nothing it started is outstanding).
  ~StreamSession();
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  // A message was read (its chunk data is moved out). A GEMM refused for a reason of its own
  // is answered at once and the stream reads on; a broken order rule stops the reads, and the
  // call ends with INVALID_ARGUMENT once what was admitted is answered.
  void OnRead(v1::GemmStreamRequest& message);
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
  absl::Status AllocateArriving(int device, int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer);
  void Allocated(const std::shared_ptr<Gemm>& gemm, const absl::Status& s,
                 std::shared_ptr<ResidentBuffer> a, std::shared_ptr<ResidentBuffer> b);
  void Place(OperandChunk chunk);
  void CopyChunk(const std::shared_ptr<Gemm>& gemm, OperandChunk chunk);
  void Submit(std::shared_ptr<Gemm> gemm);
  void Complete(std::shared_ptr<Gemm> gemm, const absl::Status& status, const GemmReport& report);
  void QueueLocked(const std::shared_ptr<Gemm>& gemm);
  void NextWriteLocked();
  void MaybeFinishLocked();

  const StreamServices& services_;
  StreamTransport* const transport_;
  const std::string owner_;
  const Clock::time_point deadline_;
  const std::string traceparent_;

  std::mutex mu_;
  StreamAssembler assembler_;                            // guarded by mu_
  absl::Status error_;                                   // guarded by mu_; the call's final status
  bool reads_done_ = false;                              // guarded by mu_
  std::map<uint64_t, std::shared_ptr<Gemm>> receiving_;  // guarded by mu_; chunks still to come
  int64_t writes_in_flight_ = 0;                         // guarded by mu_; chunks being copied
  int64_t allocations_in_flight_ = 0;                    // guarded by mu_; on upload threads
  int64_t in_flight_ = 0;                                // guarded by mu_; submitted, not completed
  std::deque<std::shared_ptr<Gemm>> outgoing_;           // guarded by mu_
  bool writing_ = false;                                 // guarded by mu_
  bool broken_ = false;                                  // guarded by mu_; a write failed
  bool reading_ = false;   // guarded by mu_; a message is being acted on outside mu_
  bool draining_ = false;  // guarded by mu_; see Drain()
  bool finished_ = false;  // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_STREAM_SESSION_H_
