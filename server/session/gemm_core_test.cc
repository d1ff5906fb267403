// GemmCore over the CPU backend with a real Scheduler, MatrixStore and UploadQueue: GEMMs from
// admission to their answer, checked against a float64 reference, and the core's own resident
// matrix and region operations. Inputs are fresh random fp16 values (never all zeros) and C is
// poisoned with NaN first, so that a C not written fails the check.
#include "server/session/gemm_core.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"
#include "server/backend/cpu_backend.h"
#include "server/core/status.h"
#include "server/testing/core_regions.h"
#include "server/testing/memfd.h"

namespace hgemm {
namespace {

constexpr uint16_t kHalfNan = 0x7e00;
constexpr auto kPatience = std::chrono::seconds(20);
constexpr int64_t kPendingBytes = 64 << 10;  // the core's max_client_pending_bytes

// ‖C − R‖_F / ‖R‖_F of an fp16 C (m×n) against the float64 reference R of A (m×k) and B (k×n),
// all row-major; +Inf if C holds a NaN or Inf anywhere (an element never written).
double ErrorAgainstFloat64(const uint16_t* a, const uint16_t* b, const uint16_t* c, int64_t m,
                           int64_t n, int64_t k) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double r = 0;
      for (int64_t p = 0; p < k; ++p) {
        r += double(HalfToFloat(a[i * k + p])) * double(HalfToFloat(b[p * n + j]));
      }
      const double got = HalfToFloat(c[i * n + j]);
      if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
      diff += (got - r) * (got - r);
      norm += r * r;
    }
  }
  return std::sqrt(diff / norm);
}

// What a GEMM's `done` reported, as plain values (a status copied across threads would share
// its message through Debian's uninstrumented absl refcount, which TSan takes for a race).
struct Finished {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;
  GemmResult result;
};

class GemmCoreTest : public ::testing::Test {
 protected:
  GemmCoreTest() : seed_(std::random_device()()), rng_(seed_) {}

  void SetUp() override { RecordProperty("seed", std::to_string(seed_)); }

  std::vector<uint16_t> Random(int64_t count) { return RandomHalfMatrix(count, rng_); }

  static std::string_view Bytes(const std::vector<uint16_t>& half) {
    return {reinterpret_cast<const char*>(half.data()), 2 * half.size()};
  }

  // A validated order of an m×n×k GEMM with operands `a` and `b`, C to the host.
  GemmOrder Order(uint32_t m, uint32_t n, uint32_t k, OperandSource a, OperandSource b) {
    GemmSpec spec;
    spec.m = m;
    spec.n = n;
    spec.k = k;
    spec.a = std::move(a);
    spec.b = std::move(b);
    GemmOrder order;
    absl::Status s = ValidateGemm(spec, core_.rules(), &order);
    EXPECT_TRUE(s.ok()) << s;
    return order;
  }

  // Runs an admitted GEMM and waits for its answer.
  Finished RunAndWait(AdmittedGemm admitted) {
    auto answer = std::make_shared<std::promise<Finished>>();
    std::future<Finished> answered = answer->get_future();
    absl::Status s =
        core_.Run(std::move(admitted), [answer](const absl::Status& status, GemmResult result) {
          answer->set_value({status.code(), std::string(status.message()), std::move(result)});
        });
    if (!s.ok()) return {s.code(), std::string(s.message()), {}};
    if (answered.wait_for(kPatience) != std::future_status::ready) {
      ADD_FAILURE() << "the GEMM was not answered within " << kPatience.count() << " s";
      return {};
    }
    return answered.get();
  }

  // A matrix of `owner` (rows×cols fp16) holding `values`, added as an upload would add it.
  ResidentMatrix AddMatrix(const std::string& owner, uint32_t rows, uint32_t cols,
                           const std::vector<uint16_t>& values) {
    const int64_t bytes = 2 * int64_t(rows) * cols;
    QuotaReservation quota;
    std::shared_ptr<ResidentBuffer> buffer;
    EXPECT_TRUE(core_.ReserveMatrix(owner, bytes, &quota).ok());
    EXPECT_TRUE(core_.AllocateMatrixBuffer(-1, bytes, &buffer).ok());
    if (!buffer) return {};
    std::memcpy(buffer->data, values.data(), size_t(bytes));
    return core_.AddMatrix(std::move(quota), {.rows = rows, .cols = cols}, ElementType::kFp16,
                           std::move(buffer));
  }

  const unsigned seed_;
  std::mt19937_64 rng_;
  std::unique_ptr<Backend> backend_ = MakeCpuBackend({.workers = 2});
  MatrixStore store_{backend_.get(), {.quota_bytes_per_client = int64_t{1} << 20}};
  Scheduler scheduler_{backend_.get(), {.idle_spin = std::chrono::microseconds(0)}};
  UploadQueue uploads_{backend_.get(), 2};
  GemmCore core_{&scheduler_, backend_.get(), &store_, &uploads_,
                 GemmCoreOptions{.rules = {.kernels = backend_->Kernels()},
                                 .max_client_pending_bytes = kPendingBytes,
                                 .regions = {.allow_shared_memory = true}}};
};

TEST_F(GemmCoreTest, RunsAHostGemmToTheFloat64Reference) {
  constexpr uint32_t kM = 37, kN = 29, kK = 53;  // odd: no kernel's tile divides them
  const std::vector<uint16_t> a = Random(kM * kK), b = Random(kK * kN);
  std::vector<uint16_t> c(kM * kN, kHalfNan);
  AdmittedGemm admitted;
  ASSERT_TRUE(core_
                  .Admit("alice",
                         Order(kM, kN, kK, OperandSource::Inline(Bytes(a)),
                               OperandSource::Inline(Bytes(b))),
                         &admitted)
                  .ok());
  admitted.job().c = c.data();
  const Finished done = RunAndWait(std::move(admitted));
  ASSERT_EQ(done.code, absl::StatusCode::kOk) << done.message;
  EXPECT_EQ(done.result.backend, "cpu");
  EXPECT_LT(ErrorAgainstFloat64(a.data(), b.data(), c.data(), kM, kN, kK),
            kServiceTolerance.fp32_acc);
}

TEST_F(GemmCoreTest, AResidentOperandNotFoundIsNotFound) {
  constexpr uint32_t kM = 8, kN = 16, kK = 24;
  const std::vector<uint16_t> a = Random(kM * kK);
  const ResidentMatrix bobs = AddMatrix("bob", kK, kN, Random(kK * kN));
  ASSERT_FALSE(bobs.handle.empty());
  // A inline, B the resident matrix `handle`.
  auto times = [&](const std::string& handle) {
    return Order(kM, kN, kK, OperandSource::Inline(Bytes(a)), OperandSource::Resident(handle));
  };
  AdmittedGemm admitted;
  // Another owner's matrix is as unknown as one that never was.
  for (const std::string& handle : {bobs.handle, std::string("m-0123456789abcdef")}) {
    const absl::Status s = core_.Admit("alice", times(handle), &admitted);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << handle << ": " << s;
  }
  const absl::Status own = core_.Admit("bob", times(bobs.handle), &admitted);
  EXPECT_TRUE(own.ok()) << own;
}

TEST_F(GemmCoreTest, ALimitIsResourceExhaustedNamingIt) {
  // A and B arriving in pieces: 2·(2·160·160) bytes, over the 64 KiB of pending bytes.
  auto arriving = [&](uint32_t size) {
    return Order(size, size, size, OperandSource::Arriving(), OperandSource::Arriving());
  };
  AdmittedGemm admitted;
  absl::Status s = core_.Admit("alice", arriving(160), &admitted);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("max_client_pending_bytes"), std::string::npos) << s;
  EXPECT_EQ(status::DetailsOf(s).limit, "max_client_pending_bytes");
  // 2·(2·128·128) bytes are the whole budget: while they are held, nothing more of alice's fits.
  AdmittedGemm first, second;
  ASSERT_TRUE(core_.Admit("alice", arriving(128), &first).ok());
  EXPECT_EQ(first.arriving_bytes(), kPendingBytes);
  s = core_.Admit("alice", arriving(16), &second);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(core_.Admit("bob", arriving(16), &second).ok()) << "a budget per client";
  first = AdmittedGemm();
  s = core_.Admit("alice", arriving(128), &second);
  EXPECT_TRUE(s.ok()) << "the dropped GEMM gave its bytes back: " << s;
}

TEST_F(GemmCoreTest, AKeptCLandsInTheStore) {
  constexpr uint32_t kM = 33, kN = 24, kK = 40;
  const std::vector<uint16_t> a = Random(kM * kK), b = Random(kK * kN);
  GemmOrder order =
      Order(kM, kN, kK, OperandSource::Inline(Bytes(a)), OperandSource::Inline(Bytes(b)));
  order.c = ResultSink::KeepResident(/*ttl_seconds=*/0);
  AdmittedGemm admitted;
  ASSERT_TRUE(core_.Admit("alice", std::move(order), &admitted).ok());
  const Finished done = RunAndWait(std::move(admitted));
  ASSERT_EQ(done.code, absl::StatusCode::kOk) << done.message;
  const ResidentMatrix& kept = done.result.kept_c;
  ASSERT_FALSE(kept.handle.empty());
  EXPECT_EQ(kept.rows, kM);
  EXPECT_EQ(kept.cols, kN);

  const MatrixList listed = core_.ListMatrices("alice", /*admin=*/false);
  ASSERT_EQ(listed.matrices.size(), 1u);
  EXPECT_EQ(listed.matrices[0].handle, kept.handle);
  EXPECT_EQ(listed.client_bytes, 2 * kM * kN);
  EXPECT_EQ(listed.quota_bytes, int64_t{1} << 20);
  ResidentMatrix found;
  ASSERT_TRUE(core_.LookupMatrix("alice", kept.handle, "handle", &found).ok());
  std::vector<uint16_t> c(kM * kN, kHalfNan);
  ASSERT_TRUE(core_.ReadMatrix(*found.buffer, 0, 2 * kM * kN, c.data()).ok());
  EXPECT_LT(ErrorAgainstFloat64(a.data(), b.data(), c.data(), kM, kN, kK),
            kServiceTolerance.fp32_acc);
  // A range reads the same bytes as the whole.
  std::vector<uint16_t> row(kN, kHalfNan);
  ASSERT_TRUE(core_.ReadMatrix(*found.buffer, 2 * kN * 5, 2 * kN, row.data()).ok());
  EXPECT_EQ(std::memcmp(row.data(), c.data() + kN * 5, 2 * kN), 0);
}

TEST_F(GemmCoreTest, MatricesAreTheirOwnersAndAnAdministratorsToo) {
  const ResidentMatrix alices = AddMatrix("alice", 4, 8, Random(32));
  const ResidentMatrix bobs = AddMatrix("bob", 8, 8, Random(64));
  ASSERT_FALSE(alices.handle.empty());
  ASSERT_FALSE(bobs.handle.empty());
  const MatrixList alice = core_.ListMatrices("alice", /*admin=*/false);
  ASSERT_EQ(alice.matrices.size(), 1u);
  EXPECT_EQ(alice.matrices[0].handle, alices.handle);
  EXPECT_EQ(alice.client_bytes, 64);
  EXPECT_EQ(core_.ListMatrices("root", /*admin=*/true).matrices.size(), 2u);
  EXPECT_TRUE(core_.ListMatrices("root", /*admin=*/false).matrices.empty());

  int64_t freed = -1;
  EXPECT_EQ(core_.ReleaseMatrix("alice", bobs.handle, /*admin=*/false, &freed).code(),
            absl::StatusCode::kNotFound);
  ResidentMatrix found;
  EXPECT_TRUE(core_.LookupMatrix("bob", bobs.handle, "handle", &found).ok());
  ASSERT_TRUE(core_.ReleaseMatrix("root", bobs.handle, /*admin=*/true, &freed).ok());
  EXPECT_EQ(freed, 128);
  EXPECT_EQ(core_.LookupMatrix("bob", bobs.handle, "handle", &found).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(core_.ReleaseMatrix("alice", alices.handle, /*admin=*/false, &freed).ok());
  EXPECT_EQ(freed, 64);
  EXPECT_EQ(core_.ListMatrices("alice", /*admin=*/false).client_bytes, 0);
}

TEST_F(GemmCoreTest, AnUploadByPartsCountsEachPartOnce) {
  absl::Status refused;
  core_.CreateUpload("alice", {.rows = 0, .cols = 3}, /*transient=*/false,
                     [&](const absl::Status& s, const ResidentMatrix&) { refused = s; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << "answered at once";
  EXPECT_NE(refused.message().find("header.rows"), std::string::npos) << refused;

  struct Created {
    absl::StatusCode code;
    ResidentMatrix matrix;
  };
  auto answer = std::make_shared<std::promise<Created>>();
  std::future<Created> created = answer->get_future();
  core_.CreateUpload("alice", {.rows = 8, .cols = 16}, /*transient=*/false,
                     [answer](const absl::Status& s, const ResidentMatrix& m) {
                       answer->set_value({s.code(), m});
                     });
  ASSERT_EQ(created.wait_for(kPatience), std::future_status::ready);
  const Created upload = created.get();
  ASSERT_EQ(upload.code, absl::StatusCode::kOk);
  const std::string& handle = upload.matrix.handle;
  std::shared_ptr<ResidentBuffer> buffer, other;
  ASSERT_TRUE(core_.BeginPart("alice", handle, 0, 128, "header", &buffer).ok());
  EXPECT_EQ(buffer->bytes, 256);
  EXPECT_EQ(core_.BeginPart("alice", handle, 64, 128, "header", &other).code(),
            absl::StatusCode::kInvalidArgument)
      << "overlaps the part claimed";
  EXPECT_EQ(core_.BeginPart("bob", handle, 128, 128, "header", &other).code(),
            absl::StatusCode::kNotFound);
  int64_t missing = -1;
  ASSERT_TRUE(core_.EndPart("alice", handle, 0, 128, /*landed=*/true, &missing).ok());
  EXPECT_EQ(missing, 128);
  ASSERT_TRUE(core_.BeginPart("alice", handle, 128, 128, "header", &other).ok());
  ASSERT_TRUE(core_.EndPart("alice", handle, 128, 128, /*landed=*/true, &missing).ok());
  EXPECT_EQ(missing, 0);
}

TEST_F(GemmCoreTest, RegionsAreRegisteredListedLeasedAndUnregistered) {
  constexpr int64_t kBytes = 4096;
  TestMemfd file(kBytes);
  ASSERT_GE(file.fd(), 0);
  const std::string pattern = "the region's own bytes";
  ASSERT_EQ(pwrite(file.fd(), pattern.data(), pattern.size(), 16), ssize_t(pattern.size()));

  RegionInfo info;
  ASSERT_TRUE(
      RegisterMemfdNow(core_, "alice", ThisProcess(), file.path(), kBytes, "test", &info).ok());
  RegionList list;
  ASSERT_TRUE(core_.ListRegions("alice", /*over_unix_socket=*/true, &list).ok());
  ASSERT_EQ(list.regions.size(), 1u);
  EXPECT_EQ(list.regions[0].handle, info.handle);
  EXPECT_EQ(list.regions[0].bytes, kBytes);
  EXPECT_EQ(list.owner_bytes, kBytes);
  EXPECT_EQ(list.quota_bytes, RegionStoreOptions().max_bytes_per_owner);
  EXPECT_EQ(list.quota_regions, RegionStoreOptions().max_regions_per_owner);
  EXPECT_EQ(core_.ListRegions("alice", /*over_unix_socket=*/false, &list).code(),
            absl::StatusCode::kPermissionDenied)
      << "regions only over a Unix socket";
  ASSERT_TRUE(core_.ListRegions("bob", /*over_unix_socket=*/true, &list).ok());
  EXPECT_TRUE(list.regions.empty());

  WireBytes read;
  ASSERT_TRUE(core_
                  .ReadRegion("alice", /*over_unix_socket=*/true, info.handle, 16,
                              int64_t(pattern.size()), "header.region", &read)
                  .ok());
  std::string joined;
  for (std::string_view piece : read.pieces()) joined += piece;
  EXPECT_EQ(joined, pattern);
  {
    RegionLease lease;
    ASSERT_TRUE(core_
                    .LeaseRegion("alice", /*over_unix_socket=*/true, info.handle, 0, kBytes,
                                 "a_region", &lease)
                    .ok());
    int64_t freed = -1;
    EXPECT_EQ(
        core_.UnregisterRegion("alice", /*over_unix_socket=*/true, info.handle, &freed).code(),
        absl::StatusCode::kFailedPrecondition)
        << "a lease holds it";
    EXPECT_EQ(core_
                  .LeaseRegion("bob", /*over_unix_socket=*/true, info.handle, 0, kBytes, "a_region",
                               &lease)
                  .code(),
              absl::StatusCode::kNotFound);
  }
  read = WireBytes();  // its lease too
  int64_t freed = -1;
  ASSERT_TRUE(core_.UnregisterRegion("alice", /*over_unix_socket=*/true, info.handle, &freed).ok());
  EXPECT_EQ(freed, kBytes);
  ASSERT_TRUE(core_.ListRegions("alice", /*over_unix_socket=*/true, &list).ok());
  EXPECT_TRUE(list.regions.empty());
  EXPECT_EQ(list.owner_bytes, 0);
}

TEST_F(GemmCoreTest, ARegistrationIsRefusedAtOnceForWhatTheRequestGetsWrong) {
  TestMemfd file(4096);
  // Each answered inside the call: nothing is posted to an upload thread.
  auto refusal = [&](bool over_unix_socket, const RegionSpec& spec,
                     std::optional<RegisteringProcess> process) {
    absl::Status answer = absl::UnknownError("not answered at once");
    core_.RegisterRegion("alice", over_unix_socket, spec, std::move(process),
                         [&](const absl::Status& s, const RegionInfo&) { answer = s; });
    return answer;
  };
  const RegionSpec good{.path = file.path(), .byte_size = 4096, .label = "test"};
  absl::Status s = refusal(/*over_unix_socket=*/false, good, ThisProcess());
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  RegionSpec huge = good;
  huge.byte_size = uint64_t{1} << 63;
  s = refusal(/*over_unix_socket=*/true, huge, ThisProcess());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(status::DetailsOf(s).field, "byte_size") << s;
  RegionSpec both = good;
  both.cuda_ipc = RegionSpec::CudaIpc{std::string(64, '\0'), "GPU-0"};
  s = refusal(/*over_unix_socket=*/true, both, ThisProcess());
  EXPECT_EQ(status::DetailsOf(s).field, "path") << s;
  s = refusal(/*over_unix_socket=*/true, good, std::nullopt);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("SO_PEERCRED"), std::string::npos) << s;

  // A server without shared memory refuses every region call.
  GemmCore closed(&scheduler_, backend_.get(), &store_, &uploads_,
                  {.rules = {.kernels = backend_->Kernels()}});
  EXPECT_EQ(closed.CheckRegionsAllowed(/*over_unix_socket=*/true).code(),
            absl::StatusCode::kFailedPrecondition);
  RegionList list;
  EXPECT_EQ(closed.ListRegions("alice", /*over_unix_socket=*/true, &list).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GemmCoreTest, AGemmReadsAndWritesARegionInPlace) {
  constexpr uint32_t kM = 24, kN = 20, kK = 40;  // each matrix a multiple of 16 bytes
  constexpr uint64_t kA = 0, kB = 2 * kM * kK, kC = kB + 2 * kK * kN;
  constexpr int64_t kBytes = int64_t(kC + 2 * kM * kN);
  TestMemfd file(kBytes);
  ASSERT_GE(file.fd(), 0);
  void* base = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd(), 0);
  ASSERT_NE(base, MAP_FAILED);
  auto* half = static_cast<uint16_t*>(base);
  const std::vector<uint16_t> a = Random(kM * kK), b = Random(kK * kN);
  std::memcpy(half + kA / 2, a.data(), 2 * a.size());
  std::memcpy(half + kB / 2, b.data(), 2 * b.size());
  std::fill(half + kC / 2, half + kC / 2 + kM * kN, kHalfNan);
  RegionInfo info;
  ASSERT_TRUE(
      RegisterMemfdNow(core_, "alice", ThisProcess(), file.path(), kBytes, "test", &info).ok());

  GemmOrder order = Order(kM, kN, kK, OperandSource::Region(info.handle, kA),
                          OperandSource::Region(info.handle, kB));
  order.c = ResultSink::Region(info.handle, kC);
  order.over_unix_socket = true;
  AdmittedGemm admitted;
  ASSERT_TRUE(core_.Admit("alice", std::move(order), &admitted).ok());
  const Finished done = RunAndWait(std::move(admitted));
  ASSERT_EQ(done.code, absl::StatusCode::kOk) << done.message;
  EXPECT_LT(ErrorAgainstFloat64(a.data(), b.data(), half + kC / 2, kM, kN, kK),
            kServiceTolerance.fp32_acc);
  int64_t freed = 0;
  EXPECT_TRUE(core_.UnregisterRegion("alice", /*over_unix_socket=*/true, info.handle, &freed).ok())
      << "the answered GEMM holds no lease";
  munmap(base, kBytes);
}

}  // namespace
}  // namespace hgemm
