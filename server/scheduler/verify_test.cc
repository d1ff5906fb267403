// Verified GEMMs through the scheduler on the CPU backend, with the tests' fault injector
// corrupting C between the GEMM and its check (CpuBackendOptions::after_gemm): correct GEMMs
// pass, a corrupted run is rerun on another slot and answered right, two corrupted runs are
// DATA_LOSS, and a device that keeps failing is taken out of service.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/backend/cpu_backend.h"
#include "server/scheduler/scheduler.h"
#include "server/testing/c_faults.h"
#include "server/testing/forwarding_backend.h"
#include "server/testing/run_job.h"

namespace hgemm {
namespace {

// The CPU backend's slots presented as `devices` devices of one slot each, each with its own
// health, so that a rerun can go to "another device". Its injector corrupts C (`fault`) on the
// devices in `faulty` (a bit per device) for the next `budget` runs there (-1: every run).
class FaultyDevices final : public ForwardingBackend {
 public:
  explicit FaultyDevices(int devices)
      : ForwardingBackend(
            MakeCpuBackend({.workers = devices,
                            .after_gemm = [this](int slot, const GemmJob& job,
                                                 void* c) { Inject(slot, job, c); }})),
        devices_(devices) {}

  std::vector<DeviceDescription> Devices() const override {
    std::vector<DeviceDescription> out;
    for (int d = 0; d < devices_; ++d) out.push_back({.id = d, .name = "cpu", .slots = 1});
    return out;
  }
  int SlotDevice(int slot) const override { return slot; }
  bool DeviceHealthy(int d) const override { return !out_of_service_[d]; }
  void TakeOutOfService(int d, const std::string&) override { out_of_service_[d] = true; }
  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    absl::Status s = ForwardingBackend::Run(slot, job, report);
    report->device_id = slot;
    return s;
  }

  void Corrupt(unsigned faulty_devices, CFault fault, int budget = -1) {
    std::lock_guard<std::mutex> lock(mu_);
    faulty_ = faulty_devices;
    fault_ = fault;
    budget_ = budget;
  }
  int injected() const { return injected_; }

 private:
  void Inject(int slot, const GemmJob& job, void* c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if ((faulty_ & (1u << slot)) == 0 || budget_ == 0) return;
      if (budget_ > 0) budget_--;
    }
    injected_++;
    CorruptC(fault_, job.shape.c_type, job.shape.n, c, job.shape.m / 2, job.shape.n / 3);
  }

  const int devices_;
  std::atomic<bool> out_of_service_[4] = {};
  std::atomic<int> injected_{0};
  std::mutex mu_;
  unsigned faulty_ = 0;                // guarded by mu_
  CFault fault_ = CFault::kRowZeroed;  // guarded by mu_
  int budget_ = -1;                    // guarded by mu_
};

// A GEMM with fresh random operands, its C buffer poisoned, and its fp32 reference.
struct TestGemm {
  GemmJob job;
  std::vector<uint16_t> a, b;
  std::vector<char> c_in, c;
  std::vector<float> reference;

  TestGemm(int64_t m, int64_t n, int64_t k, std::mt19937_64& rng, const GemmForm& form = {},
           float alpha = 1, float beta = 0) {
    a = RandomHalfMatrix(m * k, rng, form.bf16);
    b = RandomHalfMatrix(k * n, rng, form.bf16);
    job.shape = {.m = m,
                 .n = n,
                 .k = k,
                 .ab_type = form.bf16 ? ElementType::kBf16 : ElementType::kFp16,
                 .c_type = form.c_fp32 ? ElementType::kFp32
                           : form.bf16 ? ElementType::kBf16
                                       : ElementType::kFp16,
                 .c_input = beta != 0};
    const int64_t c_bytes = job.shape.CBytes();
    if (beta != 0) {  // C_in: random values of C's type (fp32: random halves as fp32 pairs)
      std::vector<uint16_t> halves = RandomHalfMatrix(m * n, rng, form.bf16);
      c_in.resize(c_bytes);
      if (form.c_fp32) {
        std::vector<float> floats(m * n);
        for (int64_t i = 0; i < m * n; ++i) floats[i] = float(int(halves[i] % 2001) - 1000) / 1000;
        std::memcpy(c_in.data(), floats.data(), c_bytes);
      } else {
        std::memcpy(c_in.data(), halves.data(), c_bytes);
      }
    }
    c.assign(c_bytes, char(0x7E));
    job.transpose_a = form.transpose_a;
    job.transpose_b = form.transpose_b;
    job.a = a.data();
    job.b = b.data();
    job.c = c.data();
    job.alpha = alpha;
    job.beta = beta;
    job.c_in = c_in.empty() ? nullptr : c_in.data();
    job.verify = true;
    job.verify_repetitions = 2;
    reference = ReferenceGemm(a.data(), b.data(), m, n, k, form,
                              {.alpha = alpha, .beta = beta, .c_in = job.c_in});
    this->form = form;
  }
  // The relative Frobenius error of C against the reference.
  double Error() const {
    return CompareToReference(c.data(), reference.data(), int64_t(reference.size()), form)
        .rel_frobenius;
  }
  GemmForm form;
};

TEST(Verify, CorrectGemmsOfEveryFormPass) {
  FaultyDevices backend(2);
  Scheduler scheduler(&backend, {});
  std::mt19937_64 rng(11);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool bf16 : {false, true}) {
        for (bool c_fp32 : {false, true}) {
          for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -1.25f}}) {
            const GemmForm form{
                .transpose_a = ta, .transpose_b = tb, .bf16 = bf16, .c_fp32 = c_fp32};
            TestGemm g(33, 47, 300, rng, form, alpha, beta);
            const JobAnswer answer = RunJob(scheduler, g.job);
            ASSERT_TRUE(answer.status.ok()) << answer.status;
            EXPECT_EQ(answer.report.verified_repetitions, 2);
            EXPECT_EQ(answer.report.verify_failure, "");
            EXPECT_FALSE(answer.report.suspect_device_id.has_value());
            EXPECT_LT(g.Error(), ServiceTolerance(false, form));
          }
        }
      }
    }
  }
  const auto stats = scheduler.GetVerifyStats();
  EXPECT_EQ(stats[0].verified + stats[1].verified, 32);
  EXPECT_EQ(stats[0].failures + stats[1].failures, 0);
}

TEST(Verify, TheServerDefaultChecksEveryGemm) {
  FaultyDevices backend(1);
  Scheduler scheduler(
      &backend, {.verify_all = true, .verify_repetitions = 3, .verify_failures_to_retire = 0});
  std::mt19937_64 rng(12);
  TestGemm g(16, 16, 64, rng);
  g.job.verify = false;
  g.job.verify_repetitions = 0;
  const JobAnswer answer = RunJob(scheduler, g.job);
  ASSERT_TRUE(answer.status.ok()) << answer.status;
  EXPECT_EQ(answer.report.verified_repetitions, 3);
}

TEST(Verify, AJobThatDoesNotAskIsNotChecked) {
  FaultyDevices backend(1);
  Scheduler scheduler(&backend, {});
  std::mt19937_64 rng(18);
  TestGemm g(16, 16, 64, rng);
  g.job.verify = false;  // a repetition count alone asks for nothing
  const JobAnswer answer = RunJob(scheduler, g.job);
  ASSERT_TRUE(answer.status.ok()) << answer.status;
  EXPECT_EQ(answer.report.verified_repetitions, 0);
  EXPECT_EQ(answer.report.verify_ms, 0);
}

TEST(Verify, ACorruptedRunIsRerunOnAnotherDeviceAndAnsweredRight) {
  std::mt19937_64 rng(13);
  for (CFault fault : {CFault::kExponentBit, CFault::kLargeError, CFault::kRowZeroed}) {
    FaultyDevices backend(2);
    Scheduler scheduler(&backend, {.verify_failures_to_retire = 0});
    backend.Corrupt(/*device 0*/ 1, fault);
    TestGemm g(24, 40, 128, rng);
    g.job.device_index = 0;
    g.job.verify_repetitions = 4;  // one element's fault: caught for certain (c_faults.h)
    const JobAnswer answer = RunJob(scheduler, g.job);
    ASSERT_TRUE(answer.status.ok()) << CFaultName(fault) << ": " << answer.status;
    EXPECT_EQ(answer.report.device_id, 1);
    EXPECT_EQ(answer.report.suspect_device_id, 0);
    EXPECT_EQ(answer.report.verify_failure, "");
    EXPECT_LT(g.Error(), ServiceTolerance(false, g.form)) << CFaultName(fault);
    const auto stats = scheduler.GetVerifyStats();
    EXPECT_EQ(stats[0].failures, 1);
    EXPECT_EQ(stats[0].suspect, 1);
    EXPECT_EQ(stats[1].reruns, 1);
    EXPECT_EQ(stats[1].verified, 1);
  }
}

TEST(Verify, OneDeviceRerunsOnItsOtherSlot) {
  // The CPU backend as it is: one device, two slots.
  std::atomic<int> corrupted{0};
  auto backend =
      MakeCpuBackend({.workers = 2, .after_gemm = [&](int, const GemmJob& job, void* c) {
                        if (corrupted++ == 0)
                          CorruptC(CFault::kRowZeroed, job.shape.c_type, job.shape.n, c, 1, 0);
                      }});
  Scheduler scheduler(backend.get(), {});
  std::mt19937_64 rng(14);
  TestGemm g(8, 8, 32, rng);
  const JobAnswer answer = RunJob(scheduler, g.job);
  ASSERT_TRUE(answer.status.ok()) << answer.status;
  EXPECT_EQ(answer.report.suspect_device_id, -1);  // the CPU's id
  EXPECT_LT(g.Error(), ServiceTolerance(false, g.form));
  EXPECT_EQ(scheduler.GetVerifyStats()[0].reruns, 1);
}

TEST(Verify, BothRunsCorruptedIsDataLoss) {
  FaultyDevices backend(2);
  Scheduler scheduler(&backend, {.verify_failures_to_retire = 0});
  backend.Corrupt(/*both devices*/ 3, CFault::kRowZeroed);
  std::mt19937_64 rng(15);
  TestGemm g(24, 40, 128, rng);
  const JobAnswer answer = RunJob(scheduler, g.job);
  EXPECT_EQ(answer.status.code(), absl::StatusCode::kDataLoss) << answer.status;
  EXPECT_NE(answer.status.message().find("Freivalds"), std::string::npos) << answer.status;
  EXPECT_EQ(backend.injected(), 2);
}

TEST(Verify, InPlaceGemmIsRerunFromItsOriginalCIn) {
  // C_in is C's own memory: the failed first run overwrote it; the rerun starts from a copy.
  FaultyDevices backend(2);
  Scheduler scheduler(&backend, {.verify_failures_to_retire = 0});
  backend.Corrupt(/*device 0*/ 1, CFault::kRowZeroed, /*budget=*/1);
  std::mt19937_64 rng(16);
  TestGemm g(20, 30, 64, rng, {}, 1.0f, 0.75f);
  g.c = g.c_in;
  g.job.c = g.c.data();
  g.job.c_in = g.c.data();
  g.job.device_index = 0;
  const JobAnswer answer = RunJob(scheduler, g.job);
  ASSERT_TRUE(answer.status.ok()) << answer.status;
  EXPECT_EQ(answer.report.suspect_device_id, 0);
  EXPECT_LT(g.Error(), ServiceTolerance(false, g.form));
}

TEST(Verify, ADeviceThatKeepsFailingIsTakenOutOfService) {
  FaultyDevices backend(2);
  Scheduler scheduler(&backend, {.verify_failures_to_retire = 2});
  backend.Corrupt(/*device 0*/ 1, CFault::kRowZeroed);
  std::mt19937_64 rng(17);
  int answered = 0;
  while (backend.DeviceHealthy(0) && answered < 200) {
    TestGemm g(16, 64, 64, rng);
    g.job.device_index = 0;
    const JobAnswer answer = RunJob(scheduler, g.job);
    ++answered;
    if (!answer.status.ok()) {
      // Placed on device 0 after it left service: refused, never a wrong C.
      EXPECT_EQ(answer.status.code(), absl::StatusCode::kUnavailable) << answer.status;
      continue;
    }
    EXPECT_LT(g.Error(), ServiceTolerance(false, g.form));
  }
  EXPECT_FALSE(backend.DeviceHealthy(0));
  EXPECT_TRUE(backend.DeviceHealthy(1));
  EXPECT_EQ(scheduler.GetVerifyStats()[0].failures, 2);
  // Work goes to the healthy device now.
  TestGemm g(16, 16, 16, rng);
  const JobAnswer answer = RunJob(scheduler, g.job);
  ASSERT_TRUE(answer.status.ok()) << answer.status;
  EXPECT_EQ(answer.report.device_id, 1);
}

}  // namespace
}  // namespace hgemm
