#include "server/scheduler/upload_queue.h"

#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <thread>

#include "server/backend/cpu_backend.h"

namespace hgemm {
namespace {

TEST(UploadQueueTest, ChunksLandAtTheirOffsetsAndTheTallyCompletesOnce) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({});
  constexpr int kChunks = 64, kChunkBytes = 1000;
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(backend->AllocateResident(0, kChunks * kChunkBytes, &buffer).ok());
  std::string expected(kChunks * kChunkBytes, '\0');
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = char('a' + i * 7 % 26);

  std::mutex mu;
  WriteTally tally(expected.size());
  int completions = 0;
  std::promise<void> all_written;
  {
    UploadQueue queue(backend.get(), 3);
    for (int c = kChunks - 1; c >= 0; --c) {  // any order: the offsets say where
      queue.Write(buffer, int64_t(c) * kChunkBytes, expected.substr(c * kChunkBytes, kChunkBytes),
                  [&](const absl::Status& s, double copy_ms) {
                    EXPECT_GE(copy_ms, 0);
                    std::lock_guard<std::mutex> lock(mu);
                    if (tally.Add(s, kChunkBytes, copy_ms)) {
                      completions++;
                      all_written.set_value();
                    }
                  });
    }
    all_written.get_future().wait();
  }
  EXPECT_EQ(completions, 1);
  EXPECT_TRUE(tally.error().ok());
  EXPECT_EQ(std::string(static_cast<const char*>(buffer->data), buffer->bytes), expected);
}

TEST(UploadQueueTest, DestructionFinishesQueuedWrites) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({});
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(backend->AllocateResident(0, 100, &buffer).ok());
  std::atomic<int> done{0};
  {
    UploadQueue queue(backend.get(), 1);
    for (int i = 0; i < 100; ++i) {
      queue.Write(buffer, i, std::string("x"),
                  [&](const absl::Status& s, double) { done += s.ok(); });
    }
  }
  EXPECT_EQ(done, 100);
  EXPECT_EQ(std::string(static_cast<const char*>(buffer->data), 100), std::string(100, 'x'));
}

TEST(UploadQueueTest, TallyKeepsTheFirstError) {
  WriteTally tally(30);
  EXPECT_FALSE(tally.Add(absl::OkStatus(), 10, 1.0));
  EXPECT_FALSE(tally.Add(absl::Status(absl::StatusCode::kInternal, "first"), 10, 2.0));
  EXPECT_TRUE(tally.Add(absl::Status(absl::StatusCode::kInternal, "second"), 10, 3.0));
  EXPECT_EQ(tally.error().message(), "first");
  EXPECT_DOUBLE_EQ(tally.copy_ms(), 6.0);
}

// Device work the transport must not do on a reactor thread runs on an upload thread, and a
// task that throws does not take that thread down with it.
TEST(UploadQueueTest, PostedWorkRunsOnAnUploadThread) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({});
  UploadQueue queue(backend.get(), 1);
  queue.Post([] { throw std::runtime_error("a bug in posted work"); });
  std::promise<std::thread::id> ran_on;
  queue.Post([&] { ran_on.set_value(std::this_thread::get_id()); });
  EXPECT_NE(ran_on.get_future().get(), std::this_thread::get_id());
}

}  // namespace
}  // namespace hgemm
