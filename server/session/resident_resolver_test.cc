#include "server/session/resident_resolver.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace hgemm {
namespace {

// Two devices of host memory, one slot each: enough to see where the resolver places a job.
class TwoDeviceBackend final : public Backend {
 public:
  std::string Name() const override { return "two"; }
  std::vector<DeviceDescription> Devices() const override {
    return {{.id = 0, .name = "d0", .slots = 1}, {.id = 1, .name = "d1", .slots = 1}};
  }
  std::vector<KernelDescription> Kernels() const override { return {}; }
  int NumSlots() const override { return 2; }
  int SlotDevice(int slot) const override { return slot; }
  int64_t MaxJobBytes() const override { return int64_t{1} << 30; }
  absl::Status AllocateResident(int device_index, int64_t bytes,
                                std::shared_ptr<ResidentBuffer>* buffer) override {
    *buffer = std::make_shared<ResidentBuffer>(device_index, bytes, new char[bytes],
                                               [](void* p) { delete[] static_cast<char*>(p); });
    return absl::OkStatus();
  }
  absl::Status WriteResident(ResidentBuffer&, int64_t, const void*, int64_t) override {
    return absl::OkStatus();
  }
  absl::Status ReadResident(const ResidentBuffer&, void*) override { return absl::OkStatus(); }
  absl::Status Run(int, const GemmJob&, GemmReport*) override { return absl::OkStatus(); }
};

class ResidentResolverTest : public ::testing::Test {
 protected:
  std::string Put(const std::string& owner, int device, uint32_t rows, uint32_t cols) {
    std::shared_ptr<ResidentBuffer> buffer;
    QuotaReservation quota;
    EXPECT_TRUE(store_.Allocate(owner, device, rows, cols, &buffer, &quota).ok());
    return store_
        .Add(std::move(quota), rows, cols, ElementType::kFp16, std::move(buffer),
             std::chrono::seconds(0), "")
        .handle;
  }
  static GemmJob Job(int64_t m, int64_t n, int64_t k) {
    GemmJob job;
    job.shape = {m, n, k};
    return job;
  }

  TwoDeviceBackend backend_;
  MatrixStore store_{&backend_, {.quota_bytes_per_client = 4096}};
  Scheduler scheduler_{&backend_, {.idle_spin = std::chrono::microseconds(0)}};
  ResidentResolver resolver_{&store_, &scheduler_};
};

TEST_F(ResidentResolverTest, PinsTheJobToTheDeviceOfItsOperands) {
  const std::string a = Put("alice", 1, 4, 8);
  GemmJob job = Job(4, 2, 8);
  QuotaReservation c_quota;
  ASSERT_TRUE(resolver_.Resolve("alice", {.a_handle = a}, &job, &c_quota).ok());
  ASSERT_NE(job.a_resident, nullptr);
  EXPECT_EQ(job.a_resident->device_index, 1);
  EXPECT_EQ(job.b_resident, nullptr);
  EXPECT_EQ(job.device_index, 1);
  EXPECT_EQ(resolver_.PlaceArriving(&job), 1) << "B is written where A lives";
}

TEST_F(ResidentResolverTest, RunsWhereTheLargerOperandLives) {
  const std::string a = Put("alice", 0, 4, 2);   // 16 bytes
  const std::string b = Put("alice", 1, 2, 64);  // 256 bytes
  GemmJob job = Job(4, 64, 2);
  QuotaReservation c_quota;
  ASSERT_TRUE(resolver_.Resolve("alice", {.a_handle = a, .b_handle = b}, &job, &c_quota).ok());
  EXPECT_EQ(job.device_index, 1);
}

TEST_F(ResidentResolverTest, WrongShapeIsInvalidArgumentNamingTheField) {
  const std::string b = Put("alice", 0, 4, 8);
  GemmJob job = Job(4, 4, 8);  // B must be 8x4
  QuotaReservation c_quota;
  absl::Status s = resolver_.Resolve("alice", {.b_handle = b}, &job, &c_quota);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().substr(0, 9), "b_handle:") << s.message();
}

TEST_F(ResidentResolverTest, AnotherOwnersHandleIsNotFound) {
  const std::string a = Put("alice", 0, 4, 8);
  GemmJob job = Job(4, 2, 8);
  QuotaReservation c_quota;
  absl::Status s = resolver_.Resolve("mallory", {.a_handle = a}, &job, &c_quota);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(job.a_resident, nullptr);
}

// The C of keep_c is reserved at admission: a second GEMM that would pass the quota is refused
// while the first holds its reservation, and admitted once that is given back.
TEST_F(ResidentResolverTest, KeptResultsReserveTheirQuotaAtOnce) {
  GemmJob first = Job(32, 32, 8);  // C: 2048 bytes of alice's 4096
  QuotaReservation first_quota;
  ASSERT_TRUE(resolver_.Resolve("alice", {.keep_c = true}, &first, &first_quota).ok());
  EXPECT_TRUE(first.keep_c);
  EXPECT_EQ(first_quota.bytes(), 2048);

  GemmJob second = Job(32, 48, 8);  // 3072 more
  QuotaReservation second_quota;
  absl::Status s = resolver_.Resolve("alice", {.keep_c = true}, &second, &second_quota);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message().substr(0, 16), "keep_c_resident:") << s.message();
  EXPECT_FALSE(second.keep_c);
  EXPECT_EQ(store_.ClientBytes("alice"), 2048);

  first_quota = QuotaReservation();  // the first GEMM failed: its reservation goes back
  EXPECT_EQ(store_.ClientBytes("alice"), 0);
  EXPECT_TRUE(resolver_.Resolve("alice", {.keep_c = true}, &second, &second_quota).ok());
}

TEST_F(ResidentResolverTest, ArrivingOperandsGoToTheLeastLoadedDeviceWhenUnpinned) {
  GemmJob job = Job(4, 4, 4);
  EXPECT_EQ(resolver_.PlaceArriving(&job), 0) << "both idle: the lowest index";
  EXPECT_EQ(job.device_index, 0);
}

}  // namespace
}  // namespace hgemm
