#include "server/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <string>

namespace hgemm {
namespace {

// A backend whose Run blocks until released, and records which device each job ran on. A device
// can be failed (as a sticky CUDA error does): Run on it then answers UNAVAILABLE, as the CUDA
// backend's does, and counts it.
class GatedBackend final : public Backend {
 public:
  GatedBackend(int devices, int slots_per_device) : devices_(devices), slots_(slots_per_device) {}

  std::string Name() const override { return "gated"; }
  std::vector<DeviceDescription> Devices() const override {
    std::vector<DeviceDescription> out;
    for (int d = 0; d < devices_; ++d) out.push_back({.id = d, .name = "fake", .slots = slots_});
    return out;
  }
  std::vector<KernelDescription> Kernels() const override { return {}; }
  int NumSlots() const override { return devices_ * slots_; }
  int SlotDevice(int slot) const override { return slot / slots_; }
  int64_t MaxJobBytes() const override { return 1 << 20; }
  absl::Status AllocateResident(int, int64_t, std::shared_ptr<ResidentBuffer>*) override {
    return absl::Status(absl::StatusCode::kUnimplemented, "");
  }
  absl::Status WriteResident(ResidentBuffer&, int64_t, const void*, int64_t) override {
    return absl::OkStatus();
  }
  absl::Status ReadResident(const ResidentBuffer&, void*) override { return absl::OkStatus(); }

  bool DeviceHealthy(int device_index) const override { return !failed_[device_index]; }
  void FailDevice(int device_index) { failed_[device_index] = true; }
  int runs_on_failed() const { return runs_on_failed_; }

  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    if (failed_[SlotDevice(slot)]) {
      runs_on_failed_++;
      return absl::UnavailableError("failed");
    }
    std::unique_lock<std::mutex> lock(mu_);
    running_++;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    running_--;
    report->device_id = SlotDevice(slot);
    report->kernel = "gated";
    return absl::OkStatus();
  }

  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  void WaitRunning(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return running_ == n; });
  }

 private:
  const int devices_, slots_;
  std::atomic<bool> failed_[4] = {};
  std::atomic<int> runs_on_failed_{0};
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = false;
  int running_ = 0;
};

GemmJob Job(int64_t m = 8) {
  GemmJob job;
  job.shape = {.m = m, .n = 8, .k = 8};
  return job;
}

// Collects completions.
struct Results {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<absl::StatusCode, GemmReport>> done;

  GemmDone Callback() {
    return [this](const absl::Status& s, const GemmReport& r) {
      std::lock_guard<std::mutex> lock(mu);
      done.emplace_back(s.code(), r);
      cv.notify_all();
    };
  }
  void WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done.size() >= n; });
  }
};

TEST(PickLeastLoaded, PicksSmallestAndBreaksTiesLow) {
  EXPECT_EQ(PickLeastLoaded({3, 1, 2}), 1);
  EXPECT_EQ(PickLeastLoaded({1, 1, 0.5, 0.5}), 2);
  EXPECT_EQ(PickLeastLoaded({0}), 0);
}

TEST(Scheduler, RunsJobsAndReportsQueueWait) {
  GatedBackend backend(1, 2);
  Scheduler scheduler(&backend, {});
  Results results;
  backend.Open();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  results.WaitFor(5);
  for (auto& [code, report] : results.done) {
    EXPECT_EQ(code, absl::StatusCode::kOk);
    EXPECT_EQ(report.kernel, "gated");
    EXPECT_GE(report.server_total_ms, report.queue_wait_ms);
  }
}

// The kernel shows each slot's worker by name (top -H, /proc/PID/task/TID/comm).
TEST(Scheduler, WorkersAreNamedBySlot) {
  GatedBackend backend(1, 2);
  Scheduler scheduler(&backend, {});
  Results results;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  backend.WaitRunning(2);  // both workers run a job: each has named itself
  std::multiset<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.insert(name);
  }
  backend.Open();
  results.WaitFor(2);
  EXPECT_EQ(names.count("hgemm-slot0"), 1u);
  EXPECT_EQ(names.count("hgemm-slot1"), 1u);
}

TEST(Scheduler, FullQueueIsUnavailableAndRecovers) {
  GatedBackend backend(1, 1);
  Scheduler scheduler(&backend, {.max_queued_requests = 2});
  Results results;
  ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  backend.WaitRunning(1);  // one running, the queue empty
  ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  absl::Status full = scheduler.Enqueue(Job(), results.Callback());
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(full.message().find("queue full"), std::string::npos);
  backend.Open();
  results.WaitFor(3);
  EXPECT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  results.WaitFor(4);
}

GemmJob OwnedJob(const std::string& owner) {
  GemmJob job = Job();
  job.owner = owner;
  return job;
}

TEST(Scheduler, OneOwnerCannotTakeMoreThanItsShareOfTheQueue) {
  GatedBackend backend(1, 1);
  Scheduler scheduler(&backend, {.max_queued_requests = 8, .max_queued_per_owner = 2});
  Results results;
  ASSERT_TRUE(scheduler.Enqueue(OwnedJob("alice"), results.Callback()).ok());
  backend.WaitRunning(1);  // running: no longer queued, so not counted
  ASSERT_TRUE(scheduler.Enqueue(OwnedJob("alice"), results.Callback()).ok());
  ASSERT_TRUE(scheduler.Enqueue(OwnedJob("alice"), results.Callback()).ok());
  absl::Status over = scheduler.Enqueue(OwnedJob("alice"), results.Callback());
  EXPECT_EQ(over.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(over.message().find("--max_queued_per_client"), std::string::npos) << over.message();
  // The queue has room, and another owner has a share of its own.
  ASSERT_TRUE(scheduler.Enqueue(OwnedJob("bob"), results.Callback()).ok());
  ASSERT_TRUE(scheduler.Enqueue(OwnedJob("bob"), results.Callback()).ok());
  EXPECT_EQ(scheduler.Enqueue(OwnedJob("bob"), results.Callback()).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(scheduler.GetStats().queued, 4);
  backend.Open();
  results.WaitFor(5);
  // Their jobs have run: the shares are free again.
  EXPECT_TRUE(scheduler.Enqueue(OwnedJob("alice"), results.Callback()).ok());
  EXPECT_TRUE(scheduler.Enqueue(OwnedJob("bob"), results.Callback()).ok());
  results.WaitFor(7);
  for (auto& [code, report] : results.done) EXPECT_EQ(code, absl::StatusCode::kOk);

  // 0: no share; one owner may fill the whole queue.
  GatedBackend unshared_backend(1, 1);
  Scheduler unshared(&unshared_backend, {.max_queued_requests = 4, .max_queued_per_owner = 0});
  Results unshared_results;
  ASSERT_TRUE(unshared.Enqueue(OwnedJob("alice"), unshared_results.Callback()).ok());
  unshared_backend.WaitRunning(1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(unshared.Enqueue(OwnedJob("alice"), unshared_results.Callback()).ok()) << i;
  }
  absl::Status full = unshared.Enqueue(OwnedJob("bob"), unshared_results.Callback());
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(full.message().find("--max_queued_per_client"), std::string::npos) << full.message();
  unshared_backend.Open();
  unshared_results.WaitFor(5);
}

TEST(Scheduler, ByteBudget) {
  GatedBackend backend(1, 1);
  const int64_t one_job = Job().shape.Bytes();
  Scheduler scheduler(&backend, {.max_queued_bytes = 2 * one_job});
  Results results;
  // Larger than the whole budget: never admissible.
  EXPECT_EQ(scheduler.Enqueue(Job(64), results.Callback()).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  // Fits the budget, but not now.
  EXPECT_EQ(scheduler.Enqueue(Job(), results.Callback()).code(), absl::StatusCode::kUnavailable);
  backend.Open();
  results.WaitFor(2);
}

// Many GEMMs on one resident B: B's bytes are on the device once, not queued with each GEMM.
TEST(Scheduler, ResidentOperandsDoNotCountAgainstTheByteBudget) {
  GatedBackend backend(1, 1);
  const int64_t one_job = Job().shape.Bytes();  // A, B and C of 8×8: a third each
  // Unbatched: the gated backend has no memory behind its resident B to stack rows against.
  Scheduler scheduler(&backend, {.max_queued_bytes = 2 * one_job, .batching = false});
  auto b = std::make_shared<ResidentBuffer>(0, Job().shape.BBytes(), nullptr, [](void*) {});
  Results results;
  for (int i = 0; i < 3; ++i) {
    GemmJob job = Job();
    job.b_resident = b;
    ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok()) << i;
  }
  GemmJob sent = Job();  // B sent too: past the budget now
  EXPECT_EQ(scheduler.Enqueue(sent, results.Callback()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(scheduler.GetStats().admitted_bytes, 2 * one_job);
  backend.Open();
  results.WaitFor(3);
  EXPECT_EQ(scheduler.GetStats().admitted_bytes, 0);
}

// The size limit reads the queue budget as admission does: a GEMM larger than
// --max_queued_bytes only by its resident B is admitted; by what it brings, refused.
TEST(Scheduler, TheQueueSizeLimitLeavesResidentOperandsOut) {
  GatedBackend backend(1, 1);
  const GemmShape shape = Job().shape;
  Scheduler scheduler(&backend, {.max_queued_bytes = shape.Bytes() - 1, .batching = false});
  const absl::Status sent = scheduler.CheckSize(shape, {});
  EXPECT_EQ(sent.code(), absl::StatusCode::kResourceExhausted) << sent;
  EXPECT_NE(sent.message().find("--max_queued_bytes"), std::string::npos) << sent;
  EXPECT_TRUE(scheduler.CheckSize(shape, {.b = true}).ok());
  GemmJob job = Job();
  job.b_resident = std::make_shared<ResidentBuffer>(0, shape.BBytes(), nullptr, [](void*) {});
  Results results;
  ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok());
  EXPECT_EQ(scheduler.Enqueue(Job(), results.Callback()).code(),
            absl::StatusCode::kResourceExhausted);
  backend.Open();
  results.WaitFor(1);
}

TEST(Scheduler, LargerThanBackendTakesIsResourceExhausted) {
  GatedBackend backend(1, 1);
  Scheduler scheduler(&backend, {});
  GemmJob job;
  job.shape = {.m = 1024, .n = 1024, .k = 1024};  // 6 MiB > 1 MiB
  EXPECT_EQ(scheduler.Enqueue(job, [](auto&, auto&) {}).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(Scheduler, ExpiredDeadlineIsNotRun) {
  GatedBackend backend(1, 1);
  Scheduler scheduler(&backend, {});
  Results results;
  ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  backend.WaitRunning(1);
  GemmJob late = Job();
  late.deadline = Clock::now();  // passes while the first job holds the only slot
  ASSERT_TRUE(scheduler.Enqueue(late, results.Callback()).ok());
  backend.Open();
  results.WaitFor(2);
  EXPECT_EQ(results.done[1].first, absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(results.done[1].second.kernel.empty());  // never reached the backend
}

TEST(Scheduler, CancelledJobIsNotRun) {
  GatedBackend backend(1, 1);
  Scheduler scheduler(&backend, {});
  Results results;
  ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  backend.WaitRunning(1);
  std::atomic<bool> cancelled{false};
  GemmJob job = Job();
  job.is_cancelled = [&] { return cancelled.load(); };
  ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok());
  cancelled = true;
  backend.Open();
  results.WaitFor(2);
  EXPECT_EQ(results.done[1].first, absl::StatusCode::kCancelled);
  EXPECT_EQ(scheduler.GetStats().admitted_bytes, 0);
}

TEST(Scheduler, SpreadsJobsOverDevices) {
  GatedBackend backend(2, 2);
  Scheduler scheduler(&backend, {});
  Results results;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  backend.WaitRunning(4);  // every slot of both devices busy
  backend.Open();
  results.WaitFor(8);
  int per_device[2] = {0, 0};
  for (auto& [code, report] : results.done) per_device[report.device_id]++;
  EXPECT_EQ(per_device[0], 4);
  EXPECT_EQ(per_device[1], 4);
}

TEST(Scheduler, JobPinnedToADeviceRunsThere) {
  GatedBackend backend(2, 1);
  Scheduler scheduler(&backend, {});
  Results results;
  backend.Open();
  for (int i = 0; i < 6; ++i) {
    GemmJob job = Job();
    job.device_index = 1;  // e.g. its operands are resident there
    ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok());
  }
  results.WaitFor(6);
  for (auto& [code, report] : results.done) EXPECT_EQ(report.device_id, 1);
}

// Device 0 fails while a job runs on it and two wait: the waiting ones are answered
// UNAVAILABLE without reaching the backend, new jobs go to device 1, and jobs pinned to device
// 0 (their resident operands died with it) are refused.
TEST(Scheduler, FailedDeviceGetsNoWorkAndItsQueueIsRefused) {
  GatedBackend backend(2, 1);
  Scheduler scheduler(&backend, {});
  Results results;
  GemmJob pinned = Job();
  pinned.device_index = 0;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(scheduler.Enqueue(pinned, results.Callback()).ok());
  backend.WaitRunning(1);
  backend.FailDevice(0);
  backend.Open();  // the running job finishes (as if it had ended before the fault)
  results.WaitFor(3);
  EXPECT_EQ(results.done[0].first, absl::StatusCode::kOk);
  for (int i : {1, 2}) {
    EXPECT_EQ(results.done[i].first, absl::StatusCode::kUnavailable);
    EXPECT_TRUE(results.done[i].second.kernel.empty());
  }
  EXPECT_EQ(backend.runs_on_failed(), 0) << "queued jobs of a failed device reached the backend";
  absl::Status refused = scheduler.Enqueue(pinned, results.Callback());
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("device 0 has failed"), std::string::npos) << refused;
  EXPECT_EQ(scheduler.LeastLoadedDevice(), 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  results.WaitFor(7);
  for (int i = 3; i < 7; ++i) {
    EXPECT_EQ(results.done[i].first, absl::StatusCode::kOk);
    EXPECT_EQ(results.done[i].second.device_id, 1);
  }
  EXPECT_TRUE(backend.Healthy());
  EXPECT_EQ(backend.FailedDevices(), 1);
  EXPECT_EQ(scheduler.GetStats().admitted_bytes, 0);
}

TEST(Scheduler, EveryDeviceFailedRefusesEverything) {
  GatedBackend backend(2, 1);
  Scheduler scheduler(&backend, {});
  Results results;
  backend.FailDevice(0);
  backend.FailDevice(1);
  EXPECT_FALSE(backend.Healthy());
  EXPECT_EQ(scheduler.Enqueue(Job(), results.Callback()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(scheduler.GetStats().admitted_total, 0);
}

TEST(Scheduler, ResidentJobIsNotHandedToAFailedIdleDevice) {
  GatedBackend backend(2, 1);
  Scheduler scheduler(&backend, {.copy_resident_to_idle_device = true});
  Results results;
  GemmJob job = Job();
  job.device_index = 0;
  ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok());
  backend.WaitRunning(1);  // device 0 saturated, device 1 idle but failed
  backend.FailDevice(1);
  ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok());
  backend.Open();
  results.WaitFor(2);
  for (auto& [code, report] : results.done) {
    EXPECT_EQ(code, absl::StatusCode::kOk);
    EXPECT_EQ(report.device_id, 0);
  }
}

TEST(Scheduler, SaturatedHomeDeviceHandsResidentJobToAnIdleOneOnlyWhenAllowed) {
  for (bool allowed : {false, true}) {
    GatedBackend backend(2, 1);
    Scheduler scheduler(&backend, {.copy_resident_to_idle_device = allowed});
    Results results;
    GemmJob job = Job();
    job.device_index = 0;
    ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok());
    backend.WaitRunning(1);  // device 0's only slot is busy, device 1 idle
    ASSERT_TRUE(scheduler.Enqueue(job, results.Callback()).ok());
    if (allowed) backend.WaitRunning(2);
    backend.Open();
    results.WaitFor(2);
    EXPECT_EQ(results.done[0].second.device_id + results.done[1].second.device_id, allowed ? 1 : 0)
        << "allowed=" << allowed;
  }
}

TEST(Scheduler, ShutdownRunsAdmittedJobsThenRefuses) {
  GatedBackend backend(1, 1);
  Scheduler scheduler(&backend, {});
  Results results;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(scheduler.Enqueue(Job(), results.Callback()).ok());
  auto shutdown = std::async(std::launch::async, [&] { scheduler.Shutdown(); });
  backend.Open();
  shutdown.wait();
  EXPECT_EQ(results.done.size(), 3u);
  EXPECT_EQ(scheduler.Enqueue(Job(), results.Callback()).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hgemm
