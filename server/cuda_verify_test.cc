// Verified GEMMs on the GPU (skips without one): the CUDA backend's Freivalds check through the
// scheduler passes correct GEMMs of every form (fp16 accumulation and K = 65 536 included),
// and with the fault injector damaging C at the kernel's output (FaultInjector::
// ArmCorruptOutput) a damaged run is rerun and answered right, two are DATA_LOSS.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/backend/cuda_fault_kernel.h"
#include "server/backend/fault_injector.h"
#include "server/scheduler/scheduler.h"
#include "server/testing/run_job.h"

namespace hgemm {
namespace {

class CudaVerify : public ::testing::Test {
 protected:
  void SetUp() override {
    FaultInjector::Global().Reset();
    std::string error;
    backend_ = MakeFaultInjectingCudaBackend({.devices = {0}, .streams_per_device = 2}, &error);
    if (backend_ == nullptr) GTEST_SKIP() << "no usable GPU: " << error;
    scheduler_ = std::make_unique<Scheduler>(backend_.get(),
                                             SchedulerOptions{.verify_failures_to_retire = 0});
  }
  void TearDown() override {
    scheduler_.reset();
    FaultInjector::Global().Reset();
  }

  JobAnswer Run(const GemmJob& job) { return RunJob(*scheduler_, job); }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Scheduler> scheduler_;
};

// A GEMM of `form` with fresh random operands, C poisoned (0xFF bytes: NaN), its reference.
struct Gemm {
  Gemm(int64_t m, int64_t n, int64_t k, const GemmForm& form, float alpha, float beta,
       std::mt19937_64& rng)
      : form(form) {
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
    c.assign(job.shape.CBytes(), char(0xFF));
    if (beta != 0) {
      c_in.resize(job.shape.CBytes());
      if (form.c_fp32) {
        std::vector<float> f(m * n);
        std::uniform_real_distribution<float> u(-1, 1);
        for (float& x : f) x = u(rng);
        std::memcpy(c_in.data(), f.data(), c_in.size());
      } else {
        const auto h = RandomHalfMatrix(m * n, rng, form.bf16);
        std::memcpy(c_in.data(), h.data(), c_in.size());
      }
    }
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
  }
  std::vector<float> Reference() const {
    return ReferenceGemm(a.data(), b.data(), job.shape.m, job.shape.n, job.shape.k, form,
                         {.alpha = job.alpha, .beta = job.beta, .c_in = job.c_in});
  }
  double Error() const {
    const std::vector<float> reference = Reference();
    return CompareToReference(c.data(), reference.data(), int64_t(reference.size()), form)
        .rel_frobenius;
  }

  GemmForm form;
  std::vector<uint16_t> a, b;
  std::vector<char> c_in, c;
  GemmJob job;
};

TEST_F(CudaVerify, CorrectGemmsOfEveryFormPass) {
  std::mt19937_64 rng(21);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool bf16 : {false, true}) {
        for (bool c_fp32 : {false, true}) {
          for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -1.5f}}) {
            const GemmForm form{
                .transpose_a = ta, .transpose_b = tb, .bf16 = bf16, .c_fp32 = c_fp32};
            Gemm g(200, 136, 264, form, alpha, beta, rng);
            const JobAnswer answer = Run(g.job);
            ASSERT_TRUE(answer.status.ok()) << answer.status;
            EXPECT_EQ(answer.report.verified_repetitions, 2) << answer.report.verify_failure;
            EXPECT_FALSE(answer.report.suspect_device_id.has_value());
            EXPECT_LT(g.Error(), ServiceTolerance(false, form));
          }
        }
      }
    }
  }
}

TEST_F(CudaVerify, LongKAndFp16AccumulationPass) {
  std::mt19937_64 rng(22);
  for (Accumulation acc : {Accumulation::kFp32, Accumulation::kFp16}) {
    Gemm g(128, 128, 65536, {}, 1, 0, rng);
    g.job.accumulation = acc;
    const JobAnswer answer = Run(g.job);
    ASSERT_TRUE(answer.status.ok()) << answer.status;
    EXPECT_EQ(answer.report.verified_repetitions, 2) << answer.report.verify_failure;
    EXPECT_LT(g.Error(), ServiceTolerance(acc == Accumulation::kFp16, {}));
  }
}

// Arms the injector to flip the top exponent bit (0x4000) of one fp16 element of g's C for the
// next `runs` GEMMs: one whose value is in [0.5, 2), where that bit is clear, so that the flip
// multiplies it by 2^16, an error far above the bound that every repetition of the check finds.
// (Flipping a set bit instead divides the value by 2^16: an error of about the value, which a
// repetition may miss.)
void CorruptNext(const Gemm& g, int runs) {
  ASSERT_EQ(g.job.shape.c_type, ElementType::kFp16);
  const std::vector<float> reference = g.Reference();
  const int64_t size = int64_t(reference.size());
  const int64_t first = (g.job.shape.m / 2) * g.job.shape.n + g.job.shape.n / 3;
  int64_t index = -1;
  for (int64_t i = 0; i < size && index < 0; ++i) {
    const float value = std::fabs(reference[(first + i) % size]);
    if (value >= 0.5f && value < 2) index = (first + i) % size;
  }
  ASSERT_GE(index, 0) << "no element of C in [0.5, 2)";
  const int64_t offset = index * int64_t(sizeof(uint16_t));
  FaultInjector::Global().ArmCorruptOutput(
      [=](cudaStream_t stream, void* c, int64_t) {
        ASSERT_EQ(LaunchXorWord(stream, static_cast<char*>(c) + offset, 2, 0x4000u), cudaSuccess);
      },
      runs);
}

TEST_F(CudaVerify, ACorruptedRunIsRerunAndAnsweredRight) {
  std::mt19937_64 rng(23);
  Gemm g(256, 256, 512, {}, 1, 0, rng);
  CorruptNext(g, 1);
  const JobAnswer answer = Run(g.job);
  ASSERT_TRUE(answer.status.ok()) << answer.status;
  EXPECT_EQ(answer.report.suspect_device_id, backend_->Devices()[0].id);
  EXPECT_LT(g.Error(), ServiceTolerance(false, {}));
  EXPECT_EQ(scheduler_->GetVerifyStats()[0].reruns, 1);
}

TEST_F(CudaVerify, BothRunsCorruptedIsDataLoss) {
  std::mt19937_64 rng(24);
  Gemm g(256, 256, 512, {}, 1, 0, rng);
  CorruptNext(g, 2);
  const JobAnswer answer = Run(g.job);
  EXPECT_EQ(answer.status.code(), absl::StatusCode::kDataLoss) << answer.status;
}

TEST_F(CudaVerify, ResidentBKeepsItsCheckVectorUntilRewritten) {
  std::mt19937_64 rng(25);
  Gemm g(192, 160, 320, {}, 1, 0, rng);
  std::shared_ptr<ResidentBuffer> b;
  ASSERT_TRUE(backend_->AllocateResident(0, g.job.shape.BBytes(), &b).ok());
  ASSERT_TRUE(backend_->WriteResident(*b, 0, g.b.data(), g.job.shape.BBytes()).ok());
  g.job.b_resident = b;
  g.job.device_index = 0;
  for (int run = 0; run < 3; ++run) {
    if (run == 2) {  // new bytes for B: the kept op(B)·r must not be used
      g.b = RandomHalfMatrix(int64_t(g.b.size()), rng);
      ASSERT_TRUE(backend_->WriteResident(*b, 0, g.b.data(), g.job.shape.BBytes()).ok());
    }
    const JobAnswer answer = Run(g.job);
    ASSERT_TRUE(answer.status.ok()) << answer.status;
    EXPECT_EQ(answer.report.verified_repetitions, 2) << run << ": " << answer.report.verify_failure;
    EXPECT_LT(g.Error(), ServiceTolerance(false, {}));
  }
}

}  // namespace
}  // namespace hgemm
