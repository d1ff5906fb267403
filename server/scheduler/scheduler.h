// Scheduler: admission control and the queue between the transport and a Backend.
//
// Each backend device has a FIFO queue; a new job goes to the device it is pinned to (where its
// resident operands live; optionally an idle device when that one is saturated) or else to the
// one with the fewest outstanding (queued + running) jobs per slot. One worker thread per
// backend slot pulls from its device's queue and runs jobs to completion, so the jobs of
// different slots (CUDA streams) overlap. Admission is bounded by queued jobs and by bytes of admitted jobs.
// A device that has failed (Backend::DeviceHealthy false: a sticky CUDA error) takes no new
// jobs: jobs go to a healthy device, jobs pinned to the failed one are refused with
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
  // same); lets a stream refuse a GEMM before its operands arrive.
  absl::Status CheckSize(const GemmShape& shape) const;

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
  };

  int LeastLoadedDeviceLocked() const;
  // The device whose queue `job` joins.
  int PlaceLocked(const GemmJob& job) const;
  void WorkerLoop(int slot);
  // Returns when `device` has a job waiting or options_.idle_spin has passed.
  void SpinForWork(const DeviceQueue& device) const;
  // UNAVAILABLE: `device_index` has failed.
  absl::Status DeviceFailed(int device_index) const;
  // Runs (or, if cancelled, expired or its device failed, skips) one job; does not call its
  // `done`.
  absl::Status RunEntry(int slot, const Entry& entry, GemmReport* report);
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
  std::vector<DeviceQueue> devices_;  // guarded by mu_
  int64_t queued_ = 0;                // guarded by mu_
  std::map<std::string, int64_t> queued_by_owner_;  // guarded by mu_; owners with > 0
  int64_t admitted_bytes_ = 0;        // guarded by mu_
  int64_t admitted_total_ = 0;        // guarded by mu_
  int64_t completed_total_ = 0;       // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  std::vector<VerifyStats> verify_stats_;  // guarded by mu_; per device
  std::vector<std::unique_ptr<std::mutex>> slot_mu_;  // held while the backend runs on a slot
  std::vector<std::thread> workers_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SCHEDULER_SCHEDULER_H_
