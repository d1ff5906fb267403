#include "server/session/arriving_buffer.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <string>

#include "server/backend/cpu_backend.h"
#include "server/core/status.h"

namespace hgemm {
namespace {

// How a buffer settled, once.
struct Outcome {
  std::mutex mu;
  std::condition_variable changed;
  int calls = 0;
  absl::Status status;
  std::shared_ptr<ResidentBuffer> buffer;

  ArrivingBuffer::Settled Callback() {
    return [this](const absl::Status& s, std::shared_ptr<ResidentBuffer> b, double) {
      std::lock_guard<std::mutex> lock(mu);
      calls++;
      status = s;
      buffer = std::move(b);
      changed.notify_all();
    };
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(20), [this] { return calls > 0; });
  }
};

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string bytes(n, '\0');
  for (char& c : bytes) c = char(rng() | 1);  // never all zeros
  return bytes;
}

class ArrivingBufferTest : public ::testing::Test {
 protected:
  // An allocation that waits for `go` (so pieces can arrive before the buffer exists).
  ArrivingBuffer::Allocate AllocateAfter(std::shared_future<void> go, int64_t bytes) {
    return [this, go, bytes](std::shared_ptr<ResidentBuffer>* buffer) {
      go.wait();
      return backend_->AllocateResident(0, bytes, buffer);
    };
  }
  std::string Read(const ResidentBuffer& buffer) {
    std::string host(buffer.bytes, '\0');
    EXPECT_TRUE(backend_->ReadResident(buffer, host.data()).ok());
    return host;
  }

  std::unique_ptr<Backend> backend_ = MakeCpuBackend({.workers = 1});
  UploadQueue uploads_{backend_.get(), 2};
  std::mt19937_64 rng_{7};
};

TEST_F(ArrivingBufferTest, PiecesBeforeAndAfterTheAllocationAllLand) {
  const std::string bytes = RandomBytes(4000, rng_);
  std::promise<void> go;
  Outcome outcome;
  auto arriving = ArrivingBuffer::Start(&uploads_, bytes.size(),
                                        AllocateAfter(go.get_future().share(), bytes.size()),
                                        outcome.Callback());
  arriving->Add(1000, bytes.substr(1000, 1000));  // before the buffer exists: held
  arriving->Add(3000, bytes.substr(3000));
  go.set_value();
  arriving->Add(0, bytes.substr(0, 1000));
  arriving->Add(2000, bytes.substr(2000, 1000));
  ASSERT_TRUE(outcome.Wait());
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  ASSERT_NE(outcome.buffer, nullptr);
  EXPECT_EQ(Read(*outcome.buffer), bytes);
  EXPECT_EQ(outcome.calls, 1);
}

TEST_F(ArrivingBufferTest, AFailedAllocationSettlesOnceAndLaterPiecesAreDropped) {
  Outcome outcome;
  auto arriving = ArrivingBuffer::Start(
      &uploads_, 100,
      [](std::shared_ptr<ResidentBuffer>*) {
        return status::OverLimit("device_memory", "no memory (test)");
      },
      outcome.Callback());
  ASSERT_TRUE(outcome.Wait());
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(outcome.buffer, nullptr);
  arriving->Add(0, RandomBytes(100, rng_));
  arriving->Drop(status::Cancelled());
  EXPECT_EQ(outcome.calls, 1);
}

TEST_F(ArrivingBufferTest, DropSettlesWithItsReasonAndNoBuffer) {
  Outcome outcome;
  auto arriving = ArrivingBuffer::Start(
      &uploads_, 100, AllocateAfter(std::async([] {}).share(), 100), outcome.Callback());
  arriving->Add(0, RandomBytes(50, rng_));
  arriving->Drop(status::Idle("idle (test)"));
  ASSERT_TRUE(outcome.Wait());
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(outcome.buffer, nullptr);
  arriving->Add(50, RandomBytes(50, rng_));  // after the drop: ignored
  EXPECT_EQ(outcome.calls, 1);
}

TEST_F(ArrivingBufferTest, DropDuringTheAllocationSettlesWhenItReturns) {
  std::promise<void> go;
  Outcome outcome;
  auto arriving = ArrivingBuffer::Start(&uploads_, 100, AllocateAfter(go.get_future().share(), 100),
                                        outcome.Callback());
  arriving->Drop(status::Cancelled());
  {
    std::lock_guard<std::mutex> lock(outcome.mu);
    EXPECT_EQ(outcome.calls, 0) << "settled while the allocation was still running";
  }
  go.set_value();
  ASSERT_TRUE(outcome.Wait());
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(outcome.buffer, nullptr);
}

}  // namespace
}  // namespace hgemm
