#include "server/scheduler/scheduler.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "server/core/logging.h"
#include "server/core/status.h"
#include "server/core/thread_name.h"

namespace hgemm {

int PickLeastLoaded(const std::vector<double>& loads) {
  return static_cast<int>(std::min_element(loads.begin(), loads.end()) - loads.begin());
}

Scheduler::Scheduler(Backend* backend, const SchedulerOptions& options)
    : backend_(backend),
      options_(options),
      devices_(backend->Devices().size()),
      verify_stats_(backend->Devices().size()) {
  for (int slot = 0; slot < backend_->NumSlots(); ++slot) {
    devices_[backend_->SlotDevice(slot)].slots++;
    slot_mu_.push_back(std::make_unique<std::mutex>());
  }
  for (int slot = 0; slot < backend_->NumSlots(); ++slot) {
    workers_.emplace_back([this, slot] { WorkerLoop(slot); });
  }
}

Scheduler::~Scheduler() { Shutdown(); }

namespace {

// What a GEMM counts against --max_queued_bytes: its bytes less its resident operands.
int64_t AdmittedBytes(const GemmShape& shape, ResidentOperandFlags resident) {
  return shape.Bytes() - (resident.a ? shape.ABytes() : 0) - (resident.b ? shape.BBytes() : 0) -
         (resident.c_in ? shape.CInBytes() : 0);
}

}  // namespace

absl::Status Scheduler::CheckSize(const GemmShape& shape, ResidentOperandFlags resident) const {
  const int64_t bytes = shape.Bytes(), admitted = AdmittedBytes(shape, resident);
  if (admitted > options_.max_queued_bytes) {
    return status::OverLimit(
        "max_queued_bytes",
        fmt::format("the GEMM brings {} bytes of operands and result; this server queues at most "
                    "{} (--max_queued_bytes)",
                    admitted, options_.max_queued_bytes));
  }
  if (bytes > backend_->MaxJobBytes()) {
    return status::OverLimit(
        "device_memory",
        fmt::format("the GEMM needs {} bytes of operands and result; this server takes at most "
                    "{} per GEMM",
                    bytes, backend_->MaxJobBytes()));
  }
  return absl::OkStatus();
}

int Scheduler::LeastLoadedDevice() const {
  std::lock_guard<std::mutex> lock(mu_);
  return LeastLoadedDeviceLocked();
}

int Scheduler::LeastLoadedDeviceLocked() const {
  std::vector<double> loads;
  bool any_healthy = false;
  for (size_t d = 0; d < devices_.size(); ++d) {
    const bool healthy = backend_->DeviceHealthy(int(d));
    any_healthy = any_healthy || healthy;
    // A failed device takes no new work while another one can.
    loads.push_back(healthy ? double(devices_[d].entries.size() + devices_[d].running) /
                                  std::max(devices_[d].slots, 1)
                            : std::numeric_limits<double>::infinity());
  }
  if (!any_healthy) return 0;
  return PickLeastLoaded(loads);
}

absl::Status Scheduler::Enqueue(GemmJob job, GemmDone done) {
  const ResidentOperandFlags resident = ResidentOperandFlags::Of(job);
  if (absl::Status s = CheckSize(job.shape, resident); !s.ok()) return s;
  const int64_t bytes = AdmittedBytes(job.shape, resident);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return status::ShuttingDown();
    if (queued_ >= options_.max_queued_requests) {
      return status::QueueFull(fmt::format("queue full: {} GEMMs waiting", queued_));
    }
    const auto owner = queued_by_owner_.find(job.owner);
    const int64_t owner_queued = owner != queued_by_owner_.end() ? owner->second : 0;
    if (options_.max_queued_per_owner > 0 && owner_queued >= options_.max_queued_per_owner) {
      return status::QueueFull(
          fmt::format("queue full for this client: {} of its GEMMs waiting, its whole share "
                      "(--max_queued_per_client)",
                      owner_queued));
    }
    if (admitted_bytes_ + bytes > options_.max_queued_bytes) {
      return status::QueueFull(fmt::format("queue full: {} of {} bytes admitted", admitted_bytes_,
                                           options_.max_queued_bytes));
    }
    const int placed = PlaceLocked(job);
    if (!backend_->DeviceHealthy(placed)) return DeviceFailed(placed);
    DeviceQueue& device = devices_[placed];
    device.entries.push_back({std::move(job), std::move(done), Clock::now()});
    device.waiting.store(int64_t(device.entries.size()), std::memory_order_release);
    queued_++;
    queued_by_owner_[device.entries.back().job.owner]++;
    admitted_total_++;
    admitted_bytes_ += bytes;
    device.work_available.notify_one();
    if (device.gathering > 0) device.member_arrived.notify_all();
  }
  return absl::OkStatus();
}

int Scheduler::PlaceLocked(const GemmJob& job) const {
  if (job.device_index < 0) return LeastLoadedDeviceLocked();
  const DeviceQueue& home = devices_[job.device_index];
  if (!options_.copy_resident_to_idle_device || job.stay_on_device ||
      int64_t(home.entries.size()) + home.running < home.slots) {
    return job.device_index;
  }
  // Home is saturated: an idle device is quicker, even after copying the operands over.
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (devices_[d].entries.empty() && devices_[d].running == 0 &&
        backend_->DeviceHealthy(int(d))) {
      return int(d);
    }
  }
  return job.device_index;
}

void Scheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (DeviceQueue& d : devices_) {
      d.work_available.notify_all();
      d.member_arrived.notify_all();
    }
  }
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

Scheduler::Stats Scheduler::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats stats{.queued = queued_,
              .admitted_bytes = admitted_bytes_,
              .admitted_total = admitted_total_,
              .completed_total = completed_total_};
  for (const DeviceQueue& d : devices_) stats.running += d.running;
  return stats;
}

std::vector<Scheduler::VerifyStats> Scheduler::GetVerifyStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return verify_stats_;
}

Scheduler::BatchStats Scheduler::GetBatchStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batch_stats_;
}

void Scheduler::WorkerLoop(int slot) {
  NameThisThread(fmt::format("hgemm-slot{}", slot));
  DeviceQueue& device = devices_[backend_->SlotDevice(slot)];
  while (true) {
    std::vector<Entry> batch;  // the entry taken first, then those that joined it
    SpinForWork(device);
    {
      std::unique_lock<std::mutex> lock(mu_);
      device.work_available.wait(lock, [&] { return stopping_ || !device.entries.empty(); });
      if (device.entries.empty()) return;  // stopping, and nothing left to drain
      batch.push_back(TakeLocked(device, device.entries.begin()));
      if (Batchable(batch.front().job)) GatherLocked(device, lock, &batch);
    }
    if (batch.size() > 1) {
      RunBatch(slot, &batch);
      continue;
    }
    GemmReport report;
    const absl::Status result = RunEntry(slot, batch.front(), &report);
    Finish(slot, batch.front(), result, std::move(report));
  }
}

Scheduler::Entry Scheduler::TakeLocked(DeviceQueue& device, std::deque<Entry>::iterator at) {
  Entry entry = std::move(*at);
  device.entries.erase(at);
  device.waiting.store(int64_t(device.entries.size()), std::memory_order_relaxed);
  queued_--;
  if (auto owner = queued_by_owner_.find(entry.job.owner); --owner->second == 0) {
    queued_by_owner_.erase(owner);
  }
  device.running++;
  return entry;
}

bool Scheduler::Batchable(const GemmJob& job) const {
  return options_.batching && job.b_resident && !job.shape.Grouped() && job.shape.batch == 1;
}

bool Scheduler::SameBatch(const GemmJob& first, const GemmJob& member) const {
  const GemmShape& f = first.shape;
  const GemmShape& m = member.shape;
  return Batchable(member) && member.owner == first.owner &&
         member.b_resident == first.b_resident && m.n == f.n && m.k == f.k &&
         m.ab_type == f.ab_type && m.c_type == f.c_type && m.c_input == f.c_input &&
         member.transpose_a == first.transpose_a && member.transpose_b == first.transpose_b &&
         member.kernel == first.kernel && member.accumulation == first.accumulation &&
         member.alpha == first.alpha && member.beta == first.beta &&
         CheckRepetitions(member) == CheckRepetitions(first);
}

void Scheduler::GatherLocked(DeviceQueue& device, std::unique_lock<std::mutex>& lock,
                             std::vector<Entry>* batch) {
  GemmShape stacked = batch->front().job.shape;  // the batch's GEMM as it grows
  auto take_joiners = [&] {
    for (auto it = device.entries.begin();
         it != device.entries.end() && stacked.m < options_.max_batch_rows;) {
      GemmShape grown = stacked;
      grown.m += it->job.shape.m;
      // batch->front() is read anew: the vector moves as it grows.
      if (!SameBatch(batch->front().job, it->job) || grown.m > options_.max_batch_rows ||
          !CheckSize(grown, ResidentOperandFlags::Of(batch->front().job)).ok()) {
        ++it;
        continue;
      }
      stacked = grown;
      const auto offset = it - device.entries.begin();
      batch->push_back(TakeLocked(device, it));
      it = device.entries.begin() + offset;
    }
  };
  take_joiners();
  if (options_.batch_window.count() <= 0) return;
  const auto until = batch->front().admitted + options_.batch_window;
  device.gathering++;
  while (!stopping_ && stacked.m < options_.max_batch_rows &&
         device.member_arrived.wait_until(lock, until) == std::cv_status::no_timeout) {
    take_joiners();
  }
  device.gathering--;
  take_joiners();  // whatever came with the window's end
}

void Scheduler::SpinForWork(const DeviceQueue& device) const {
  if (options_.idle_spin.count() <= 0) return;
  const auto until = Clock::now() + options_.idle_spin;
  while (device.waiting.load(std::memory_order_acquire) == 0 && Clock::now() < until) {
    std::this_thread::yield();
  }
}

absl::Status Scheduler::DeviceFailed(int device_index) const {
  return status::DeviceFailed(
      fmt::format("device {} has failed (a sticky CUDA error); the server must restart",
                  backend_->Devices()[device_index].id));
}

absl::Status Scheduler::Refusal(int slot, const Entry& entry, Clock::time_point started,
                                double queue_wait_ms) const {
  const GemmJob& job = entry.job;
  const int device_index = backend_->SlotDevice(slot);
  if (job.is_cancelled && job.is_cancelled()) return status::Cancelled();
  // It failed while the job was queued.
  if (!backend_->DeviceHealthy(device_index)) return DeviceFailed(device_index);
  if (started > job.deadline) return status::DeadlineExpired(queue_wait_ms);
  return absl::OkStatus();
}

absl::Status Scheduler::RunEntry(int slot, const Entry& entry, GemmReport* out) {
  const auto started = Clock::now();
  GemmReport report;
  report.queue_wait_ms =
      std::chrono::duration<double, std::milli>(started - entry.admitted).count();
  absl::Status result = Refusal(slot, entry, started, report.queue_wait_ms);
  if (result.ok()) result = RunVerified(slot, entry.job, &report);
  *out = std::move(report);
  return result;
}

void Scheduler::RunBatch(int slot, std::vector<Entry>* batch) {
  const auto started = Clock::now();
  auto queue_wait_ms = [&](const Entry& entry) {
    return std::chrono::duration<double, std::milli>(started - entry.admitted).count();
  };
  // Members refused now are answered before the launch, as alone.
  std::vector<Entry*> members;
  for (Entry& entry : *batch) {
    GemmReport report;
    report.queue_wait_ms = queue_wait_ms(entry);
    if (absl::Status s = Refusal(slot, entry, started, report.queue_wait_ms); !s.ok()) {
      Finish(slot, entry, s, std::move(report));
    } else {
      members.push_back(&entry);
    }
  }
  if (members.empty()) return;
  if (members.size() == 1) {
    GemmReport report;
    report.queue_wait_ms = queue_wait_ms(*members.front());
    const absl::Status result = RunVerified(slot, members.front()->job, &report);
    Finish(slot, *members.front(), result, std::move(report));
    return;
  }
  // The members as the backend runs them: checked as RunVerified checks a job alone.
  std::vector<GemmJob> jobs;
  std::vector<const GemmJob*> launched;
  jobs.reserve(members.size());
  int64_t rows = 0;
  for (const Entry* entry : members) {
    jobs.push_back(entry->job);
    jobs.back().verify_repetitions = CheckRepetitions(entry->job);
    launched.push_back(&jobs.back());
    rows += entry->job.shape.m;
  }
  const int device = backend_->SlotDevice(slot);
  std::vector<GemmReport> reports(members.size());
  std::vector<absl::Status> results;
  {
    std::lock_guard<std::mutex> lock(*slot_mu_[slot]);
    try {
      results = backend_->RunBatch(slot, launched, &reports);
    } catch (...) {
      results.assign(members.size(), status::FromCurrentException("batched GEMM"));
    }
  }
  const bool checked = jobs.front().verify_repetitions > 0;
  const std::string check_failure = reports.front().verify_failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_stats_.batches++;
    batch_stats_.by_members[int64_t(members.size())]++;
    batch_stats_.by_rows[rows]++;
    if (checked && check_failure.empty()) {
      for (const absl::Status& s : results) verify_stats_[device].verified += s.ok() ? 1 : 0;
    }
  }
  if (!check_failure.empty()) {
    const std::string failure =
        fmt::format("device {} stream {}: a batch of {} GEMMs: {}", reports.front().device_id,
                    reports.front().stream_id, members.size(), check_failure);
    logging::Log(
        spdlog::level::err,
        "batched gemm C failed its Freivalds check; rerunning its members alone: " + failure,
        {{"request_id", jobs.front().request_id}});
    CountVerifyFailure(device, failure);
  }
  // The members the launch answered first, then the others, each rerun alone.
  std::vector<Entry*> rerun;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!results[i].ok() || !reports[i].verify_failure.empty()) {
      rerun.push_back(members[i]);
      continue;
    }
    reports[i].queue_wait_ms = queue_wait_ms(*members[i]);
    Finish(slot, *members[i], results[i], std::move(reports[i]));
  }
  for (Entry* entry : rerun) {
    GemmReport report;
    report.queue_wait_ms = queue_wait_ms(*entry);
    const absl::Status result = RunVerified(slot, entry->job, &report);
    Finish(slot, *entry, result, std::move(report));
  }
}

void Scheduler::Finish(int slot, Entry& entry, const absl::Status& result, GemmReport report) {
  const GemmJob& job = entry.job;
  report.server_total_ms = MillisecondsSince(entry.admitted);
  if (spdlog::should_log(spdlog::level::debug)) {  // the message costs a format per GEMM
    logging::Log(
        spdlog::level::debug,
        fmt::format("gemm {} kernel={} slot={} batch={} status={} queue={:.3f}ms "
                    "kernel={:.3f}ms total={:.3f}ms",
                    job.shape.Grouped()
                        ? fmt::format("group of {}", job.shape.group.size())
                        : fmt::format("{}x{}x{}", job.shape.m, job.shape.n, job.shape.k),
                    report.kernel, slot, report.batch_size, status::CodeName(result.code()),
                    report.queue_wait_ms, report.kernel_ms, report.server_total_ms),
        {{"request_id", job.request_id}, {"traceparent", job.traceparent}});
  }
  {
    // Before `done`: whoever sees the answer sees the load without this job.
    std::lock_guard<std::mutex> lock(mu_);
    devices_[backend_->SlotDevice(slot)].running--;
    completed_total_++;
    admitted_bytes_ -= AdmittedBytes(job.shape, ResidentOperandFlags::Of(job));
  }
  try {
    entry.done(result, report);
  } catch (...) {  // a transport bug; the worker must live on for the other jobs
    status::LogCurrentException("GEMM completion");
  }
}

absl::Status Scheduler::RunOnSlot(int slot, const GemmJob& job, GemmReport* report) {
  std::lock_guard<std::mutex> lock(*slot_mu_[slot]);
  try {
    return backend_->Run(slot, job, report);
  } catch (...) {
    return status::FromCurrentException("GEMM");
  }
}

namespace {

// Where C_in lies when it is C's own memory (an in-place GEMM: C_in's region or resident
// matrix is C's), else null: the first run overwrites it, and a rerun needs it.
const char* CInInsideC(const GemmJob& job) {
  if (!job.shape.c_input || job.keep_c) return nullptr;
  const auto* c_in =
      static_cast<const char*>(job.c_in_resident ? job.c_in_resident->data : job.c_in);
  const auto* c = static_cast<const char*>(job.c_device ? job.c_device->data : job.c);
  const int64_t bytes = job.shape.CBytes();
  if (c_in == nullptr || c == nullptr) return nullptr;
  return c_in < c + bytes && c < c_in + bytes ? c_in : nullptr;
}

}  // namespace

int Scheduler::CheckRepetitions(const GemmJob& job) const {
  // A count without `verify` asks for nothing.
  if (!job.verify && !options_.verify_all) return 0;
  int repetitions =
      job.verify_repetitions > 0 ? job.verify_repetitions : options_.verify_repetitions;
  if (options_.verify_all) repetitions = std::max(repetitions, options_.verify_repetitions);
  return std::max(repetitions, 1);
}

absl::Status Scheduler::RunVerified(int slot, const GemmJob& original, GemmReport* report) {
  const int repetitions = CheckRepetitions(original);
  if (repetitions == 0) {
    if (original.verify_repetitions == 0) return RunOnSlot(slot, original, report);
    GemmJob unchecked = original;
    unchecked.verify_repetitions = 0;
    return RunOnSlot(slot, unchecked, report);
  }
  GemmJob job = original;
  job.verify_repetitions = repetitions;
  job.c_progress = nullptr;  // no byte of C may leave before it has passed
  // An in-place C_in, kept for the rerun (a copy only when the job is in place).
  std::vector<char> c_in_copy;
  if (CInInsideC(job) != nullptr) {
    c_in_copy.resize(job.shape.CInBytes());
    if (job.c_in_resident) {
      if (absl::Status s = backend_->ReadResidentRange(*job.c_in_resident, 0,
                                                       int64_t(c_in_copy.size()), c_in_copy.data());
          !s.ok()) {
        return s;
      }
    } else {
      std::memcpy(c_in_copy.data(), job.c_in, c_in_copy.size());
    }
  }
  const int device = backend_->SlotDevice(slot);
  if (absl::Status s = RunOnSlot(slot, job, report); !s.ok()) return s;
  if (report->verify_failure.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    verify_stats_[device].verified++;
    return absl::OkStatus();
  }
  const std::string first_failure = fmt::format("device {} stream {}: {}", report->device_id,
                                                report->stream_id, report->verify_failure);
  logging::Log(spdlog::level::err, "gemm C failed its Freivalds check; rerunning: " + first_failure,
               {{"request_id", job.request_id}, {"traceparent", job.traceparent}});
  CountVerifyFailure(device, first_failure);
  if (!c_in_copy.empty()) {
    job.c_in = c_in_copy.data();
    job.c_in_resident.reset();
    job.pinned.c_in = false;
  }
  const int rerun_slot = PickRerunSlot(slot, job);
  const int rerun_device = backend_->SlotDevice(rerun_slot);
  GemmReport rerun;
  absl::Status s = backend_->DeviceHealthy(rerun_device) ? RunOnSlot(rerun_slot, job, &rerun)
                                                         : DeviceFailed(rerun_device);
  rerun.verify_ms += report->verify_ms;
  report->c_resident.reset();  // the first run's kept C failed: back to the backend
  {
    std::lock_guard<std::mutex> lock(mu_);
    verify_stats_[rerun_device].reruns++;
    if (s.ok() && rerun.verify_failure.empty()) {
      verify_stats_[rerun_device].verified++;
      verify_stats_[device].suspect++;
    }
  }
  if (!s.ok()) {
    *report = std::move(rerun);
    return status::WithContext(
        "the rerun of a GEMM whose C failed its Freivalds check (" + first_failure + ")", s);
  }
  if (rerun.verify_failure.empty()) {
    logging::Log(spdlog::level::warn,
                 fmt::format("gemm rerun on device {} stream {} passed its Freivalds check; "
                             "device {} is suspect",
                             rerun.device_id, rerun.stream_id, report->device_id),
                 {{"request_id", job.request_id}, {"traceparent", job.traceparent}});
    rerun.suspect_device_id = backend_->Devices()[device].id;
    *report = std::move(rerun);
    return absl::OkStatus();
  }
  const std::string second_failure = fmt::format("device {} stream {}: {}", rerun.device_id,
                                                 rerun.stream_id, rerun.verify_failure);
  CountVerifyFailure(rerun_device, second_failure);
  rerun.c_resident.reset();
  *report = std::move(rerun);
  return status::VerifyFailed(fmt::format(
      "C failed its Freivalds check (server/verify) on its run ({}) and on its rerun ({}); no "
      "C is returned",
      first_failure, second_failure));
}

int Scheduler::PickRerunSlot(int failed_slot, const GemmJob& job) {
  const int failed_device = backend_->SlotDevice(failed_slot);
  std::vector<int> candidates;  // best first
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!job.stay_on_device) {
      std::vector<std::pair<double, int>> others;  // (load, device)
      for (int d = 0; d < int(devices_.size()); ++d) {
        if (d == failed_device || !backend_->DeviceHealthy(d)) continue;
        others.push_back({double(devices_[d].entries.size() + devices_[d].running) /
                              std::max(devices_[d].slots, 1),
                          d});
      }
      std::sort(others.begin(), others.end());
      for (const auto& [load, d] : others) {
        for (int s = 0; s < backend_->NumSlots(); ++s) {
          if (backend_->SlotDevice(s) == d) candidates.push_back(s);
        }
      }
    }
  }
  for (int s = 0; s < backend_->NumSlots(); ++s) {
    if (s != failed_slot && backend_->SlotDevice(s) == failed_device) candidates.push_back(s);
  }
  if (candidates.empty()) return failed_slot;
  for (int s : candidates) {  // an idle slot runs it now
    if (slot_mu_[s]->try_lock()) {
      slot_mu_[s]->unlock();
      return s;
    }
  }
  return candidates.front();
}

void Scheduler::CountVerifyFailure(int device, const std::string& failure) {
  int64_t failures = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failures = ++verify_stats_[device].failures;
  }
  const int limit = options_.verify_failures_to_retire;
  if (limit > 0 && failures >= limit && backend_->DeviceHealthy(device)) {
    backend_->TakeOutOfService(device, fmt::format("{} of its GEMMs failed their Freivalds check "
                                                   "(--verify_failures_to_retire={}); the last: {}",
                                                   failures, limit, failure));
  }
}

}  // namespace hgemm
