// The CUDA backend on a real GPU: every kernel, both accumulations, odd shapes, concurrent
// slots, buffer growth, alpha/beta with C_in, batched and grouped. Skips when no usable GPU is
// present.
#include "server/backend/cuda_backend.h"

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/testing/shared_b_gemms.h"
#include "server/testing/test_requests.h"

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
        if (refused) {  // only aligned-shape kernels may refuse, and never an aligned shape,
                        // except those made for skinny M alone: the split-K wrappers
                        // (M <= 256) and skinny_m16 (M <= 16)
          const bool skinny_only =
              (kernel.rfind("splitk", 0) == 0 && m > 256) || (kernel == "skinny_m16" && m > 16);
          EXPECT_TRUE(kernel != "auto" && kernel != "cublas" && (n % 8 != 0 || skinny_only))
              << kernel << " " << m << "x" << n << "x" << k;
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

// alpha/beta on `backend` for every kernel that takes them, each layout and type pair it
// takes, C_in inline or resident, C poisoned with NaN; with beta 0 a NaN C_in stays out of C.
// Against float64.
void ExpectScaledSweepMatchesFloat64(Backend& backend) {
  std::vector<KernelDescription> kernels = backend.Kernels();
  KernelDescription auto_kernel{.name = "auto", .fp32_accumulation = true};
  for (const KernelDescription& k : kernels) {
    auto_kernel.layouts |= k.layouts;
    auto_kernel.scaled_types |= k.scaled_types;
  }
  kernels.push_back(auto_kernel);
  std::mt19937_64 rng(37);
  int ran = 0;
  for (const KernelDescription& kernel : kernels) {
    for (int layout = 0; layout < 4; ++layout) {
      if ((kernel.layouts & (1u << layout)) == 0) continue;
      const bool ta = layout >= 2, tb = layout % 2 == 1;
      for (v1::DataType ab : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_BF16}) {
        for (v1::DataType c_type : {ab, v1::DATA_TYPE_FP32}) {
          const ElementType ab_type =
              ab == v1::DATA_TYPE_BF16 ? ElementType::kBf16 : ElementType::kFp16;
          const ElementType c_elem = c_type == v1::DATA_TYPE_FP32 ? ElementType::kFp32 : ab_type;
          if ((kernel.scaled_types & TypesBit(ab_type, c_elem)) == 0) continue;
          for (auto [m, n, k, alpha, beta, resident] :
               {std::tuple{33, 65, 17, 0.5f, -1.5f, false},
                std::tuple{255, 256, 104, 2.0f, 0.0f, false},
                std::tuple{128, 200, 64, 0.0f, 2.0f, true}}) {
            v1::GemmRequest r = FormRequest(m, n, k, ta, tb, ab, c_type, rng);
            r.set_alpha(alpha);
            r.set_beta(beta);
            if (beta != 0) {
              SetRandomCIn(&r, rng);
            } else {
              r.set_c_in(std::string(MatrixBytes(m, n, c_elem), '\xFF'));  // NaN, never read
            }
            GemmJob job;
            job.shape = {
                .m = m, .n = n, .k = k, .ab_type = ab_type, .c_type = c_elem, .c_input = beta != 0};
            job.kernel = kernel.name;
            job.transpose_a = ta;
            job.transpose_b = tb;
            job.a = reinterpret_cast<const uint16_t*>(r.a().data());
            job.b = reinterpret_cast<const uint16_t*>(r.b().data());
            job.alpha = alpha;
            job.beta = beta;
            job.c_in = r.c_in().data();
            if (resident) {
              ASSERT_TRUE(backend.AllocateResident(0, r.c_in().size(), &job.c_in_resident).ok());
              ASSERT_TRUE(
                  backend.WriteResident(*job.c_in_resident, 0, r.c_in().data(), r.c_in().size())
                      .ok());
              job.c_in = nullptr;
            }
            std::string c(job.shape.CBytes(), '\xFF');
            job.c = c.data();
            GemmReport report;
            absl::Status s = backend.Run(1, job, &report);
            // A kernel for aligned shapes may refuse an odd one (m = 255 with transpose_a, say)
            // by name; auto must take every one.
            if (s.code() == absl::StatusCode::kInvalidArgument && kernel.name != "auto" &&
                s.message().find(kernel.name + ": variant " + kernel.name) != std::string::npos) {
              continue;
            }
            ASSERT_TRUE(s.ok()) << kernel.name << ": " << s.message();
            ++ran;
            const double tolerance = c_type == v1::DATA_TYPE_FP32 ? kKernelTolerance.fp32_acc
                                     : ab == v1::DATA_TYPE_BF16   ? kKernelToleranceBf16
                                                                  : kKernelTolerance.fp32_acc;
            EXPECT_LT(RelativeErrorOfC(r, c), tolerance)
                << kernel.name << " ran as " << report.kernel << " " << kLayoutNames[layout] << " "
                << v1::DataType_Name(ab) << "->" << v1::DataType_Name(c_type) << " " << m << "x"
                << n << "x" << k << " alpha " << alpha << " beta " << beta;
          }
        }
      }
    }
  }
  EXPECT_GT(ran, 0) << "no kernel takes alpha/beta";
}

// The default: the variant writes an fp32 T, the scale epilogue follows.
TEST_F(CudaBackendTest, ScaledEveryKernelLayoutAndTypeMatchesFloat64) {
  ExpectScaledSweepMatchesFloat64(*backend_);
}

// --fused_scale: alpha/beta inside the kernels that have fused_scale (the wgmma family, splitk,
// cublas, auto), the separate pass for the rest.
TEST_F(CudaBackendTest, ScaledFusedEveryKernelLayoutAndTypeMatchesFloat64) {
  std::string error;
  std::unique_ptr<Backend> fused =
      MakeCudaBackend({.devices = {0}, .streams_per_device = 2, .fused_scale = true}, &error);
  ASSERT_NE(fused, nullptr) << error;
  const std::vector<KernelDescription> kernels = fused->Kernels();
  EXPECT_TRUE(std::any_of(kernels.begin(), kernels.end(), [](const KernelDescription& k) {
    return k.fused_scale;
  })) << "no kernel fuses alpha/beta";
  ExpectScaledSweepMatchesFloat64(*fused);
}

// Host memory pinned by PinHostMemory (as a shared-memory region is): A, B and C_in copied to
// the device and C back by DMA straight from and to it, unstaged; C poisoned first and written
// over C_in in place (C = alpha·A·B + beta·C). Larger than a staging piece, so a staged copy
// would take several. Against the fp32 reference of the scaled GEMM. A second pin of the same
// memory fails cleanly (the caller then stages), and unpinning leaves the memory usable.
TEST_F(CudaBackendTest, PinnedHostMemoryGoesByDmaWithoutStaging) {
  const int64_t m = 2304, n = 2048, k = 2080;  // A 9.1, B 8.1, C 9 MiB: past an 8 MiB piece
  const int64_t a_bytes = m * k * 2, b_bytes = k * n * 2, c_bytes = m * n * 2;
  const int64_t bytes = a_bytes + b_bytes + c_bytes;
  // A mapping as a region's: page-aligned, MAP_SHARED.
  void* base =
      mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  char* mem = static_cast<char*>(base);
  std::function<void()> unpin;
  absl::Status pinned = backend_->PinHostMemory(base, bytes, &unpin);
  ASSERT_TRUE(pinned.ok()) << pinned.message();
  ASSERT_TRUE(unpin);
  std::function<void()> again;
  EXPECT_FALSE(backend_->PinHostMemory(base, bytes, &again).ok());  // already registered
  EXPECT_FALSE(again);

  std::mt19937_64 rng(43);
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng),
                              c_in = RandomHalfMatrix(m * n, rng);
  std::memcpy(mem, a.data(), a_bytes);
  std::memcpy(mem + a_bytes, b.data(), b_bytes);
  char* c = mem + a_bytes + b_bytes;
  for (float beta : {0.0f, 0.5f}) {
    SCOPED_TRACE(beta);
    if (beta == 0) {
      std::memset(c, 0xFF, c_bytes);  // NaN: an element not written fails the check
    } else {
      std::memcpy(c, c_in.data(), c_bytes);  // C_in, overwritten by C in place
    }
    GemmJob job;
    job.shape = {.m = m, .n = n, .k = k, .c_input = beta != 0};
    job.kernel = "auto";
    job.a = reinterpret_cast<const uint16_t*>(mem);
    job.b = reinterpret_cast<const uint16_t*>(mem + a_bytes);
    job.c = c;
    job.alpha = 1.5f;
    job.beta = beta;
    job.c_in = beta != 0 ? c : nullptr;
    job.pinned = {.a = true, .b = true, .c_in = beta != 0, .c = true};
    int64_t reported = 0;
    job.c_progress = [&](int64_t ready) { reported = ready; };
    GemmReport report;
    absl::Status s = backend_->Run(2, job, &report);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(reported, c_bytes);
    const GemmScale scale{.alpha = 1.5f, .beta = beta, .c_in = c_in.data()};
    const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k, {}, scale);
    EXPECT_LE(RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c), reference.data(), m * n),
              kKernelTolerance.fp32_acc);
  }
  unpin();
  std::memset(c, 0xFF, c_bytes);  // still ordinary memory of this process
  ASSERT_EQ(munmap(base, size_t(bytes)), 0);
}

// Strided-batched: one launch for the batch where the kernel takes batches (the wgmma family:
// aligned shapes, odd M included, whose last row tiles must stay inside their item), else one
// per GEMM at its offsets (odd shapes leave later matrices less aligned than the first), with
// and without alpha/beta. Against float64.
TEST_F(CudaBackendTest, BatchedGemmsMatchFloat64) {
  std::mt19937_64 rng(41);
  for (auto [m, n, k, batch, beta] :
       {std::tuple{64, 128, 64, 5, 0.0f}, std::tuple{33, 17, 9, 3, 0.0f},
        std::tuple{128, 64, 96, 4, -1.0f}, std::tuple{7, 5, 3, 6, 2.0f},
        std::tuple{129, 136, 40, 7, 0.0f}}) {
    for (v1::DataType c_type : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_FP32}) {
      v1::GemmRequest r = FormRequest(m, n, k, false, true, v1::DATA_TYPE_FP16, c_type, rng, batch);
      r.set_beta(beta);
      if (beta != 0) SetRandomCIn(&r, rng);
      GemmJob job;
      job.shape = {.m = m,
                   .n = n,
                   .k = k,
                   .c_type = c_type == v1::DATA_TYPE_FP32 ? ElementType::kFp32 : ElementType::kFp16,
                   .c_input = beta != 0,
                   .batch = batch};
      job.transpose_b = true;
      job.a = reinterpret_cast<const uint16_t*>(r.a().data());
      job.b = reinterpret_cast<const uint16_t*>(r.b().data());
      job.beta = beta;
      job.c_in = r.c_in().data();
      std::string c(job.shape.CBytes(), '\xFF');
      job.c = c.data();
      GemmReport report;
      absl::Status s = backend_->Run(3, job, &report);
      ASSERT_TRUE(s.ok()) << m << "x" << n << "x" << k << " batch " << batch << ": " << s.message();
      EXPECT_LT(RelativeErrorOfC(r, c), kKernelTolerance.fp32_acc)
          << report.kernel << " " << m << "x" << n << "x" << k << " batch " << batch << " beta "
          << beta;
    }
  }
}

// Grouped: problems of different shapes (aligned and odd, so later ones sit at less aligned
// offsets), one launch each with a variant per problem, one alpha/beta epilogue over all of C,
// into a poisoned C. Against float64.
TEST_F(CudaBackendTest, GroupedGemmsMatchFloat64) {
  std::mt19937_64 rng(43);
  const std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> problems = {
      {64, 128, 64}, {7, 5, 3}, {256, 64, 128}, {33, 17, 65}, {1, 1, 1}, {128, 256, 96}};
  for (auto [ab, c_type] : {std::pair{v1::DATA_TYPE_FP16, v1::DATA_TYPE_FP16},
                            std::pair{v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP32}}) {
    for (float beta : {0.0f, -1.5f}) {
      v1::GemmRequest r = GroupRequest(problems, false, true, ab, c_type, rng);
      r.set_alpha(0.5f);
      r.set_beta(beta);
      if (beta != 0) SetRandomCIn(&r, rng);
      GemmJob job;
      job.shape.ab_type = ab == v1::DATA_TYPE_BF16 ? ElementType::kBf16 : ElementType::kFp16;
      job.shape.c_type = c_type == v1::DATA_TYPE_FP32 ? ElementType::kFp32 : ElementType::kFp16;
      job.shape.c_input = beta != 0;
      for (auto [m, n, k] : problems) job.shape.group.push_back({m, n, k});
      job.transpose_b = true;
      job.a = reinterpret_cast<const uint16_t*>(r.a().data());
      job.b = reinterpret_cast<const uint16_t*>(r.b().data());
      job.alpha = 0.5f;
      job.beta = beta;
      job.c_in = r.c_in().data();
      std::string c(job.shape.CBytes(), '\xFF');
      job.c = c.data();
      GemmReport report;
      absl::Status s = backend_->Run(2, job, &report);
      ASSERT_TRUE(s.ok()) << v1::DataType_Name(ab) << " beta " << beta << ": " << s.message();
      EXPECT_LT(RelativeErrorOfC(r, c),
                ab == v1::DATA_TYPE_BF16 ? kKernelToleranceBf16 : kKernelTolerance.fp32_acc)
          << report.kernel << " " << v1::DataType_Name(ab) << " beta " << beta;
    }
  }
}

// `bytes` random bytes written into `buffer` at `offset` as slices of `slice` bytes, then read
// back from there: what was written, with the 4096 bytes before it still `poison`.
void ExpectPiecesLandOneAfterTheOther(Backend& backend, ResidentBuffer& buffer,
                                      const std::string& poison, size_t bytes, size_t slice,
                                      int64_t offset, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << bytes << " bytes in slices of " << slice);
  std::mt19937_64 rng(seed);
  std::string data(bytes, '\0');
  for (char& c : data) c = char(rng() | 1);  // never all zeros
  std::vector<std::string_view> pieces;
  for (size_t at = 0; at < data.size(); at += slice) {
    pieces.push_back(std::string_view(data).substr(at, slice));
  }
  ASSERT_TRUE(backend.WriteResidentPieces(buffer, offset, pieces).ok());
  std::string stored(data.size(), '\0');
  ASSERT_TRUE(backend.ReadResidentRange(buffer, offset, int64_t(data.size()), stored.data()).ok());
  EXPECT_TRUE(stored == data);
  std::string before(4096, '\0');
  ASSERT_TRUE(backend.ReadResidentRange(buffer, offset - 4096, 4096, before.data()).ok());
  EXPECT_EQ(before, poison.substr(0, 4096));
}

TEST_F(CudaBackendTest, PiecesLandOneAfterTheOther) {
  // Chunks as gRPC's slices. Under 1 MiB the driver copies them; from 1 MiB they go through a
  // pinned stager's 4 MiB pieces (9 MiB: both pieces, one twice; slices across their edges).
  const int64_t capacity = int64_t{12} << 20;
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(backend_->AllocateResident(0, capacity, &buffer).ok());
  const std::string poison(size_t(capacity), '\x7f');
  uint64_t seed = 5;
  for (size_t bytes : {size_t{300000}, size_t{9 << 20} + 12345}) {
    for (size_t slice : {bytes, size_t{1} << 20, size_t{8192} + 3}) {  // one piece, and many
      ASSERT_TRUE(backend_->WriteResident(*buffer, 0, poison.data(), buffer->bytes).ok());
      ExpectPiecesLandOneAfterTheOther(*backend_, *buffer, poison, bytes, slice,
                                       4096 + int64_t(slice % 4096), seed++);
    }
  }
}

// More large copies at once than a device lends stagers: those that find none idle go to the
// driver, and every copy lands whole, in its own range.
TEST_F(CudaBackendTest, ConcurrentLargeCopiesAllLand) {
  constexpr int kThreads = 12;
  constexpr int64_t kBytes = int64_t{3} << 20;
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(backend_->AllocateResident(0, kThreads * (kBytes + 4096), &buffer).ok());
  const std::string poison(size_t(buffer->bytes), '\x7f');
  ASSERT_TRUE(backend_->WriteResident(*buffer, 0, poison.data(), buffer->bytes).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        ExpectPiecesLandOneAfterTheOther(*backend_, *buffer, poison, size_t(kBytes),
                                         size_t{1} << 20, 4096 + t * (kBytes + 4096),
                                         uint64_t(100 * t + round));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Backend::RunBatch on the GPU (the scheduler's batches): members of different m against one
// resident B, in several layouts and types, scaled with C_in, into every sink, with the check,
// each get their own C, within the service's tolerance of the fp32 reference (that of a GEMM
// run alone).
TEST_F(CudaBackendTest, RunBatchGivesEveryMemberItsOwnC) {
  std::mt19937_64 rng(61);
  const GemmForm forms[] = {
      {}, {.transpose_b = true}, {.transpose_a = true, .bf16 = true, .c_fp32 = true}};
  for (const GemmForm& form : forms) {
    for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -2.0f}}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << form.transpose_a << " tb=" << form.transpose_b
                                        << " bf16=" << form.bf16 << " beta=" << beta);
      SharedB b(backend_, 2048, 2048, form, rng);
      std::vector<std::unique_ptr<RowsGemm>> members;
      const std::vector<std::pair<int64_t, CSink>> rows = {
          {1, CSink::kHost}, {16, CSink::kKeepC}, {7, CSink::kDevice}, {64, CSink::kHost}};
      std::vector<const GemmJob*> jobs;
      for (auto [m, sink] : rows) {
        members.push_back(std::make_unique<RowsGemm>(backend_, b, m, rng, alpha, beta, sink));
        members.back()->job.verify_repetitions = 1;
        jobs.push_back(&members.back()->job);
      }
      std::vector<GemmReport> reports(jobs.size());
      const std::vector<absl::Status> statuses = backend_->RunBatch(1, jobs, &reports);
      ASSERT_EQ(statuses.size(), jobs.size());
      for (size_t i = 0; i < jobs.size(); ++i) {
        ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i];
        EXPECT_EQ(reports[i].batch_size, 4);
        EXPECT_EQ(reports[i].batch_rows, 1 + 16 + 7 + 64);
        EXPECT_EQ(reports[i].verify_failure, "");
        EXPECT_EQ(reports[i].verified_repetitions, 1);
        EXPECT_GT(reports[i].kernel_ms, 0);
        EXPECT_TRUE(members[i]->Correct(reports[i])) << i;
      }
    }
  }
}

// Page-aligned host memory the backend has pinned, as it pins a shared-memory region (whole
// pages, as a region's mapping is); unpinned and unmapped when it goes.
class PinnedBuffer {
 public:
  PinnedBuffer(Backend* backend, size_t bytes) : bytes_(WholePages(bytes)) {
    void* base = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(base, MAP_FAILED);
    if (base == MAP_FAILED) return;
    data_ = static_cast<char*>(base);
    const absl::Status s = backend->PinHostMemory(data_, int64_t(bytes_), &unpin_);
    EXPECT_TRUE(s.ok()) << s;
  }
  ~PinnedBuffer() {
    if (unpin_) unpin_();
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  char* data() const { return data_; }

 private:
  static size_t WholePages(size_t bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }

  const size_t bytes_;
  char* data_ = nullptr;
  std::function<void()> unpin_;
};

// Where a batch member's A (or C_in) is, for the CUDA RunBatch's copies.
enum class Source {
  kHost,      // pageable host memory: staged through the slot's pinned pieces
  kPinned,    // memory the backend pinned (a region): one DMA
  kResident,  // a resident buffer on the device: device to device
};

// RunBatch's own copies on the GPU: every way a member's rows come in (host, pinned or
// resident A and C_in) and go out (host, pinned, kept or device C, C_in in place), members of
// different m next to each other (staged neighbours share pieces), all three layouts of A,
// with and without alpha/beta, checked. Against a backend with the default 8 MiB pieces, and
// one with pieces of 96 bytes: staged runs straddle pieces, a transposed A's rows go a few to
// a piece, and those of its 64-row member (128 bytes) through the driver's staging. Each C
// starts poisoned and must match the fp32 reference within the service's tolerance.
TEST_F(CudaBackendTest, RunBatchCopiesEveryMembersRowsStraightToAndFromItsOwnMemory) {
  std::string error;
  std::unique_ptr<Backend> small_pieces = MakeCudaBackend({.streams_per_device = 1,
                                                           .preallocate_bytes_per_stream = 1 << 20,
                                                           .device_memory_fraction = 0.1,
                                                           .staging_piece_bytes = 96,
                                                           .staging_buffers = 2},
                                                          &error);
  ASSERT_NE(small_pieces, nullptr) << error;
  struct Plan {
    int64_t m;
    Source a;
    CSink sink;
    bool pinned_c;  // a kHost sink in pinned memory
    Source c_in;    // with beta ≠ 0
    bool in_place;  // C_in is C's own host memory (kHost, beta ≠ 0)
  };
  const std::vector<Plan> plans = {
      {1, Source::kHost, CSink::kHost, false, Source::kHost, false},
      {16, Source::kResident, CSink::kKeepC, false, Source::kResident, false},
      {7, Source::kPinned, CSink::kDevice, false, Source::kPinned, false},
      {64, Source::kHost, CSink::kHost, false, Source::kHost, true},
      {5, Source::kHost, CSink::kHost, true, Source::kResident, false},
      {3, Source::kHost, CSink::kHost, true, Source::kHost, false},
      {2, Source::kPinned, CSink::kKeepC, false, Source::kHost, false}};
  int64_t rows = 0;
  for (const Plan& plan : plans) rows += plan.m;
  std::mt19937_64 rng(67);
  const GemmForm forms[] = {{},
                            {.transpose_b = true},
                            {.transpose_a = true, .transpose_b = true, .bf16 = true},
                            {.transpose_a = true, .c_fp32 = true}};
  for (Backend* backend : {backend_, small_pieces.get()}) {
    const int slot = backend == backend_ ? 3 : 0;
    for (const GemmForm& form : forms) {
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.75f, 1.25f}}) {
        SCOPED_TRACE(::testing::Message()
                     << (backend == backend_ ? "8 MiB pieces" : "96-byte pieces")
                     << " ta=" << form.transpose_a << " tb=" << form.transpose_b
                     << " bf16=" << form.bf16 << " c_fp32=" << form.c_fp32 << " beta=" << beta);
        SharedB b(backend, 1024, 776, form, rng);
        std::vector<std::unique_ptr<RowsGemm>> members;
        std::vector<std::unique_ptr<PinnedBuffer>> pinned;
        std::vector<std::shared_ptr<ResidentBuffer>> resident;
        std::vector<std::pair<char*, const PinnedBuffer*>> pinned_c(plans.size());
        std::vector<const GemmJob*> jobs;
        // Moves `bytes` at *host to a new pinned buffer or resident buffer.
        auto move = [&](Source to, const void** host, bool* is_pinned,
                        std::shared_ptr<ResidentBuffer>* on_device, int64_t bytes) {
          if (to == Source::kPinned) {
            pinned.push_back(std::make_unique<PinnedBuffer>(backend, size_t(bytes)));
            std::memcpy(pinned.back()->data(), *host, size_t(bytes));
            *host = pinned.back()->data();
            *is_pinned = true;
          } else if (to == Source::kResident) {
            ASSERT_TRUE(backend->AllocateResident(0, bytes, on_device).ok());
            ASSERT_TRUE(backend->WriteResident(**on_device, 0, *host, bytes).ok());
            *host = nullptr;
          }
        };
        for (size_t i = 0; i < plans.size(); ++i) {
          const Plan& plan = plans[i];
          members.push_back(std::make_unique<RowsGemm>(backend, b, plan.m, rng, alpha, beta,
                                                       plan.sink, plan.in_place && beta != 0));
          GemmJob& job = members.back()->job;
          job.verify_repetitions = 1;
          const void* a = job.a;
          move(plan.a, &a, &job.pinned.a, &job.a_resident, job.shape.ABytes());
          job.a = static_cast<const uint16_t*>(a);
          if (beta != 0 && !plan.in_place) {
            move(plan.c_in, &job.c_in, &job.pinned.c_in, &job.c_in_resident, job.shape.CInBytes());
          }
          if (plan.pinned_c) {
            pinned.push_back(std::make_unique<PinnedBuffer>(backend, job.shape.CBytes()));
            std::memset(pinned.back()->data(), 0xFF, job.shape.CBytes());  // NaN
            pinned_c[i] = {static_cast<char*>(job.c), pinned.back().get()};
            job.c = pinned.back()->data();
            job.pinned.c = true;
          }
          jobs.push_back(&job);
        }
        std::vector<GemmReport> reports(jobs.size());
        const std::vector<absl::Status> statuses = backend->RunBatch(slot, jobs, &reports);
        ASSERT_EQ(statuses.size(), jobs.size());
        for (size_t i = 0; i < jobs.size(); ++i) {
          SCOPED_TRACE(::testing::Message() << "member " << i << " (m=" << plans[i].m << ")");
          ASSERT_TRUE(statuses[i].ok()) << statuses[i];
          EXPECT_EQ(reports[i].batch_size, int(plans.size()));
          EXPECT_EQ(reports[i].batch_rows, rows);
          EXPECT_EQ(reports[i].verify_failure, "");
          EXPECT_EQ(reports[i].verified_repetitions, 1);
          EXPECT_GT(reports[i].kernel_ms, 0);
          EXPECT_GE(reports[i].host_to_device_ms, 0);
          EXPECT_GE(reports[i].device_to_host_ms, 0);
          EXPECT_EQ(reports[i].c_resident != nullptr, plans[i].sink == CSink::kKeepC);
          if (auto [own_c, region] = pinned_c[i]; region != nullptr) {  // what landed there
            std::memcpy(own_c, region->data(), jobs[i]->shape.CBytes());
          }
          EXPECT_TRUE(members[i]->Correct(reports[i]));
        }
      }
    }
  }
}

}  // namespace
}  // namespace hgemm
