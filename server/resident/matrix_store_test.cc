#include "server/resident/matrix_store.h"

#include <gtest/gtest.h>

#include <atomic>
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
    QuotaReservation quota;
    absl::Status s = store.Allocate(owner, -1, rows, cols, &buffer, &quota);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return {};
    return store.Add(std::move(quota), rows, cols, ElementType::kFp16, std::move(buffer), ttl,
                     "test");
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
  absl::Status s = store.Lookup("alice", m.handle, "a_handle", &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("was released"), std::string::npos) << s.message();
  EXPECT_EQ(store.ClientBytes("alice"), 0);
}

// With a replica address (--advertise_address) every handle names it; a handle naming another
// replica is NOT_FOUND saying where it lives.
TEST_F(MatrixStoreTest, HandlesNameTheReplica) {
  MatrixStore store(backend_.get(), {.replica = "hgemm-1.hgemm.ns.svc.cluster.local:50051"});
  ResidentMatrix m = Put(store, "alice");
  EXPECT_EQ(m.handle.substr(34), "@hgemm-1.hgemm.ns.svc.cluster.local:50051");
  ResidentMatrix found;
  ASSERT_TRUE(store.Lookup("alice", m.handle, "a_handle", &found).ok());

  const std::string elsewhere =
      m.handle.substr(0, 34) + "@hgemm-2.hgemm.ns.svc.cluster.local:50051";
  absl::Status s = store.Lookup("alice", elsewhere, "a_handle", &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("lives on replica 'hgemm-2.hgemm.ns.svc.cluster.local:50051'"),
            std::string::npos)
      << s.message();
  // Without a replica address, handles are as they always were, and a replica's is foreign.
  MatrixStore single(backend_.get(), {});
  EXPECT_EQ(Put(single, "alice").handle.find('@'), std::string::npos);
  s = single.Lookup("alice", m.handle, "a_handle", &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("which advertises no address"), std::string::npos) << s.message();
}

// No existence oracle: another owner's handle, live or released, reads like one never issued.
TEST_F(MatrixStoreTest, ForeignHandleIsNotFoundLikeAnUnknownOne) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix found;
  const std::string unknown = "m-00000000000000000000000000000000";
  absl::Status never = store.Lookup("alice", unknown, "b_handle", &found);
  EXPECT_EQ(never.code(), absl::StatusCode::kNotFound);
  auto with_handle_of = [&](const absl::Status& s, const std::string& handle) {
    std::string message(s.message());
    message.replace(message.find(handle), handle.size(), unknown);
    return message;
  };
  ResidentMatrix m = Put(store, "alice");
  absl::Status foreign = store.Lookup("mallory", m.handle, "b_handle", &found);
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(with_handle_of(foreign, m.handle), never.message());
  int64_t freed = 0;
  absl::Status release = store.Release("mallory", m.handle, &freed);
  EXPECT_EQ(release.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(with_handle_of(release, m.handle), store.Release("mallory", unknown, &freed).message());
  EXPECT_TRUE(store.Lookup("alice", m.handle, "b_handle", &found).ok());  // still there
  ASSERT_TRUE(store.Release("alice", m.handle, &freed).ok());
  foreign = store.Lookup("mallory", m.handle, "b_handle", &found);
  EXPECT_EQ(with_handle_of(foreign, m.handle), never.message());  // not "was released"
}

TEST_F(MatrixStoreTest, AnyOwnerReleasesAndListAllSeesEveryOwner) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix a = Put(store, "alice");
  Put(store, "bob");
  EXPECT_EQ(store.List("alice").size(), 1u);
  EXPECT_EQ(store.ListAll().size(), 2u);
  int64_t freed = 0;
  ASSERT_TRUE(store.Release("admin", a.handle, &freed, /*any_owner=*/true).ok());
  EXPECT_EQ(freed, a.buffer->bytes);
  EXPECT_EQ(store.ClientBytes("alice"), 0);
  EXPECT_EQ(store.ListAll().size(), 1u);
}

TEST_F(MatrixStoreTest, QuotaPerClient) {
  MatrixStore store(backend_.get(), {.quota_bytes_per_client = 3 * 65536});
  for (int i = 0; i < 3; ++i) Put(store, "alice");
  std::shared_ptr<ResidentBuffer> buffer;
  QuotaReservation quota;
  absl::Status s = store.Allocate("alice", -1, 256, 128, &buffer, &quota);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("quota"), std::string::npos);
  EXPECT_TRUE(store.Allocate("bob", -1, 256, 128, &buffer, &quota).ok());  // others unaffected
}

// The quota is taken when an upload starts, not when its matrix is added, so
// two uploads in progress can't both pass it; an upload that fails gives its bytes back.
TEST_F(MatrixStoreTest, QuotaIsReservedAtAdmission) {
  MatrixStore store(backend_.get(), {.quota_bytes_per_client = 65536 + 1000});
  std::shared_ptr<ResidentBuffer> first, second;
  QuotaReservation first_quota, second_quota;
  ASSERT_TRUE(store.Allocate("alice", -1, 256, 128, &first, &first_quota).ok());
  EXPECT_EQ(store.ClientBytes("alice"), 65536);
  EXPECT_EQ(store.Allocate("alice", -1, 256, 128, &second, &second_quota).code(),
            absl::StatusCode::kResourceExhausted);
  QuotaReservation c;
  EXPECT_EQ(store.Reserve("alice", 2000, &c).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Reserve("alice", 1000, &c).ok());
  { QuotaReservation dropped = std::move(c); }  // e.g. the GEMM that would keep C failed
  EXPECT_EQ(store.ClientBytes("alice"), 65536);
  { QuotaReservation abandoned = std::move(first_quota); }  // the upload broke off
  EXPECT_EQ(store.ClientBytes("alice"), 0);
  ASSERT_TRUE(store.Allocate("alice", -1, 256, 128, &second, &second_quota).ok());
  ResidentMatrix m =
      store.Add(std::move(second_quota), 256, 128, ElementType::kFp16, second, 0s, "kept");
  EXPECT_EQ(store.ClientBytes("alice"), 65536);
  int64_t freed = 0;
  ASSERT_TRUE(store.Release("alice", m.handle, &freed).ok());
  EXPECT_EQ(store.ClientBytes("alice"), 0);
}

// Item 13: a huge client-supplied handle is quoted by a short prefix only.
TEST_F(MatrixStoreTest, MessagesQuoteAShortPrefixOfHandles) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix found;
  absl::Status s = store.Lookup("alice", std::string(100000, 'h'), "handle", &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(s.message().size(), 200u) << s.message();
  EXPECT_NE(s.message().find("(100000 bytes)"), std::string::npos) << s.message();
}

// Concurrent uploads of one client never hold more than its quota between them.
TEST_F(MatrixStoreTest, ConcurrentAllocationsStayWithinQuota) {
  MatrixStore store(backend_.get(), {.quota_bytes_per_client = 4 * 65536});
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  std::vector<QuotaReservation> quotas(8);
  std::vector<std::shared_ptr<ResidentBuffer>> buffers(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      if (store.Allocate("alice", -1, 256, 128, &buffers[i], &quotas[i]).ok()) admitted++;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(admitted.load(), 4);
  EXPECT_EQ(store.ClientBytes("alice"), 4 * 65536);
}

TEST_F(MatrixStoreTest, FullBudgetIsResourceExhaustedWithoutEviction) {
  MatrixStore store(backend_.get(), {});
  for (int i = 0; i < 16; ++i) Put(store, "client" + std::to_string(i));
  std::shared_ptr<ResidentBuffer> buffer;
  QuotaReservation quota;
  EXPECT_EQ(store.Allocate("late", -1, 256, 128, &buffer, &quota).code(),
            absl::StatusCode::kResourceExhausted);
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
  absl::Status s = store.Lookup("alice", handles[1], "a_handle", &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("evicted"), std::string::npos) << s.message();
  EXPECT_TRUE(store.Lookup("alice", handles[0], "a", &found).ok());
}

TEST_F(MatrixStoreTest, TimeToLiveExpires) {
  MatrixStore store(backend_.get(), {});
  ResidentMatrix m = Put(store, "alice", 2, 2, 1s);
  ResidentMatrix kept = Put(store, "alice", 2, 2);
  ResidentMatrix found;
  std::this_thread::sleep_for(1100ms);
  absl::Status s = store.Lookup("alice", m.handle, "a_handle", &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("expired"), std::string::npos) << s.message();
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

namespace hgemm {
namespace {

// Uploads by parts: claims, coverage, the TTL that applies before and after completion.
TEST_F(MatrixStoreTest, AnUploadByPartsCountsLandedPartsOnly) {
  MatrixStore store(backend_.get(), {.default_ttl = 0s, .upload_idle_timeout = 30s});
  std::shared_ptr<ResidentBuffer> buffer;
  QuotaReservation quota;
  ASSERT_TRUE(store.Allocate("alice", -1, 4, 8, &buffer, &quota).ok());
  ResidentMatrix m = store.AddUpload(std::move(quota), 4, 8, ElementType::kFp16, std::move(buffer),
                                     0s, "parts", false);
  EXPECT_EQ(m.missing_bytes, 64);
  EXPECT_EQ(m.ttl, 30s);  // until complete
  std::shared_ptr<ResidentBuffer> claimed;
  ASSERT_TRUE(store.BeginPart("alice", m.handle, 0, 40, "header", &claimed).ok());
  EXPECT_EQ(store.BeginPart("alice", m.handle, 39, 2, "header", &claimed).code(),
            absl::StatusCode::kInvalidArgument);
  int64_t missing = 0;
  ASSERT_TRUE(store.EndPart("alice", m.handle, 0, 40, false, &missing).ok());  // failed: free
  EXPECT_EQ(missing, 64);
  ASSERT_TRUE(store.BeginPart("alice", m.handle, 39, 25, "header", &claimed).ok());
  ASSERT_TRUE(store.EndPart("alice", m.handle, 39, 25, true, &missing).ok());
  EXPECT_EQ(missing, 39);
  ASSERT_TRUE(store.BeginPart("alice", m.handle, 0, 39, "header", &claimed).ok());
  ASSERT_TRUE(store.EndPart("alice", m.handle, 0, 39, true, &missing).ok());
  EXPECT_EQ(missing, 0);
  ResidentMatrix found;
  ASSERT_TRUE(store.Lookup("alice", m.handle, "a_handle", &found).ok());
  EXPECT_EQ(found.ttl, 0s);  // complete: its own (the default, no expiry)
  EXPECT_EQ(found.missing_bytes, 0);
}

TEST_F(MatrixStoreTest, TransientMatricesExpireAfterTheUploadIdleTimeout) {
  MatrixStore store(backend_.get(), {.default_ttl = 3600s, .upload_idle_timeout = 1s});
  std::shared_ptr<ResidentBuffer> buffer;
  QuotaReservation quota;
  ASSERT_TRUE(store.Allocate("alice", -1, 16, 16, &buffer, &quota).ok());
  ResidentMatrix m = store.Add(std::move(quota), 16, 16, ElementType::kFp16, std::move(buffer),
                               3600s, "C", /*transient=*/true);
  EXPECT_TRUE(m.transient);
  EXPECT_EQ(m.ttl, 1s);
  for (int i = 0; i < 200 && store.ClientBytes("alice") > 0; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(store.ClientBytes("alice"), 0);
  ResidentMatrix found;
  absl::Status s = store.Lookup("alice", m.handle, "a_handle", &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("was transient and unused"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace hgemm
