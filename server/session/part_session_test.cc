#include "server/session/part_session.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "server/backend/cpu_backend.h"
#include "server/testing/fake_read_call.h"

namespace hgemm {
namespace {

void AddFailure(const std::string& what) { ADD_FAILURE() << what; }

// One UploadPart call: a session over a transport that records its finish.
class TestPart final : public FakeReadCall<PartTransport, PartSession, PartMessage> {
 public:
  TestPart(GemmCoreInterface& core, std::string owner, std::chrono::seconds idle)
      : FakeReadCall(&AddFailure, std::chrono::seconds(20)) {
    Open(core, this, std::move(owner), idle);
  }
  ~TestPart() override { WaitFinished(); }

  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  int64_t missing() {
    std::lock_guard<std::mutex> lock(mu_);
    return missing_;
  }

 private:
  void Finish(const absl::Status& status, int64_t missing) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    missing_ = missing;
    FinishedLocked();
  }

  absl::Status status_;
  int64_t missing_ = -1;
};

PartMessage Header(const std::string& handle, uint64_t offset, uint64_t length) {
  return {PartSpec{handle, offset, length}};
}

PartMessage Chunk(std::string bytes) { return {WireBytes(std::move(bytes))}; }

class PartSessionTest : public ::testing::Test {
 protected:
  std::string RandomBytes(size_t n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = char(rng_() | 1);  // never all zeros
    return bytes;
  }

  // A CreateUpload of `owner`, waited for.
  absl::Status Create(uint32_t rows, uint32_t cols, ResidentMatrix* matrix,
                      const std::string& owner = "alice", bool transient = false) {
    std::mutex mu;
    std::condition_variable done;
    bool answered = false;
    absl::Status status;
    core_.CreateUpload(owner, {.rows = rows, .cols = cols}, transient,
                       [&](const absl::Status& s, const ResidentMatrix& m) {
                         std::lock_guard<std::mutex> lock(mu);
                         status = s;
                         *matrix = m;
                         answered = true;
                         done.notify_all();
                       });
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(20), [&] { return answered; }));
    return status;
  }

  // Sends one part of `bytes` at `offset` (chunks of `chunk` bytes) and waits for its answer.
  std::unique_ptr<TestPart> Send(const std::string& handle, uint64_t offset,
                                 const std::string& bytes, const std::string& owner = "alice",
                                 size_t chunk = 7) {
    auto part = std::make_unique<TestPart>(core_, owner, std::chrono::seconds(60));
    if (part->Deliver(Header(handle, offset, bytes.size()))) {
      for (size_t at = 0; at < bytes.size(); at += chunk) {
        if (!part->Deliver(Chunk(bytes.substr(at, chunk)))) break;
      }
      part->CloseReads();
    }
    EXPECT_TRUE(part->WaitFinished());
    return part;
  }

  std::string Stored(const ResidentMatrix& m) {
    std::string stored(m.buffer->bytes, '\0');
    EXPECT_TRUE(backend_->ReadResident(*m.buffer, stored.data()).ok());
    return stored;
  }

  std::unique_ptr<Backend> backend_ = MakeCpuBackend({.workers = 1});
  MatrixStore store_{backend_.get(),
                     {.upload_idle_timeout = std::chrono::seconds(1), .max_parts_per_upload = 4}};
  Scheduler scheduler_{backend_.get(), {.idle_spin = std::chrono::microseconds(0)}};
  UploadQueue uploads_{backend_.get(), 2};
  GemmCore core_{&scheduler_, backend_.get(), &store_, &uploads_,
                 GemmCoreOptions{.rules = {.kernels = backend_->Kernels()}}};
  std::mt19937_64 rng_{27};
};

TEST_F(PartSessionTest, PartsOutOfOrderFillTheMatrix) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(5, 9, &upload).ok());
  EXPECT_EQ(upload.missing_bytes, 90);
  const std::string bytes = RandomBytes(90);
  ResidentMatrix m;
  EXPECT_EQ(store_.Lookup("alice", upload.handle, "a_handle", &m).code(),
            absl::StatusCode::kFailedPrecondition);
  auto last = Send(upload.handle, 61, bytes.substr(61));
  EXPECT_TRUE(last->status().ok()) << last->status();
  EXPECT_EQ(last->missing(), 61);
  auto first = Send(upload.handle, 0, bytes.substr(0, 30));
  EXPECT_EQ(first->missing(), 31);
  absl::Status incomplete = store_.Lookup("alice", upload.handle, "a_handle", &m);
  EXPECT_EQ(incomplete.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(incomplete.message().find("missing 31 of its 90 bytes"), std::string::npos)
      << incomplete;
  auto middle = Send(upload.handle, 30, bytes.substr(30, 31));
  EXPECT_TRUE(middle->status().ok()) << middle->status();
  EXPECT_EQ(middle->missing(), 0);
  ASSERT_TRUE(store_.Lookup("alice", upload.handle, "a_handle", &m).ok());
  EXPECT_EQ(Stored(m), bytes);
  // Complete: it takes no more parts.
  EXPECT_EQ(Send(upload.handle, 0, bytes.substr(0, 2))->status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PartSessionTest, OverlappingAndDuplicatePartsAreRefused) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(4, 10, &upload).ok());
  const std::string bytes = RandomBytes(80);
  ASSERT_TRUE(Send(upload.handle, 20, bytes.substr(20, 20))->status().ok());
  auto duplicate = Send(upload.handle, 20, bytes.substr(20, 20));
  EXPECT_EQ(duplicate->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(duplicate->status().message().find("overlap the part [20, 40)"), std::string::npos)
      << duplicate->status();
  EXPECT_EQ(Send(upload.handle, 10, bytes.substr(10, 11))->status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Send(upload.handle, 39, bytes.substr(39, 5))->status().code(),
            absl::StatusCode::kInvalidArgument);
  // The refusals took nothing: the rest still goes in.
  ASSERT_TRUE(Send(upload.handle, 0, bytes.substr(0, 20))->status().ok());
  auto rest = Send(upload.handle, 40, bytes.substr(40));
  ASSERT_TRUE(rest->status().ok()) << rest->status();
  EXPECT_EQ(rest->missing(), 0);
  ResidentMatrix m;
  ASSERT_TRUE(store_.Lookup("alice", upload.handle, "b_handle", &m).ok());
  EXPECT_EQ(Stored(m), bytes);
}

TEST_F(PartSessionTest, APartOfWrongSizeIsRefusedAndItsRangeCanBeSentAgain) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(3, 8, &upload).ok());
  const std::string bytes = RandomBytes(48);
  // More bytes than announced.
  auto larger = std::make_unique<TestPart>(core_, "alice", std::chrono::seconds(60));
  ASSERT_TRUE(larger->Deliver(Header(upload.handle, 0, 10)));
  ASSERT_TRUE(larger->Deliver(Chunk(RandomBytes(8))));
  ASSERT_TRUE(larger->Deliver(Chunk(RandomBytes(8))));   // 16 of 10 bytes: refused
  EXPECT_FALSE(larger->Deliver(Chunk(RandomBytes(1))));  // and no further read
  ASSERT_TRUE(larger->WaitFinished());
  EXPECT_EQ(larger->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(larger->status().message().find("more bytes than the header announced"),
            std::string::npos)
      << larger->status();
  // Fewer (the client stopped early, or died mid-part).
  auto shorter = std::make_unique<TestPart>(core_, "alice", std::chrono::seconds(60));
  ASSERT_TRUE(shorter->Deliver(Header(upload.handle, 0, 10)));
  ASSERT_TRUE(shorter->Deliver(Chunk(RandomBytes(4))));
  shorter->CloseReads();
  ASSERT_TRUE(shorter->WaitFinished());
  EXPECT_EQ(shorter->status().code(), absl::StatusCode::kInvalidArgument);
  // Neither counted: the whole matrix goes in again, and none of their bytes stayed.
  auto whole = Send(upload.handle, 0, bytes);
  ASSERT_TRUE(whole->status().ok()) << whole->status();
  EXPECT_EQ(whole->missing(), 0);
  ResidentMatrix m;
  ASSERT_TRUE(store_.Lookup("alice", upload.handle, "a_handle", &m).ok());
  EXPECT_EQ(Stored(m), bytes);
}

TEST_F(PartSessionTest, BadHeadersAreRefused) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(2, 2, &upload).ok());
  EXPECT_EQ(Send(upload.handle, 0, RandomBytes(9))->status().code(),
            absl::StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(Send(upload.handle, 8, RandomBytes(1))->status().code(),
            absl::StatusCode::kInvalidArgument);  // starts at the end
  EXPECT_EQ(Send(upload.handle, 2, "")->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Send("m-0123", 0, RandomBytes(2))->status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Send("", 0, RandomBytes(2))->status().code(), absl::StatusCode::kInvalidArgument);
  auto no_header = std::make_unique<TestPart>(core_, "alice", std::chrono::seconds(60));
  ASSERT_TRUE(no_header->Deliver(Chunk("xy")));
  ASSERT_TRUE(no_header->WaitFinished());
  EXPECT_EQ(no_header->status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status created;
  core_.CreateUpload("alice", {.rows = 0, .cols = 3}, /*transient=*/false,
                     [&](const absl::Status& s, const ResidentMatrix&) { created = s; });
  EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(created.message().find("header.rows"), std::string::npos) << created;
}

TEST_F(PartSessionTest, AnotherClientsUploadIsNotFound) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(2, 4, &upload).ok());
  auto foreign = Send(upload.handle, 0, RandomBytes(16), "mallory");
  EXPECT_EQ(foreign->status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(foreign->status().message().find("does not exist"), std::string::npos)
      << foreign->status();
  EXPECT_EQ(Send(upload.handle, 0, RandomBytes(16))->missing(), 0);  // untouched for its owner
}

TEST_F(PartSessionTest, MorePartsThanTheLimitAreRefused) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(1, 10, &upload).ok());
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(Send(upload.handle, 2 * i, RandomBytes(2))->status().ok());
  auto fifth = Send(upload.handle, 8, RandomBytes(2));
  EXPECT_EQ(fifth->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fifth->status().message().find("its 4 parts"), std::string::npos) << fifth->status();
}

TEST_F(PartSessionTest, AnAbandonedUploadIsReclaimed) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(64, 64, &upload).ok());
  EXPECT_EQ(store_.ClientBytes("alice"), 64 * 64 * 2);
  ASSERT_TRUE(Send(upload.handle, 0, RandomBytes(100))->status().ok());
  // No part for upload_idle_timeout (1 s): the quota and the memory come back.
  for (int i = 0; i < 200 && store_.ClientBytes("alice") > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(store_.ClientBytes("alice"), 0);
  EXPECT_EQ(store_.UsageByDevice()[0].bytes, 0);
  ResidentMatrix m;
  absl::Status gone = store_.Lookup("alice", upload.handle, "a_handle", &m);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.message().find("got no part in time"), std::string::npos) << gone;
  EXPECT_EQ(Send(upload.handle, 100, RandomBytes(2))->status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PartSessionTest, AnIdlePartIsDroppedAndGivesItsRangeBack) {
  ResidentMatrix upload;
  ASSERT_TRUE(Create(1, 8, &upload).ok());
  auto idle = std::make_unique<TestPart>(core_, "alice", std::chrono::seconds(60));
  ASSERT_TRUE(idle->Deliver(Header(upload.handle, 0, 16)));
  ASSERT_TRUE(idle->Deliver(Chunk(RandomBytes(3))));
  idle->session().ExpireIdle(Clock::now() + std::chrono::seconds(1));
  ASSERT_TRUE(idle->WaitFinished());
  EXPECT_EQ(idle->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Send(upload.handle, 0, RandomBytes(16))->missing(), 0);
}

}  // namespace
}  // namespace hgemm
