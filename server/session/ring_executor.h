// RingExecutor: the server's side of one attached submission ring (proto/hgemm.proto,
// "Submission ring"; layout in proto/ring_layout.h): a thread that takes GEMMs from the ring's
// submission queue, turns each into a GemmOrder through the same validation and admission as a
// Gemm call, and writes each outcome into the completion queue. No gRPC: the transport attaches
// it, stops it when the call ends, and hears from it when it detaches itself.
//
// The ring's memory is client-writable at any moment: the executor keeps its own sizes, SQ
// head and CQ tail, copies each entry out once before looking at it, and treats an impossible
// SQ tail or CQ head as a protocol error that detaches the ring (never an out-of-bounds access
// or a wait that does not end). Work per ring is bounded: at most max_in_flight GEMMs, and
// never more than the CQ has room for.
//
// RingRegistry counts the rings attached (per owner, bounded) and their threads, and finds an
// owner's attached ring by its ring region (BindRingSlots); it must outlive every executor and
// waits for their threads when destroyed.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_SESSION_RING_EXECUTOR_H_
#define HGEMM_SERVER_SESSION_RING_EXECUTOR_H_

#include <absl/status/status.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "proto/ring_layout.h"
#include "server/resident/region_store.h"
#include "server/session/gemm_core.h"

namespace hgemm {

struct RingOptions {
  // How long the ring thread polls an empty submission queue before it sleeps on its futex.
  int64_t spin_us = 50;
  // GEMMs of one ring admitted and not yet completed, at most.
  uint32_t max_in_flight = 64;
  // Rings one owner may have attached at once.
  int max_rings_per_owner = 16;
  // Region slots, and matrix slots, one ring may bind (at the attach and by Bind together).
  uint32_t max_slots = 4096;
};

// What AttachRing names.
struct RingSpec {
  std::string ring_region;  // the owner's region holding the ring from byte 0
  uint32_t sq_entries = 0;
  uint32_t cq_entries = 0;
  std::vector<std::string> regions;   // region slots
  std::vector<std::string> matrices;  // resident matrix slots
};

class RingExecutor;

class RingRegistry {
 public:
  explicit RingRegistry(RingOptions options) : options_(options) {}
  ~RingRegistry();  // waits for every ring thread to end. REQUIRES: every ring stopped
  RingRegistry(const RingRegistry&) = delete;
  RingRegistry& operator=(const RingRegistry&) = delete;

  // Rings attached now, over all owners.
  int64_t Attached();
  const RingOptions& options() const { return options_; }
  // `owner`'s ring attached over its region `ring_region`, or NOT_FOUND naming ring_region
  // (none, another owner's, or detached).
  absl::Status Find(const std::string& owner, const std::string& ring_region,
                    std::shared_ptr<RingExecutor>* ring);

 private:
  friend class RingExecutor;
  // RESOURCE_EXHAUSTED past options().max_rings_per_owner.
  absl::Status Add(const std::string& owner);
  // Makes `ring` findable (once attached) and forgets it.
  void Index(const std::string& owner, const std::string& ring_region,
             const std::shared_ptr<RingExecutor>& ring);
  void Remove(const std::string& owner, const std::string& ring_region);
  void ThreadStarted();
  void ThreadEnded();

  const RingOptions options_;
  std::mutex mu_;
  std::map<std::string, int> rings_;  // guarded by mu_; owners with rings
  // guarded by mu_: attached rings by {owner, ring region}
  std::map<std::pair<std::string, std::string>, std::weak_ptr<RingExecutor>> by_region_;
  int threads_ = 0;  // guarded by mu_
  std::condition_variable threads_ended_;
};

// Called once per completed entry with its status code (for the metrics).
using RingEntryObserver = std::function<void(absl::StatusCode)>;
// Called at most once, on the ring thread, when the ring detaches itself: the reason.
using RingDetached = std::function<void(const absl::Status&)>;

class RingExecutor : public std::enable_shared_from_this<RingExecutor> {
 public:
  // Attaches `spec`'s ring for `owner` and starts its thread. Errors: those of
  // GemmCoreInterface::CheckRegionsAllowed (shared memory off, not the Unix socket) and of
  // LeaseRegion for the ring region (NOT_FOUND: not the owner's; OUT_OF_RANGE: smaller than
  // RingBytes); INVALID_ARGUMENT (entry counts not powers of two in [1, kRingMaxEntries], a
  // CUDA IPC region, a bad magic or version in the ring's header, an empty slot handle);
  // RESOURCE_EXHAUSTED (the owner's ring count). `core` and `registry` must outlive the ring's
  // thread and its GEMMs (the registry waits for the thread; the core, as for any GEMM, for
  // the scheduler's drain). `on_entry` may be null.
  static absl::Status Attach(GemmCoreInterface* core, RingRegistry* registry, std::string owner,
                             bool over_unix_socket, const RingSpec& spec,
                             RingEntryObserver on_entry, RingDetached on_detached,
                             std::shared_ptr<RingExecutor>* ring);

  // Detaches: the thread takes no more entries and ends soon (it is woken); GEMMs in flight
  // still complete into the ring. The ring's region is let go (it may be unregistered) once
  // the thread has ended and they have. Once it returns, on_detached is never called. Never
  // waits for a GEMM; idempotent.
  void Stop();

  // Binds more slots after the attach (BindRingSlots): `regions` become region slots from
  // *first_region on, `matrices` matrix slots from *first_matrix on, for entries the ring
  // takes from now on. Handles are resolved per GEMM, as at the attach. INVALID_ARGUMENT for an
  // empty handle; RESOURCE_EXHAUSTED past RingOptions::max_slots (nothing bound).
  absl::Status Bind(const std::vector<std::string>& regions,
                    const std::vector<std::string>& matrices, uint32_t* first_region,
                    uint32_t* first_matrix);

  uint32_t max_in_flight() const { return max_in_flight_; }

  RingExecutor(GemmCoreInterface* core, RingRegistry* registry, std::string owner,
               bool over_unix_socket, const RingSpec& spec, RegionLease ring,
               RingEntryObserver on_entry, RingDetached on_detached);  // use Attach
  ~RingExecutor();

 private:
  RingHeader* header() const { return reinterpret_cast<RingHeader*>(ring_.data()); }
  // The ring thread: takes entries until stopped or detached.
  void Run();
  // Whether another entry may be taken now (bounds, CQ room); a CQ head that cannot be is a
  // protocol error.
  absl::Status HasRoom(bool* room);
  // Submits one copied-out entry: OK once the scheduler took it, else why not.
  absl::Status Submit(const RingSubmission& entry);
  // The RingCompletion.kernel of `kernel`: its index in the kernel table the attach sent
  // (RingAttached.kernels) plus one; 0 if it is not there.
  uint16_t KernelIndex(const std::string& kernel) const;
  // Writes the outcome of the entry `user_data` into the CQ and wakes whoever sleeps; on OK,
  // `kept_c` (may be null) is the handle of the C it kept, and `report` says what ran it.
  void Complete(uint64_t user_data, absl::Status status, const GemmReport* report,
                const GemmShape& shape, const std::string* kept_c);
  // A protocol error: the ring stops and on_detached hears why.
  void Detach(const absl::Status& reason);
  // Gives back the owner's ring count (once).
  void Unregister();
  // The ring thread has ended: the ring's region is let go once no GEMM is in flight.
  void ThreadDone();
  // Lets go of the ring's region when nothing can write into it any more. REQUIRES: mu_ held.
  void ReleaseRingIfDoneLocked();

  GemmCoreInterface* const core_;
  RingRegistry* const registry_;
  const std::string owner_;
  const bool over_unix_socket_;
  const uint32_t sq_entries_, cq_entries_;
  const uint32_t max_in_flight_;
  const int64_t spin_us_;
  const std::string ring_region_;
  std::mutex slots_mu_;
  std::vector<std::string> regions_, matrices_;  // guarded by slots_mu_; the slots
  RegionLease ring_;  // guarded by mu_ once the thread runs: the ring's mapping, held until
                      // the thread has ended and no GEMM is in flight
  const RingSubmission* const sq_;
  RingCompletion* const cq_;
  const RingEntryObserver on_entry_;

  uint32_t sq_head_ = 0;  // the ring thread's
  std::mutex mu_;
  uint32_t cq_tail_ = 0;      // guarded by mu_
  uint32_t in_flight_ = 0;    // guarded by mu_
  bool thread_done_ = false;  // guarded by mu_
  std::atomic<bool> stopping_{false};
  std::atomic<bool> registered_{true};
  std::atomic<std::thread::id> thread_id_{};  // the ring thread, once it runs

  std::mutex detach_mu_;      // held while on_detached_ runs
  RingDetached on_detached_;  // guarded by detach_mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_RING_EXECUTOR_H_
