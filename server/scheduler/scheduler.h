// Scheduler: admission control and the queue between the transport and a Backend.
//
// Each backend device has a FIFO queue; a new job goes to the device it is pinned to (where its
// resident operands live; optionally an idle device when that one is saturated) or else to the
// one with the fewest outstanding (queued + running) jobs per slot. One worker thread per
// backend slot pulls from its device's queue and runs jobs to completion, so the jobs of
// different slots (CUDA streams) overlap. Admission is bounded by queued jobs and by bytes of
// admitted jobs. A device that has failed (Backend::DeviceHealthy false: a sticky CUDA error) takes
// no new jobs: jobs go to a healthy device, jobs pinned to the failed one are refused with
// UNAVAILABLE, and the jobs still queued on it are answered UNAVAILABLE without running.
//
// Verified GEMMs (GemmJob::verify, or every GEMM with SchedulerOptions::verify_all): the
// backend checks C by Freivalds' method (server/verify/freivalds.h) as it runs the job. A C
// that fails its check is never answered: the job is rerun once on another slot (of
// another healthy device where there is one) and answered with the rerun's C if that passes,
// the first device counted as suspect; if the rerun fails too, the answer is DATA_LOSS. A
// device whose checks fail SchedulerOptions::verify_failures_to_retire times is taken out of
// service (Backend::TakeOutOfService), as a sticky fault takes it. A worker runs on one slot
// at a time (each slot has a mutex; the rerun takes the other slot's after releasing its own),
// so that the backend never sees two callers on one slot.
//
// Batching (SchedulerOptions::batching): the commonest load is many small GEMMs (a few rows
// each) against one large resident B, each of which reads all of B. A worker that takes such
// a GEMM also takes, in FIFO order, the GEMMs queued on its device that may share its launch
// (SameBatch: the same owner, the same b_resident, and the same n, k, types, transposes,
// kernel, accumulation, alpha, beta and checking), up to max_batch_rows rows, waiting up to
// batch_window past the first one's admission for more, and runs them as one GEMM along M
// (Backend::RunBatch): one pass over B for all of them. Everything else stays per GEMM: a
// cancelled or expired member, or one whose device failed, is answered as it would be alone
// before the launch; each member is answered with its own C, status and timing, and its
// GemmReport says the batch it ran in. A member the launch could not answer (the launch
// failed, or its C could not be delivered) and every member of a launch whose check failed
// is rerun alone, as an unbatched GEMM (verified, with the rerun above), so that one member
// never decides another's answer. A launch reads every member's operands before it writes
// any member's C: GEMMs in flight together have no order among them, as on several slots.
// Owners: handles are private to their owner (another owner's handle is NOT_FOUND), so a
// resident B has no two owners; batches stay within one owner all the same, so that no
// launch ever mixes two clients' rows.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_SCHEDULER_SCHEDULER_H_
#define HGEMM_SERVER_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/backend/backend.h"
#include "server/core/job.h"

namespace hgemm {

// Which operands of a GEMM are resident on a device: queued GEMMs share them, so they count
// once, in the resident store, not against --max_queued_bytes per GEMM.
struct ResidentOperandFlags {
  bool a = false;
  bool b = false;
  bool c_in = false;

  static ResidentOperandFlags Of(const GemmJob& job) {
    return {.a = job.a_resident != nullptr,
            .b = job.b_resident != nullptr,
            .c_in = job.c_in_resident != nullptr};
  }
};

struct SchedulerOptions {
  // Jobs admitted but not yet running, over all devices; more → UNAVAILABLE.
  int64_t max_queued_requests = 256;
  // Of those, the jobs of one owner (GemmJob::owner); more of its → UNAVAILABLE while others'
  // are still admitted, so that one client (16 rings of 64 GEMMs in flight, say) cannot fill
  // the queue for everyone. 0: no per-owner bound.
  int64_t max_queued_per_owner = 64;
  // Operand + result bytes of all admitted (queued or running) jobs; a job that would pass it
  // → UNAVAILABLE, a job larger than it on its own → RESOURCE_EXHAUSTED.
  int64_t max_queued_bytes = int64_t{16} << 30;
  // A job whose resident operands live on a device with every slot busy runs on an idle
  // device instead, which copies the operands over (device to device) for that run.
  bool copy_resident_to_idle_device = false;
  // How long a worker that finished a job polls its device's queue before it sleeps: a job
  // arriving meanwhile starts without a thread wake-up (0.03-0.1 ms on the H200 host, measured
  // in docs/kernels_notes.md "Fixed costs"). Costs at most this much CPU per job; 0 = never poll.
  std::chrono::microseconds idle_spin{1000};
  // Check every GEMM's C by Freivalds' method (--verify), not only those that ask
  // (GemmJob::verify).
  bool verify_all = false;
  // Repetitions of the check (fresh vectors r) for a job that names none; with verify_all, the
  // least any job gets.
  int verify_repetitions = 1;
  // Failed checks after which a device is taken out of service (Backend::TakeOutOfService:
  // its work is refused, and health turns NOT_SERVING once no device is left); 0: never.
  int verify_failures_to_retire = 3;
  // Run queued GEMMs that share a resident B as one GEMM (the class comment's batching).
  bool batching = true;
  // How long past a batchable GEMM's admission its worker waits for more members before it
  // launches; 0: it takes what is queued and waits for nothing (a lone GEMM runs at once).
  // The wait counts against the members' deadlines as any queueing does.
  std::chrono::microseconds batch_window{0};
  // Rows (the members' m summed) of one batch at most; a GEMM with more runs alone.
  int64_t max_batch_rows = 1024;
};

// The index of the smallest load; ties go to the lowest index. REQUIRES: !loads.empty().
int PickLeastLoaded(const std::vector<double>& loads);

class Scheduler {
 public:
  // Starts one worker per backend slot. `backend` must outlive the scheduler.
  Scheduler(Backend* backend, const SchedulerOptions& options);
  ~Scheduler();  // Shutdown()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Admits `job` or says why not: RESOURCE_EXHAUSTED (larger than a limit), UNAVAILABLE (queue
  // full now, or its owner's share of it; shutting down; the job's device or every device has
  // failed). On OK, `done`
  // runs exactly once, later, on a worker thread: with the backend's status,
  // DEADLINE_EXCEEDED, CANCELLED, or UNAVAILABLE (its device failed while it waited). Never
  // calls `done` inline.
  absl::Status Enqueue(GemmJob job, GemmDone done);

  // RESOURCE_EXHAUSTED if a GEMM of `shape` is larger than one job may be (Enqueue says the
  // same): all its bytes past the device's limit, or those it brings (less its `resident`
  // operands, which the resident store counts) past --max_queued_bytes. Lets a GEMM be refused
  // before its operands arrive or its C is made.
  absl::Status CheckSize(const GemmShape& shape, ResidentOperandFlags resident) const;

  // The device (Backend::Devices() index) a job that is not pinned would go to now: a healthy
  // one while there is one.
  int LeastLoadedDevice() const;

  // Stops admitting, runs every admitted job, and joins the workers. Idempotent.
  void Shutdown();

  struct Stats {
    int64_t queued = 0;
    int64_t running = 0;
    int64_t admitted_bytes = 0;
    int64_t admitted_total = 0;   // since start
    int64_t completed_total = 0;  // since start, whatever the outcome
  };
  Stats GetStats() const;

  // Freivalds' checks per device (Backend::Devices() index), since start.
  struct VerifyStats {
    int64_t verified = 0;  // GEMMs run there whose C passed its check
    int64_t failures = 0;  // checks of C that failed there
    int64_t reruns = 0;    // reruns run there (of a GEMM whose C failed its check elsewhere)
    int64_t suspect = 0;   // failed checks whose rerun (on another slot) passed
  };
  std::vector<VerifyStats> GetVerifyStats() const;

  // The batches launched since start (two or more members run as one GEMM, whatever the
  // outcome), by their number of members and by their rows (the members' m summed):
  // value → batches.
  struct BatchStats {
    int64_t batches = 0;
    std::map<int64_t, int64_t> by_members;
    std::map<int64_t, int64_t> by_rows;
  };
  BatchStats GetBatchStats() const;

 private:
  struct Entry {
    GemmJob job;
    GemmDone done;
    Clock::time_point admitted;
  };
  struct DeviceQueue {
    std::deque<Entry> entries;
    std::atomic<int64_t> waiting{0};  // entries.size(), readable without mu_
    int64_t running = 0;
    int slots = 0;
    std::condition_variable work_available;  // wakes one of this device's workers
    int gathering = 0;                       // workers waiting out a batch window here
    std::condition_variable member_arrived;  // wakes them all at each new entry
  };

  int LeastLoadedDeviceLocked() const;
  // The device whose queue `job` joins.
  int PlaceLocked(const GemmJob& job) const;
  void WorkerLoop(int slot);
  // Returns when `device` has a job waiting or options_.idle_spin has passed.
  void SpinForWork(const DeviceQueue& device) const;
  // Removes `at` from `device`'s queue, counted as running. REQUIRES: mu_ held.
  Entry TakeLocked(DeviceQueue& device, std::deque<Entry>::iterator at);
  // Whether `job` may run in a batch (options_.batching, a resident B, one problem), and
  // whether `member` may run in `first`'s batch.
  bool Batchable(const GemmJob& job) const;
  bool SameBatch(const GemmJob& first, const GemmJob& member) const;
  // Adds to *batch (holding its first entry) the entries of `device`'s queue that may join
  // it, waiting out options_.batch_window for more. REQUIRES: `lock` holds mu_.
  void GatherLocked(DeviceQueue& device, std::unique_lock<std::mutex>& lock,
                    std::vector<Entry>* batch);
  // The repetitions of the check `job` gets (0: not checked).
  int CheckRepetitions(const GemmJob& job) const;
  // UNAVAILABLE: `device_index` has failed.
  absl::Status DeviceFailed(int device_index) const;
  // Why `entry` must not run on `slot` now: CANCELLED, UNAVAILABLE (its device failed while
  // it was queued), DEADLINE_EXCEEDED; else OK. `started`: now; `queue_wait_ms` its wait.
  absl::Status Refusal(int slot, const Entry& entry, Clock::time_point started,
                       double queue_wait_ms) const;
  // Runs (or, if Refusal says so, skips) one job; does not call its `done`.
  absl::Status RunEntry(int slot, const Entry& entry, GemmReport* report);
  // Runs a batch (two or more entries) on `slot` and answers every member (Finish).
  void RunBatch(int slot, std::vector<Entry>* batch);
  // Logs `entry`'s outcome, counts it complete and calls its `done`.
  void Finish(int slot, Entry& entry, const absl::Status& result, GemmReport report);
  // Backend::Run on `slot`, holding the slot's mutex; an exception becomes a status.
  absl::Status RunOnSlot(int slot, const GemmJob& job, GemmReport* report);
  // Runs `job` on `slot`, checked if it asks (or the options say so), with the rerun on
  // another slot and the answer the class comment describes.
  absl::Status RunVerified(int slot, const GemmJob& job, GemmReport* report);
  // The slot a rerun of `job` whose C failed its check on `failed_slot` runs on: one of
  // another healthy device (the least loaded, an idle slot first) unless the job stays on its
  // device, else another slot of that device, else `failed_slot` itself.
  int PickRerunSlot(int failed_slot, const GemmJob& job);
  // Counts a failed check on `device` and takes the device out of service past the limit.
  void CountVerifyFailure(int device, const std::string& failure);

  Backend* const backend_;
  const SchedulerOptions options_;

  mutable std::mutex mu_;
  std::vector<DeviceQueue> devices_;                  // guarded by mu_
  int64_t queued_ = 0;                                // guarded by mu_
  std::map<std::string, int64_t> queued_by_owner_;    // guarded by mu_; owners with > 0
  int64_t admitted_bytes_ = 0;                        // guarded by mu_
  int64_t admitted_total_ = 0;                        // guarded by mu_
  int64_t completed_total_ = 0;                       // guarded by mu_
  bool stopping_ = false;                             // guarded by mu_
  std::vector<VerifyStats> verify_stats_;             // guarded by mu_; per device
  BatchStats batch_stats_;                            // guarded by mu_
  std::vector<std::unique_ptr<std::mutex>> slot_mu_;  // held while the backend runs on a slot
  std::vector<std::thread> workers_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SCHEDULER_SCHEDULER_H_
