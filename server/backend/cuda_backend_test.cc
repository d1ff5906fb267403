// The CUDA backend on a real GPU: every kernel, both accumulations, odd shapes, concurrent
// slots, buffer growth. Skips when no usable GPU is present.
#include "server/backend/cuda_backend.h"

#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"

namespace hgemm {
namespace {

class CudaBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    backend_ = MakeCudaBackend({.streams_per_device = 4}, &error).release();
    if (backend_ == nullptr) skip_reason_ = new std::string(error);
  }
  static void TearDownTestSuite() {
    delete backend_;
    backend_ = nullptr;
  }
  void SetUp() override {
    if (backend_ == nullptr) GTEST_SKIP() << "no usable GPU: " << *skip_reason_;
  }

  // Runs m×n×k on `slot` with fresh random inputs and a poisoned C; returns the relative
  // Frobenius error against the fp32 reference (or fails the test). A kernel named explicitly
  // may refuse a shape it cannot take: then *refused is set (if given) and 0 returned.
  double RunAndCompare(int slot, int64_t m, int64_t n, int64_t k, const std::string& kernel,
                       Accumulation acc, GemmReport* report, uint64_t seed,
                       bool* refused = nullptr) {
    std::mt19937_64 rng(seed);
    std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
    std::vector<uint16_t> c(m * n, 0xFFFF);  // NaN: an unwritten element fails the check
    GemmJob job;
    job.shape = {.m = m, .n = n, .k = k};
    job.kernel = kernel;
    job.accumulation = acc;
    job.a = a.data();
    job.b = b.data();
    job.c = c.data();
    absl::Status s = backend_->Run(slot, job, report);
    if (refused && s.code() == absl::StatusCode::kInvalidArgument &&
        s.message().find("cannot take") != std::string::npos) {
      *refused = true;
      return 0;
    }
    EXPECT_TRUE(s.ok()) << kernel << " " << m << "x" << n << "x" << k << ": " << s.message();
    if (!s.ok()) return 1;
    std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
    return RelativeFrobeniusError(c.data(), reference.data(), m * n);
  }

  static Backend* backend_;
  static std::string* skip_reason_;
};

Backend* CudaBackendTest::backend_ = nullptr;
std::string* CudaBackendTest::skip_reason_ = nullptr;

TEST_F(CudaBackendTest, EveryKernelBothAccumulationsOddShapes) {
  const std::vector<std::tuple<int, int, int>> shapes = {
      {1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {255, 257, 100}, {128, 256, 64}, {1000, 1000, 1000}};
  std::vector<KernelDescription> kernels = backend_->Kernels();
  kernels.push_back({.name = "auto", .fp16_accumulation = true, .fp32_accumulation = true});
  uint64_t seed = 1;
  for (const KernelDescription& description : kernels) {
    const std::string& kernel = description.name;
    for (Accumulation acc : {Accumulation::kFp16, Accumulation::kFp32}) {
      if (!(acc == Accumulation::kFp16 ? description.fp16_accumulation
                                       : description.fp32_accumulation)) {
        continue;
      }
      for (auto [m, n, k] : shapes) {
        GemmReport report;
        bool refused = false;
        double error = RunAndCompare(0, m, n, k, kernel, acc, &report, seed++, &refused);
        if (refused) {  // only aligned-shape kernels may refuse, and never an aligned shape
          EXPECT_TRUE(kernel != "auto" && kernel != "cublas" && n % 8 != 0) << kernel << " " << m
                                                                          << "x" << n << "x" << k;
          continue;
        }
        const double bar = kKernelTolerance.For(acc == Accumulation::kFp16);
        EXPECT_LE(error, bar) << kernel << " ran as " << report.kernel << " acc "
                              << (acc == Accumulation::kFp16 ? "fp16" : "fp32") << " " << m << "x"
                              << n << "x" << k;
        EXPECT_GT(report.kernel_ms, 0);
        EXPECT_NE(report.kernel, "auto");
      }
    }
  }
}

TEST_F(CudaBackendTest, SlotsRunConcurrentlyAndCorrectly) {
  std::vector<std::thread> threads;
  std::vector<double> errors(backend_->NumSlots(), 1);
  for (int slot = 0; slot < backend_->NumSlots(); ++slot) {
    threads.emplace_back([&, slot] {
      GemmReport report;
      errors[slot] = RunAndCompare(slot, 512 + 64 * slot, 768, 1024 - 8 * slot, "auto",
                                   Accumulation::kFp32, &report, 100 + slot);
      EXPECT_EQ(report.stream_id, slot % 4);
    });
  }
  for (auto& t : threads) t.join();
  for (double e : errors) EXPECT_LE(e, kKernelTolerance.fp32_acc);
}

TEST_F(CudaBackendTest, BuffersGrowAndShapesShrinkBack) {
  for (int64_t size : {64, 3000, 100, 4096, 17}) {
    GemmReport report;
    EXPECT_LE(RunAndCompare(1, size, size, size, "auto", Accumulation::kFp32, &report, size),
              kKernelTolerance.fp32_acc)
        << size;
    EXPECT_GT(report.host_to_device_ms, 0);
    EXPECT_GT(report.device_to_host_ms, 0);
  }
}

TEST_F(CudaBackendTest, ResidentOperandsAndKeptResult) {
  const int64_t m = 300, n = 256, k = 520;
  std::mt19937_64 rng(11);
  std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  std::shared_ptr<ResidentBuffer> a_dev, b_dev;
  ASSERT_TRUE(backend_->AllocateResident(0, 2 * m * k, &a_dev).ok());
  ASSERT_TRUE(backend_->AllocateResident(0, 2 * k * n, &b_dev).ok());
  ASSERT_TRUE(backend_->WriteResident(*a_dev, 0, a.data(), a_dev->bytes).ok());
  ASSERT_TRUE(backend_->WriteResident(*b_dev, 0, b.data(), b_dev->bytes).ok());
  std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  for (bool a_resident : {false, true}) {
    GemmJob job;
    job.shape = {.m = m, .n = n, .k = k};
    job.a = a.data();
    if (a_resident) job.a_resident = a_dev;
    job.b_resident = b_dev;
    job.keep_c = true;
    GemmReport report;
    ASSERT_TRUE(backend_->Run(2, job, &report).ok());
    ASSERT_NE(report.c_resident, nullptr);
    std::vector<uint16_t> c(m * n, 0xFFFF);
    ASSERT_TRUE(backend_->ReadResident(*report.c_resident, c.data()).ok());
    EXPECT_LE(RelativeFrobeniusError(c.data(), reference.data(), m * n), kKernelTolerance.fp32_acc);
    EXPECT_EQ(report.device_to_host_ms, 0);
  }
}

// A job the scheduler moved off the device of its resident operands: the slot copies them over
// (peer to peer between GPUs; with one GPU, both "devices" are that GPU and it is a device copy).
TEST_F(CudaBackendTest, ResidentOperandsOfAnotherDeviceAreCopiedOver) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::string error;
  std::unique_ptr<Backend> two = MakeCudaBackend({.devices = {0, count > 1 ? 1 : 0},
                                                  .streams_per_device = 1,
                                                  .preallocate_bytes_per_stream = 1 << 20,
                                                  .device_memory_fraction = 0.1},
                                                 &error);
  ASSERT_NE(two, nullptr) << error;
  ASSERT_EQ(two->SlotDevice(1), 1);
  const int64_t m = 260, n = 200, k = 300;
  std::mt19937_64 rng(12);
  std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  std::shared_ptr<ResidentBuffer> a_dev, b_dev;
  ASSERT_TRUE(two->AllocateResident(0, 2 * m * k, &a_dev).ok());
  ASSERT_TRUE(two->AllocateResident(0, 2 * k * n, &b_dev).ok());
  ASSERT_TRUE(two->WriteResident(*a_dev, 0, a.data(), a_dev->bytes).ok());
  ASSERT_TRUE(two->WriteResident(*b_dev, 0, b.data(), b_dev->bytes).ok());
  GemmJob job;
  job.shape = {.m = m, .n = n, .k = k};
  job.a_resident = a_dev;
  job.b_resident = b_dev;
  job.device_index = 0;
  std::vector<uint16_t> c(m * n, 0xFFFF);
  job.c = c.data();
  GemmReport report;
  ASSERT_TRUE(two->Run(1, job, &report).ok());  // slot 1 is device index 1
  std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  EXPECT_LE(RelativeFrobeniusError(c.data(), reference.data(), m * n), kKernelTolerance.fp32_acc);
  EXPECT_GT(report.host_to_device_ms, 0);  // the copy of A and B
}

TEST_F(CudaBackendTest, FreedResidentBuffersAreReusedWithoutAllocating) {
  std::shared_ptr<ResidentBuffer> first, second;
  ASSERT_TRUE(backend_->AllocateResident(0, 10'000'000, &first).ok());
  void* const address = first->data;
  first.reset();  // back to the device's cache
  ASSERT_TRUE(backend_->AllocateResident(0, 9'500'000, &second).ok());  // same 2 MiB class
  EXPECT_EQ(second->data, address);
  EXPECT_EQ(second->bytes, 9'500'000);
}

TEST_F(CudaBackendTest, TooLargeForAStreamIsResourceExhausted) {
  GemmJob job;
  job.shape = {.m = 1 << 20, .n = 1 << 20, .k = 1};  // C alone is 2 TiB
  std::vector<uint16_t> tiny(1);
  job.a = job.b = tiny.data();
  job.c = tiny.data();
  GemmReport report;
  EXPECT_EQ(backend_->Run(0, job, &report).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(backend_->Healthy());
}

TEST_F(CudaBackendTest, DescribesDevices) {
  std::vector<DeviceDescription> devices = backend_->Devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices[0].compute_capability, "9.0");
  EXPECT_EQ(devices[0].slots, 4);
  EXPECT_GT(backend_->MaxJobBytes(), int64_t{1} << 30);
  EXPECT_EQ(backend_->Name(), "cuda");
}

}  // namespace
}  // namespace hgemm
