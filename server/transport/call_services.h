// What the reactors of GemmServiceImpl work with, instead of reaching into the service: the
// core their calls go to, the CallLog that answers for each call, and the TrackedCalls
// registry (drain at shutdown, the idle timeout of streaming calls).
// Thread safety: CallLog and TrackedCalls are thread-safe.
#ifndef HGEMM_SERVER_TRANSPORT_CALL_SERVICES_H_
#define HGEMM_SERVER_TRANSPORT_CALL_SERVICES_H_

#include <grpcpp/server_context.h>

#include <absl/status/status.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "proto/hgemm.pb.h"
#include "server/core/job.h"
#include "server/metrics/metrics.h"
#include "server/session/gemm_core.h"
#include "server/session/ring_executor.h"
#include "server/session/stream_session.h"

namespace hgemm {

// Every call, and every GEMM of a stream, is answered through a CallLog: counted in the metrics
// (when there are any) and, unless OK, logged at info with the status name, message, request
// id, caller ("" before it is known), peer and traceparent. The one place the transport counts.
class CallLog {
 public:
  explicit CallLog(ServiceMetrics* metrics) : metrics_(metrics) {}  // null: nothing counted

  // Just before the call's Finish (or the GemmDone write of `gemm_id`).
  // REQUIRES: `context` is alive.
  void Answered(Rpc rpc, const absl::Status& s, const grpc::CallbackServerContext* context,
                std::string_view caller, std::string_view request_id = {},
                std::optional<uint64_t> gemm_id = std::nullopt) const;
  // A GemmStream call ends with `s` (its GEMMs were counted by Answered).
  void StreamEnded(const absl::Status& s, const grpc::CallbackServerContext* context,
                   std::string_view caller) const;
  // A GEMM that ran: its stage times and TFLOP/s.
  void Ran(const GemmShape& shape, const GemmResult& result) const;
  // Matrix bytes of `rpc` received or sent in the messages of the call of `context` (counted
  // by method and by transport, tcp or unix).
  void Received(Rpc rpc, int64_t bytes, const grpc::ServerContextBase& context) const;
  void Sent(Rpc rpc, int64_t bytes, const grpc::ServerContextBase& context) const;
  // Matrix bytes a GEMM read from (A, B) and wrote to (C) shared-memory regions.
  void SharedMemory(int64_t received, int64_t sent) const;
  // A GEMM of a submission ring completed with `code` (its ring's AttachRing call is answered
  // by Answered when the ring ends).
  void RingEntry(absl::StatusCode code) const;

 private:
  ServiceMetrics* const metrics_;
};

// A streaming call the service keeps track of, for a drain and the idle timeout.
class TrackedCall {
 public:
  virtual ~TrackedCall() = default;
  virtual void Drain() = 0;
  // Refuses what has waited for a message since before `cutoff`.
  virtual void ExpireIdle(Clock::time_point cutoff) = 0;
};

// The streaming calls in progress. A janitor thread expires idle ones every quarter of
// `idle_timeout` (10 ms to 1 s).
class TrackedCalls {
 public:
  explicit TrackedCalls(std::chrono::seconds idle_timeout);
  ~TrackedCalls();  // REQUIRES: no call is tracked
  TrackedCalls(const TrackedCalls&) = delete;
  TrackedCalls& operator=(const TrackedCalls&) = delete;

  // Calls register when created and unregister in OnDone, before they are deleted. A call
  // registered after Drain() is drained at once.
  void Track(TrackedCall* call);
  void Untrack(TrackedCall* call);
  // Shutdown has begun: every call, and every one tracked from now on, is drained.
  void Drain();

  std::chrono::seconds idle_timeout() const { return idle_timeout_; }

 private:
  void ExpireIdleCalls();  // the janitor thread

  const std::chrono::seconds idle_timeout_;
  std::mutex mu_;                 // before any call's own mutex
  std::set<TrackedCall*> calls_;  // guarded by mu_
  bool draining_ = false;         // guarded by mu_
  bool stopping_ = false;         // guarded by mu_; ends the janitor
  std::condition_variable janitor_wake_;
  std::thread janitor_;  // last: it starts once everything above is constructed
};

// Whether new calls may start: open until Close() (the drain). A call let in holds a Pass while
// its handler hands its work on (to the scheduler, to a reactor), and Close() waits for the
// passes out; handlers never wait, so that is brief. Once Close() has returned, every GEMM of a
// call let in before it has been admitted or refused: what the drain waits for is known.
// Thread safety: thread-safe.
class CallGate {
 public:
  // A call's leave to start; empty (false) if it was refused.
  class Pass {
   public:
    Pass() = default;
    Pass(Pass&& other) noexcept : gate_(std::exchange(other.gate_, nullptr)) {}
    Pass& operator=(Pass&& other) noexcept;
    ~Pass() { Leave(); }
    explicit operator bool() const { return gate_ != nullptr; }

   private:
    friend class CallGate;
    explicit Pass(CallGate* gate) : gate_(gate) {}
    void Leave();

    CallGate* gate_ = nullptr;
  };

  CallGate() = default;
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  // A pass, or an empty one once Close() has begun.
  Pass Enter();
  // Refuses every call from now on, then waits until no pass is held. REQUIRES: the caller
  // holds no pass. Idempotent.
  void Close();

 private:
  std::mutex mu_;
  std::condition_variable passes_returned_;
  int passes_ = 0;       // guarded by mu_
  bool closed_ = false;  // guarded by mu_
};

// Everything a reactor needs. The pointees outlive every call.
struct CallServices {
  GemmCoreInterface* core = nullptr;
  const CallLog* log = nullptr;
  TrackedCalls* calls = nullptr;
  const StreamOptions* stream = nullptr;
  RingRegistry* rings = nullptr;
};

// Describes a resident matrix of `core` for the wire.
void Describe(const GemmCoreInterface& core, const ResidentMatrix& matrix, v1::MatrixInfo* info);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_CALL_SERVICES_H_
