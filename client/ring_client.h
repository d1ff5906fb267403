// RingClient: GEMMs through a submission ring (proto/hgemm.proto, "Submission ring"; layout in
// proto/ring_layout.h), for a client on the server's host: after the attach, a GEMM is one
// submission entry written into shared memory and one completion read back, with no gRPC
// call and, while either side is polling, no system call.
//
// Attach makes the ring's memfd (a SharedRegion), registers it, and attaches it with
// AttachRing, binding region and resident-matrix slots; the AttachRing call stays open for the
// ring's life (a thread of the client waits on it, to learn when the server detaches the
// ring). The destructor ends that call (the server detaches the ring) and unregisters the
// ring's region.
//
// A GEMM whose entry has a deadline (kRingHasDeadline, from ToSubmission's timeout) that is not
// complete by then returns DEADLINE_EXCEEDED to its caller; its entry stays the ring's until
// its late completion is reaped (and dropped), so slots are never reused under it. Until then
// the server may still write its C: either not at all (the server skips an entry whose deadline
// passed before it started, so C's bytes stay as they were) or the whole product, once the
// late completion is reaped. Drain waits for that. The server holds the regions of a GEMM in
// flight, so they cannot be unregistered under it either.
//
// When the ring ends (the server restarts or is killed, the AttachRing call ends, the server
// detaches it) every GEMM waiting and every later one returns UNAVAILABLE with the reason:
// none hangs.
//
// Thread safety: Submit, Wait, Gemm, Bind and Drain may be called from any number of threads
// at once (one ring shared by all: submissions take a mutex; one waiting thread at a time
// reaps the completion queue for all and hands the others theirs). The reaper polls for
// spin_us, then sleeps on the ring's futex; and since GEMMs of one size take about as long each
// time, it also polls around the moment the last wait ended (its length from the start of this
// wait, ± kPollMargin), sleeping until then, so that a steady flow of GEMMs finds it running
// rather than pays a futex wake-up (tens of µs; more from a deep C-state) per completion: at
// most spin_us + 2·kPollMargin of CPU per wait.
#ifndef HGEMM_CLIENT_RING_CLIENT_H_
#define HGEMM_CLIENT_RING_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "client/shared_region.h"
#include "proto/hgemm.grpc.pb.h"
#include "proto/ring_layout.h"

namespace hgemm {

struct RingClientOptions {
  uint32_t sq_entries = 64;  // powers of two, at most kRingMaxEntries
  uint32_t cq_entries = 64;
  // How long a waiting thread polls the completion queue before it sleeps on the futex.
  int64_t spin_us = 50;
  CallOptions call;  // client_id (the owner of the slots' regions and matrices), timeout of setup
};

class RingClient {
 public:
  // Makes, registers and attaches a ring over `client`'s target (a "unix:" one), with
  // `regions` and `matrices` (handles of the caller's) as its region and matrix slots. On
  // failure: nullptr and *status (that of RegisterRegion or AttachRing; INTERNAL naming the
  // system call when the memfd cannot be made). `client` must outlive the ring.
  static std::unique_ptr<RingClient> Attach(const GemmClient& client,
                                            const std::vector<std::string>& regions,
                                            const std::vector<std::string>& matrices,
                                            const RingClientOptions& options, grpc::Status* status);
  ~RingClient();  // detaches (ending the AttachRing call) and unregisters the ring's region
  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  // Queues one GEMM (its user_data is replaced) and returns its ticket for Wait, without
  // waiting for it to run; waits only while the submission queue is full (and not past the
  // entry's deadline: then it is never sent, and Wait answers DEADLINE_EXCEEDED).
  uint64_t Submit(const RingSubmission& gemm);
  // Waits for the GEMM of `ticket` (each ticket once), at most until `deadline`: its status
  // from the server (the completion's code and message), UNAVAILABLE once the ring was
  // detached (the message says why), or DEADLINE_EXCEEDED at `deadline` (the GEMM is
  // abandoned: see above). *completion (if not null) gets its timings.
  grpc::Status Wait(uint64_t ticket, RingCompletion* completion = nullptr,
                    std::chrono::steady_clock::time_point deadline =
                        std::chrono::steady_clock::time_point::max());
  // Submit and Wait, until the entry's deadline if it has one.
  grpc::Status Gemm(const RingSubmission& gemm, RingCompletion* completion = nullptr);
  // Waits until every GEMM submitted so far has completed, those abandoned at their deadline
  // included: after it the server writes nothing more for them. Returns at once, UNAVAILABLE,
  // once the ring is detached.
  grpc::Status Drain();
  // Binds more slots after the attach (BindRingSlots): regions and matrices (the caller's
  // handles) not bound yet; those bound already are left as they are. The server's status
  // (NOT_FOUND, RESOURCE_EXHAUSTED past 4096 slots) on failure, nothing bound.
  grpc::Status Bind(const std::vector<std::string>& regions,
                    const std::vector<std::string>& matrices);
  // Whether `region` (a region handle) / `matrix` (a matrix handle) is bound to a slot.
  bool HasRegion(const std::string& region) const;
  bool HasMatrix(const std::string& matrix) const;
  // The kept C's handle of an OK completion of a kRingKeepC entry.
  static std::string KeptHandle(const RingCompletion& completion);

  // RingSubmission.kernel for a kernel name ("" or "auto": 0); -1 if the server has none.
  int KernelIndex(const std::string& name) const;
  // The entry for a GemmRequest whose operands are named by region or handle, each bound to
  // a slot of this ring, and C by c_region, or (`c_matrix`, a bound matrix slot's handle)
  // written in place into a resident matrix, or kept (keep_c_resident: kRingKeepC, its
  // default TTL); a `timeout` above 0 is the entry's deadline from now (kRingHasDeadline).
  // INVALID_ARGUMENT naming the field for what a ring entry cannot say (bytes, a batch or a
  // group, c_ttl_seconds or c_transient, a handle or region bound to no slot, a kernel the
  // server lacks).
  grpc::Status ToSubmission(const v1::GemmRequest& request, const std::string& c_matrix,
                            std::chrono::microseconds timeout, RingSubmission* entry) const;
  const v1::RingAttached& attached() const { return attached_; }
  // The handle of the ring's own region (registered while the ring lives, label "ring").
  const std::string& region() const { return region_; }
  // OK while attached; else why the ring ended.
  grpc::Status detached() const;

 private:
  RingClient(const GemmClient& client, std::unique_ptr<SharedRegion> memory,
             const RingClientOptions& options);
  RingHeader* header() const { return reinterpret_cast<RingHeader*>(memory_->data()); }
  // Moves the completions published so far into done_. REQUIRES: the caller is the reaper.
  void Reap();
  // Reaps unless another thread is reaping now.
  void TryReap();
  // Waits (poll and futex, as the header says) until a completion is published or the ring is
  // detached. REQUIRES: the caller is the reaper.
  void AwaitCompletions(std::chrono::steady_clock::time_point deadline);

  const GemmClient& client_;
  const std::unique_ptr<SharedRegion> memory_;
  const RingClientOptions options_;
  RingSubmission* const sq_;
  const RingCompletion* const cq_;
  std::string region_;           // the ring's region handle
  mutable std::mutex slots_mu_;  // held by Bind across its call: slot numbers are the server's
  std::vector<std::string> regions_, matrices_;  // guarded by slots_mu_: the slots
  v1::RingAttached attached_;
  std::unique_ptr<v1::GemmService::Stub> stub_;
  grpc::ClientContext attach_context_;
  std::unique_ptr<grpc::ClientReader<v1::RingEvent>> attach_call_;
  std::thread watcher_;  // waits for the end of the AttachRing call

  std::mutex submit_mu_;
  uint32_t sq_tail_ = 0;      // guarded by submit_mu_
  uint64_t next_ticket_ = 1;  // guarded by submit_mu_

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<uint64_t, RingCompletion> done_;  // guarded by mu_; reaped, not yet waited for
  std::set<uint64_t> abandoned_;             // guarded by mu_; past their deadline, not reaped yet
  bool reaping_ = false;                     // guarded by mu_: a thread reaps for all
  uint32_t cq_head_ = 0;                     // the reaper's
  std::chrono::nanoseconds last_wait_{0};    // the reaper's: the last wait that saw a completion
  std::atomic<uint64_t> submitted_{0}, reaped_{0};
  std::atomic<bool> detached_flag_{false};
  grpc::Status detached_;  // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_RING_CLIENT_H_
