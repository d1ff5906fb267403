#include "server/resident/matrix_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "server/backend/cpu_backend.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;

class MatrixStoreTest : public ::testing::Test {
 protected:
  // 1 MiB of resident memory in all: sixteen 256x128 matrices (64 KiB each).
  std::unique_ptr<Backend> backend_ = MakeCpuBackend({.resident_budget_bytes = 1 << 20});

  ResidentMatrix Put(MatrixStore& store, const std::string& owner, uint32_t rows = 256,
                     uint32_t cols = 128, std::chrono::seconds ttl = 0s) {
    std::shared_ptr<ResidentBuffer> buffer;
    grpc::Status s = store.Allocate(owner, -1, rows, cols, &buffer);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return {};
    return store.Add(owner, rows, cols, std::move(buffer), ttl, "test");
  }
};

TEST_F(MatrixStoreTest, LifecycleAndUseAfterRelease) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix m = Put(store, "alice");
  EXPECT_EQ(m.handle.size(), 34u);  // "m-" + 128 bits in hex
  ResidentMatrix found;
  ASSERT_TRUE(store.Lookup("alice", m.handle, "a_handle", &found).ok());
  EXPECT_EQ(found.rows, 256u);
  EXPECT_EQ(store.ClientBytes("alice"), 65536);
  int64_t freed = 0;
  ASSERT_TRUE(store.Release("alice", m.handle, &freed).ok());
  EXPECT_EQ(freed, 65536);
  grpc::Status s = store.Lookup("alice", m.handle, "a_handle", &found);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("was released"), std::string::npos) << s.error_message();
  EXPECT_EQ(store.ClientBytes("alice"), 0);
}

TEST_F(MatrixStoreTest, UnknownHandleIsNotFoundAndForeignIsDenied) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix found;
  EXPECT_EQ(store.Lookup("alice", "m-nope", "b_handle", &found).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ResidentMatrix m = Put(store, "alice");
  EXPECT_EQ(store.Lookup("mallory", m.handle, "b_handle", &found).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  int64_t freed;
  EXPECT_EQ(store.Release("mallory", m.handle, &freed).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(MatrixStoreTest, QuotaPerClient) {
  MatrixStore store(backend_.get(), {.quota_bytes_per_client = 3 * 65536});
  for (int i = 0; i < 3; ++i) Put(store, "alice");
  std::shared_ptr<ResidentBuffer> buffer;
  grpc::Status s = store.Allocate("alice", -1, 256, 128, &buffer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("quota"), std::string::npos);
  EXPECT_TRUE(store.Allocate("bob", -1, 256, 128, &buffer).ok());  // others are not affected
}

TEST_F(MatrixStoreTest, FullBudgetIsResourceExhaustedWithoutEviction) {
  MatrixStore store(backend_.get(), {});
  for (int i = 0; i < 16; ++i) Put(store, "client" + std::to_string(i));
  std::shared_ptr<ResidentBuffer> buffer;
  EXPECT_EQ(store.Allocate("late", -1, 256, 128, &buffer).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(MatrixStoreTest, LruEvictionFreesLeastRecentlyUsed) {
  MatrixStore store(backend_.get(), {.lru_eviction = true});
  std::vector<std::string> handles;  // handles only: a held buffer could not be freed
  for (int i = 0; i < 16; ++i) handles.push_back(Put(store, "alice").handle);
  {
    ResidentMatrix touched;
    std::this_thread::sleep_for(2ms);
    ASSERT_TRUE(store.Lookup("alice", handles[0], "a", &touched).ok());  // 0 is now the newest
  }
  Put(store, "bob");  // evicts the least recently used: handles[1]
  ResidentMatrix found;
  grpc::Status s = store.Lookup("alice", handles[1], "a_handle", &found);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("evicted"), std::string::npos) << s.error_message();
  EXPECT_TRUE(store.Lookup("alice", handles[0], "a", &found).ok());
}

TEST_F(MatrixStoreTest, TimeToLiveExpires) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix m = Put(store, "alice", 2, 2, 1s);
  ResidentMatrix kept = Put(store, "alice", 2, 2);
  ResidentMatrix found;
  std::this_thread::sleep_for(1100ms);
  grpc::Status s = store.Lookup("alice", m.handle, "a_handle", &found);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("expired"), std::string::npos) << s.error_message();
  EXPECT_TRUE(store.Lookup("alice", kept.handle, "a", &found).ok());
  EXPECT_EQ(store.List("alice").size(), 1u);
}

TEST_F(MatrixStoreTest, ReleasedBufferLivesWhileInUse) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix m = Put(store, "alice");
  ResidentMatrix in_use;
  ASSERT_TRUE(store.Lookup("alice", m.handle, "a", &in_use).ok());  // a GEMM holds it
  int64_t freed;
  ASSERT_TRUE(store.Release("alice", m.handle, &freed).ok());
  static_cast<char*>(in_use.buffer->data)[65535] = 1;  // still valid memory
  EXPECT_EQ(in_use.buffer->bytes, 65536);
}

}  // namespace
}  // namespace hgemm
