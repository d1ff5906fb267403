#include "server/backend/cpu_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "proto/numerics/error_stats.h"
#include "server/testing/c_faults.h"
#include "server/testing/shared_b_gemms.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

// A wrapped (negative) size must not be fetch_add-ed into the budget, which would then stay low
// for everyone.
TEST(CpuBackend, NonPositiveOrUnavailableSizesLeaveTheBudgetIntact) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({.resident_budget_bytes = 1 << 20});
  std::shared_ptr<ResidentBuffer> buffer;
  for (int64_t bytes : {int64_t{0}, int64_t{-17179869182}, int64_t{1} << 21}) {
    EXPECT_FALSE(backend->AllocateResident(0, bytes, &buffer).ok()) << bytes;
    EXPECT_EQ(buffer, nullptr);
  }
  ASSERT_TRUE(backend->AllocateResident(0, 1 << 20, &buffer).ok());  // the whole budget is there
  EXPECT_EQ(buffer->bytes, 1 << 20);
}

// Every layout and type pair into a C poisoned with NaN (0xFF bytes in fp16, bf16 and fp32):
// every element is written, and matches float64.
TEST(CpuBackend, EveryLayoutAndTypeOverwritesPoisonedC) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({});
  std::mt19937_64 rng(29);
  const int64_t m = 37, n = 21, k = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (v1::DataType ab : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_BF16}) {
        for (v1::DataType c_type : {ab, v1::DATA_TYPE_FP32}) {
          v1::GemmRequest r = FormRequest(m, n, k, ta, tb, ab, c_type, rng);
          GemmJob job;
          job.shape = {
              .m = m,
              .n = n,
              .k = k,
              .ab_type = ab == v1::DATA_TYPE_BF16 ? ElementType::kBf16 : ElementType::kFp16,
              .c_type = c_type == v1::DATA_TYPE_FP32 ? ElementType::kFp32
                        : ab == v1::DATA_TYPE_BF16   ? ElementType::kBf16
                                                     : ElementType::kFp16};
          job.transpose_a = ta;
          job.transpose_b = tb;
          job.a = reinterpret_cast<const uint16_t*>(r.a().data());
          job.b = reinterpret_cast<const uint16_t*>(r.b().data());
          std::string c(job.shape.CBytes(), '\xFF');
          job.c = c.data();
          GemmReport report;
          ASSERT_TRUE(backend->Run(0, job, &report).ok());
          const double tolerance = c_type == v1::DATA_TYPE_FP32 ? kKernelTolerance.fp32_acc
                                   : ab == v1::DATA_TYPE_BF16   ? kKernelToleranceBf16
                                                                : kKernelTolerance.fp32_acc;
          EXPECT_LT(RelativeErrorOfC(r, c), tolerance)
              << ta << tb << " " << v1::DataType_Name(ab) << " " << v1::DataType_Name(c_type);
        }
      }
    }
  }
}

// alpha/beta with C_in: BLAS semantics in every type, C_in may be C itself (in place), and
// with beta 0 a NaN C_in stays out of C.
TEST(CpuBackend, ScaledCMatchesFloat64InPlaceAndBetaZeroReadsNoCIn) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({});
  std::mt19937_64 rng(31);
  const int64_t m = 29, n = 19, k = 41;
  for (v1::DataType ab : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_BF16}) {
    for (v1::DataType c_type : {ab, v1::DATA_TYPE_FP32}) {
      for (auto [alpha, beta] : {std::pair{-0.75f, 1.25f}, std::pair{3.0f, 0.0f}}) {
        v1::GemmRequest r = FormRequest(m, n, k, true, false, ab, c_type, rng);
        r.set_alpha(alpha);
        r.set_beta(beta);
        SetRandomCIn(&r, rng);
        GemmJob job;
        job.shape = {.m = m,
                     .n = n,
                     .k = k,
                     .ab_type = ab == v1::DATA_TYPE_BF16 ? ElementType::kBf16 : ElementType::kFp16,
                     .c_type = c_type == v1::DATA_TYPE_FP32 ? ElementType::kFp32
                               : ab == v1::DATA_TYPE_BF16   ? ElementType::kBf16
                                                            : ElementType::kFp16,
                     .c_input = beta != 0};
        job.transpose_a = true;
        job.a = reinterpret_cast<const uint16_t*>(r.a().data());
        job.b = reinterpret_cast<const uint16_t*>(r.b().data());
        job.alpha = alpha;
        job.beta = beta;
        // With beta, C starts as C_in and is overwritten in place; without, it is NaN.
        std::string c = beta != 0 ? r.c_in() : std::string(job.shape.CBytes(), '\xFF');
        job.c = c.data();
        job.c_in = c.data();
        GemmReport report;
        ASSERT_TRUE(backend->Run(0, job, &report).ok());
        const double tolerance = c_type == v1::DATA_TYPE_FP32 ? kKernelTolerance.fp32_acc
                                 : ab == v1::DATA_TYPE_BF16   ? kKernelToleranceBf16
                                                              : kKernelTolerance.fp32_acc;
        EXPECT_LT(RelativeErrorOfC(r, c), tolerance)
            << v1::DataType_Name(ab) << " " << v1::DataType_Name(c_type) << " beta " << beta;
      }
    }
  }
}

// Grouped: problems of their own shapes packed in order, alpha/beta with C_in, into a C
// poisoned with NaN; each problem's C matches float64, and a group of one is bit-identical to
// the plain GEMM.
TEST(CpuBackend, GroupedProblemsOverwritePoisonedCAndMatchFloat64) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({});
  std::mt19937_64 rng(71);
  const std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> problems = {
      {7, 5, 3}, {1, 1, 1}, {33, 17, 65}, {2, 40, 9}};
  for (v1::DataType ab : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_BF16}) {
    for (v1::DataType c_type : {ab, v1::DATA_TYPE_FP32}) {
      v1::GemmRequest r = GroupRequest(problems, true, false, ab, c_type, rng);
      r.set_alpha(-0.75f);
      r.set_beta(1.25f);
      SetRandomCIn(&r, rng);
      GemmJob job;
      job.shape.ab_type = ab == v1::DATA_TYPE_BF16 ? ElementType::kBf16 : ElementType::kFp16;
      job.shape.c_type = c_type == v1::DATA_TYPE_FP32 ? ElementType::kFp32 : job.shape.ab_type;
      job.shape.c_input = true;
      for (auto [m, n, k] : problems) job.shape.group.push_back({m, n, k});
      job.transpose_a = true;
      job.a = reinterpret_cast<const uint16_t*>(r.a().data());
      job.b = reinterpret_cast<const uint16_t*>(r.b().data());
      job.alpha = -0.75f;
      job.beta = 1.25f;
      job.c_in = r.c_in().data();
      std::string c(job.shape.CBytes(), '\xFF');
      job.c = c.data();
      GemmReport report;
      ASSERT_TRUE(backend->Run(0, job, &report).ok());
      const double tolerance = c_type == v1::DATA_TYPE_FP32 ? kKernelTolerance.fp32_acc
                               : ab == v1::DATA_TYPE_BF16   ? kKernelToleranceBf16
                                                            : kKernelTolerance.fp32_acc;
      EXPECT_LT(RelativeErrorOfC(r, c), tolerance)
          << v1::DataType_Name(ab) << " -> " << v1::DataType_Name(c_type);
    }
  }
  v1::GemmRequest r =
      GroupRequest({{13, 9, 21}}, false, false, v1::DATA_TYPE_FP16, v1::DATA_TYPE_FP16, rng);
  std::string grouped_c(2 * 13 * 9, '\xFF'), plain_c(2 * 13 * 9, '\xFF');
  for (bool grouped : {true, false}) {
    GemmJob job;
    if (grouped) {
      job.shape.group = {{13, 9, 21}};
    } else {
      job.shape = {.m = 13, .n = 9, .k = 21};
    }
    job.a = reinterpret_cast<const uint16_t*>(r.a().data());
    job.b = reinterpret_cast<const uint16_t*>(r.b().data());
    job.c = grouped ? grouped_c.data() : plain_c.data();
    GemmReport report;
    ASSERT_TRUE(backend->Run(0, job, &report).ok());
  }
  EXPECT_EQ(grouped_c, plain_c);
  EXPECT_LT(RelativeErrorOfC(r, grouped_c), kKernelTolerance.fp32_acc);
}

TEST(CpuBackend, PiecesLandOneAfterTheOther) {
  auto backend = MakeCpuBackend({.workers = 1});
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(backend->AllocateResident(0, 64, &buffer).ok());
  const std::string poison(64, '\x7f');
  ASSERT_TRUE(backend->WriteResident(*buffer, 0, poison.data(), 64).ok());
  std::mt19937_64 rng(3);
  std::string bytes(40, '\0');
  for (char& c : bytes) c = char(rng() | 1);  // never all zeros
  const std::vector<std::string_view> pieces = {std::string_view(bytes).substr(0, 1),
                                                std::string_view(bytes).substr(1, 30),
                                                std::string_view(bytes).substr(31)};
  ASSERT_TRUE(backend->WriteResidentPieces(*buffer, 8, pieces).ok());
  std::string stored(64, '\0');
  ASSERT_TRUE(backend->ReadResident(*buffer, stored.data()).ok());
  EXPECT_EQ(stored, poison.substr(0, 8) + bytes + poison.substr(48));
}

TEST(CpuBackend, ReleasedMemoryIsReusedUpToItsLimitAndOutsideTheBudget) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  auto backend =
      MakeCpuBackend({.resident_budget_bytes = 4 * kMiB, .resident_reuse_bytes = 3 * kMiB});
  std::shared_ptr<ResidentBuffer> a, b, c;
  ASSERT_TRUE(backend->AllocateResident(0, 2 * kMiB, &a).ok());
  ASSERT_TRUE(backend->AllocateResident(0, 2 * kMiB, &b).ok());
  void* const b_data = b->data;
  a.reset();  // kept
  b.reset();  // kept too: a, the oldest, is dropped to stay within 3 MiB
  // Kept memory is no resident memory: the whole budget is there again.
  ASSERT_TRUE(backend->AllocateResident(0, 2 * kMiB, &a).ok());
  EXPECT_EQ(a->data, b_data);
  ASSERT_TRUE(backend->AllocateResident(0, 2 * kMiB, &b).ok());
  EXPECT_NE(b->data, a->data);
  // Another size is never handed a kept buffer.
  void* const kept = b->data;
  b.reset();
  ASSERT_TRUE(backend->AllocateResident(0, kMiB, &c).ok());
  EXPECT_NE(c->data, kept);
  const std::string bytes(size_t(kMiB), '\x5a');
  ASSERT_TRUE(backend->WriteResident(*c, 0, bytes.data(), kMiB).ok());
  std::string stored(size_t(kMiB), '\0');
  ASSERT_TRUE(backend->ReadResident(*c, stored.data()).ok());
  EXPECT_EQ(stored, bytes);
}

// Backend::RunBatch (the default the CPU backend runs): members of different m, each form,
// scales with C_in (one in place), and every sink get their own C, as one launch.
TEST(CpuBackend, RunBatchGivesEveryMemberItsOwnC) {
  auto backend = MakeCpuBackend({.workers = 1});
  std::mt19937_64 rng(47);
  const GemmForm forms[] = {{},
                            {.transpose_a = true, .transpose_b = true, .c_fp32 = true},
                            {.transpose_a = true, .bf16 = true}};
  for (const GemmForm& form : forms) {
    for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.5f, 1.5f}}) {
      SharedB b(backend.get(), 40, 72, form, rng);
      std::vector<std::unique_ptr<RowsGemm>> members;
      members.push_back(std::make_unique<RowsGemm>(backend.get(), b, 1, rng, alpha, beta));
      members.push_back(
          std::make_unique<RowsGemm>(backend.get(), b, 5, rng, alpha, beta, CSink::kKeepC));
      members.push_back(
          std::make_unique<RowsGemm>(backend.get(), b, 16, rng, alpha, beta, CSink::kDevice));
      members.push_back(std::make_unique<RowsGemm>(backend.get(), b, 3, rng, alpha, beta,
                                                   CSink::kHost, /*in_place=*/beta != 0));
      std::vector<const GemmJob*> jobs;
      for (const auto& member : members) jobs.push_back(&member->job);
      std::vector<GemmReport> reports(jobs.size());
      const std::vector<absl::Status> statuses = backend->RunBatch(0, jobs, &reports);
      ASSERT_EQ(statuses.size(), jobs.size());
      for (size_t i = 0; i < jobs.size(); ++i) {
        SCOPED_TRACE(::testing::Message()
                     << "member " << i << " ta=" << form.transpose_a << " tb=" << form.transpose_b
                     << " bf16=" << form.bf16 << " beta=" << beta);
        ASSERT_TRUE(statuses[i].ok()) << statuses[i];
        EXPECT_EQ(reports[i].batch_size, 4);
        EXPECT_EQ(reports[i].batch_rows, 25);
        EXPECT_EQ(reports[i].kernel, "openblas_sgemm");
        EXPECT_TRUE(members[i]->Correct(reports[i]));
      }
    }
  }
}

// One check of the stacked C: a corrupted launch writes no member's sink, and says so in every
// report; a clean one passes for all.
TEST(CpuBackend, RunBatchWhoseCheckFailsWritesNoSink) {
  std::atomic<int> corrupt{1};
  auto backend = MakeCpuBackend({.workers = 1, .after_gemm = [&](int, const GemmJob& job, void* c) {
                                   if (corrupt.fetch_sub(1) > 0) {
                                     CorruptC(CFault::kLargeError, job.shape.c_type, job.shape.n, c,
                                              job.shape.m - 1, 0);
                                   }
                                 }});
  std::mt19937_64 rng(53);
  SharedB b(backend.get(), 24, 56, {}, rng);
  for (bool corrupted : {true, false}) {
    std::vector<std::unique_ptr<RowsGemm>> members;
    std::vector<const GemmJob*> jobs;
    for (int64_t m : {7, 2, 9}) {
      members.push_back(std::make_unique<RowsGemm>(backend.get(), b, m, rng));
      members.back()->job.verify_repetitions = 2;
      jobs.push_back(&members.back()->job);
    }
    std::vector<GemmReport> reports(jobs.size());
    const std::vector<absl::Status> statuses = backend->RunBatch(0, jobs, &reports);
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_TRUE(statuses[i].ok()) << statuses[i];
      if (corrupted) {
        EXPECT_NE(reports[i].verify_failure, "");
        EXPECT_EQ(reports[i].verified_repetitions, 0);
        EXPECT_TRUE(members[i]->Untouched()) << i;
      } else {
        EXPECT_EQ(reports[i].verify_failure, "");
        EXPECT_EQ(reports[i].verified_repetitions, 2);
        EXPECT_TRUE(members[i]->Correct(reports[i]));
      }
    }
  }
}

// A launch that fails fails every member, their sinks unwritten; a member whose own sink fails
// (a kept C past the budget) fails alone.
TEST(CpuBackend, RunBatchFailuresAreTheLaunchsOrTheMembersOwn) {
  const int64_t n = 32, k = 48, b_bytes = n * k * 2;
  auto backend = MakeCpuBackend({.workers = 1, .resident_budget_bytes = b_bytes + 1024});
  std::mt19937_64 rng(59);
  SharedB b(backend.get(), n, k, {}, rng);
  RowsGemm host(backend.get(), b, 6, rng);
  RowsGemm kept(backend.get(), b, 64, rng, 1, 0, CSink::kKeepC);  // 4096 bytes of C
  std::vector<GemmReport> reports(2);
  std::vector<absl::Status> statuses = backend->RunBatch(0, {&host.job, &kept.job}, &reports);
  ASSERT_EQ(statuses.size(), 2u);
  ASSERT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_TRUE(host.Correct(reports[0]));
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kResourceExhausted) << statuses[1];
  EXPECT_EQ(reports[1].c_resident, nullptr);

  RowsGemm other(backend.get(), b, 6, rng);
  backend->TakeOutOfService(0, "test");
  statuses = backend->RunBatch(0, {&other.job, &host.job}, &reports);
  for (const absl::Status& s : statuses) EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(other.Untouched());
}

}  // namespace
}  // namespace hgemm
