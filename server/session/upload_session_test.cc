#include "server/session/upload_session.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "server/backend/cpu_backend.h"
#include "server/testing/fake_read_call.h"

namespace hgemm {
namespace {

void AddFailure(const std::string& what) { ADD_FAILURE() << what; }

// One UploadMatrix call: a session over a transport that records its finish.
class TestUpload final : public FakeReadCall<UploadTransport, UploadSession, UploadMessage> {
 public:
  TestUpload(GemmCoreInterface& core, std::string owner, std::chrono::seconds idle)
      : FakeReadCall(&AddFailure, std::chrono::seconds(20)) {
    Open(core, this, std::move(owner), idle);
  }
  ~TestUpload() override { WaitFinished(); }

  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  ResidentMatrix matrix() {
    std::lock_guard<std::mutex> lock(mu_);
    return matrix_;
  }

 private:
  void Finish(const absl::Status& status, const ResidentMatrix& matrix) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    matrix_ = matrix;
    FinishedLocked();
  }
  bool IsCancelled() const override { return false; }

  absl::Status status_;
  ResidentMatrix matrix_;
};

UploadMessage Header(uint32_t rows, uint32_t cols) {
  return {MatrixSpec{.rows = rows, .cols = cols}};
}

UploadMessage Chunk(std::string bytes) { return {WireBytes(std::move(bytes))}; }

class UploadSessionTest : public ::testing::Test {
 protected:
  std::string RandomBytes(size_t n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = char(rng_() | 1);  // never all zeros
    return bytes;
  }
  std::unique_ptr<TestUpload> Open(std::chrono::seconds idle = std::chrono::seconds(60)) {
    return std::make_unique<TestUpload>(core_, "alice", idle);
  }

  std::unique_ptr<Backend> backend_ = MakeCpuBackend({.workers = 1});
  MatrixStore store_{backend_.get(), {}};
  Scheduler scheduler_{backend_.get(), {.idle_spin = std::chrono::microseconds(0)}};
  UploadQueue uploads_{backend_.get(), 2};
  GemmCore core_{&scheduler_, backend_.get(), &store_, &uploads_,
                 GemmCoreOptions{.rules = {.kernels = backend_->Kernels()}}};
  std::mt19937_64 rng_{11};
};

TEST_F(UploadSessionTest, RegistersTheMatrixWithEveryByte) {
  const std::string bytes = RandomBytes(2 * 6 * 10);
  auto upload = Open();
  ASSERT_TRUE(upload->Deliver(Header(6, 10)));
  ASSERT_TRUE(upload->Deliver(Chunk(bytes.substr(0, 50))));
  ASSERT_TRUE(upload->Deliver(Chunk(bytes.substr(50))));
  upload->CloseReads();
  ASSERT_TRUE(upload->WaitFinished());
  ASSERT_TRUE(upload->status().ok()) << upload->status();
  const ResidentMatrix m = upload->matrix();
  EXPECT_EQ(m.rows, 6u);
  EXPECT_EQ(m.cols, 10u);
  std::string stored(bytes.size(), '\0');
  ASSERT_TRUE(backend_->ReadResident(*m.buffer, stored.data()).ok());
  EXPECT_EQ(stored, bytes);
  EXPECT_EQ(store_.List("alice").size(), 1u);
}

TEST_F(UploadSessionTest, AChunkPastTheEndIsRefusedAndNothingStaysHeld) {
  auto upload = Open();
  ASSERT_TRUE(upload->Deliver(Header(2, 2)));
  ASSERT_TRUE(upload->Deliver(Chunk(RandomBytes(6))));
  ASSERT_TRUE(upload->Deliver(Chunk(RandomBytes(4))));  // 10 of 8 bytes
  ASSERT_TRUE(upload->WaitFinished());
  EXPECT_EQ(upload->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(upload->status().message().find("past the end"), std::string::npos);
  EXPECT_TRUE(store_.List("alice").empty());
  EXPECT_EQ(store_.ClientBytes("alice"), 0);
}

TEST_F(UploadSessionTest, AnUploadThatEndsShortIsRefused) {
  auto upload = Open();
  ASSERT_TRUE(upload->Deliver(Header(4, 4)));
  ASSERT_TRUE(upload->Deliver(Chunk(RandomBytes(10))));
  upload->CloseReads();
  ASSERT_TRUE(upload->WaitFinished());
  EXPECT_EQ(upload->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(upload->status().message().find("10 of the matrix's 32 bytes"), std::string::npos);
  EXPECT_EQ(store_.ClientBytes("alice"), 0);
}

TEST_F(UploadSessionTest, NoHeaderAndABadHeaderAreRefused) {
  auto none = Open();
  none->CloseReads();
  ASSERT_TRUE(none->WaitFinished());
  EXPECT_EQ(none->status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = Open();
  ASSERT_TRUE(bad->Deliver(Header(0, 4)));
  ASSERT_TRUE(bad->WaitFinished());
  EXPECT_EQ(bad->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad->status().message().find("header.rows"), std::string::npos);
}

TEST_F(UploadSessionTest, AnIdleUploadIsDroppedAndLaterReadsAreIgnored) {
  auto upload = Open(std::chrono::seconds(1));
  ASSERT_TRUE(upload->Deliver(Header(4, 4)));
  ASSERT_TRUE(upload->Deliver(Chunk(RandomBytes(8))));
  upload->session().ExpireIdle(Clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(upload->WaitFinished());
  EXPECT_EQ(upload->status().code(), absl::StatusCode::kDeadlineExceeded);
  upload->CloseReads();  // the read outstanding completes: nothing happens
  EXPECT_EQ(store_.ClientBytes("alice"), 0);
}

TEST_F(UploadSessionTest, AMatrixTheClientNeverLearnedOfIsReleased) {
  auto upload = Open();
  ASSERT_TRUE(upload->Deliver(Header(2, 2)));
  ASSERT_TRUE(upload->Deliver(Chunk(RandomBytes(8))));
  upload->CloseReads();
  ASSERT_TRUE(upload->WaitFinished());
  ASSERT_TRUE(upload->status().ok());
  EXPECT_EQ(store_.List("alice").size(), 1u);
  upload->session().OnCallDone(/*cancelled=*/true);
  EXPECT_TRUE(store_.List("alice").empty());
}

}  // namespace
}  // namespace hgemm
