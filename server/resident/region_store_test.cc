#include "server/resident/region_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include "server/backend/cpu_backend.h"
#include "server/testing/forwarding_backend.h"
#include "server/testing/memfd.h"

namespace hgemm {
namespace {

using Memfd = TestMemfd;

RegionStoreOptions Allowed() { return {.allow_shared_memory = true}; }

TEST(RegionStore, RegisterAcquireUnregister) {
  RegionStore store(Allowed());
  Memfd file(4096);
  ASSERT_EQ(pwrite(file.fd(), "\x01\x02\x03\x04", 4, 96), 4);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "weights", &info).ok());
  EXPECT_EQ(info.bytes, 4096);
  EXPECT_EQ(info.handle.rfind("r-", 0), 0u);
  {
    RegionLease lease;
    ASSERT_TRUE(store.Acquire("alice", info.handle, 96, 4, "a_region", &lease).ok());
    EXPECT_EQ(lease.data()[2], 3);  // the client's bytes, through the mapping
    lease.data()[0] = 9;            // and writes reach the client's file
    uint8_t back = 0;
    ASSERT_EQ(pread(file.fd(), &back, 1, 96), 1);
    EXPECT_EQ(back, 9);
  }
  ASSERT_EQ(store.List("alice").size(), 1u);
  EXPECT_EQ(store.OwnerBytes("alice"), 4096);
  int64_t freed = 0;
  ASSERT_TRUE(store.Unregister("alice", info.handle, &freed).ok());
  EXPECT_EQ(freed, 4096);
  EXPECT_TRUE(store.List("alice").empty());
  RegionLease lease;
  EXPECT_EQ(store.Acquire("alice", info.handle, 0, 2, "a_region", &lease).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Unregister("alice", info.handle, &freed).code(), absl::StatusCode::kNotFound);
}

TEST(RegionStore, BoundsAtTheEndAndOnePast) {
  RegionStore store(Allowed());
  Memfd file(1008);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 1008, "", &info).ok());
  RegionLease lease;
  EXPECT_TRUE(store.Acquire("alice", info.handle, 0, 1008, "a_region", &lease).ok());
  EXPECT_TRUE(store.Acquire("alice", info.handle, 992, 16, "a_region", &lease).ok());
  EXPECT_TRUE(store.Acquire("alice", info.handle, 1008, 0, "a_region", &lease).ok());
  absl::Status s = store.Acquire("alice", info.handle, 992, 18, "a_region", &lease);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("a_region"), std::string::npos) << s;
  EXPECT_EQ(store.Acquire("alice", info.handle, 0, 1009, "b_region", &lease).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store.Acquire("alice", info.handle, 1024, 0, "c_region", &lease).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(RegionStore, OffsetsThatOverflow64Bits) {
  RegionStore store(Allowed());
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  RegionLease lease;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  for (uint64_t offset : {max - 1, max - 4095, uint64_t{1} << 63, max - 2}) {
    EXPECT_EQ(store
                  .Acquire("alice", info.handle, offset & ~(kRegionAlignment - 1), 4096, "a_region",
                           &lease)
                  .code(),
              absl::StatusCode::kOutOfRange)
        << offset;
  }
  EXPECT_EQ(store
                .Acquire("alice", info.handle, 16, std::numeric_limits<int64_t>::max(), "a_region",
                         &lease)
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(lease.empty());
}

TEST(RegionStore, ForeignRegionReadsLikeNone) {
  RegionStore store(Allowed());
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  RegionLease lease;
  absl::Status foreign = store.Acquire("mallory", info.handle, 0, 2, "a_region", &lease);
  absl::Status never = store.Acquire("mallory", "r-0123", 0, 2, "a_region", &lease);
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound);
  // The same words as a handle that never existed, but for the handle itself.
  std::string words(foreign.message());
  words.replace(words.find(info.handle), info.handle.size(), "r-0123");
  EXPECT_EQ(words, std::string(never.message()));
  int64_t freed = 0;
  EXPECT_EQ(store.Unregister("mallory", info.handle, &freed).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.List("mallory").empty());
  EXPECT_EQ(store.List("alice").size(), 1u);
}

TEST(RegionStore, UnregisterWhileLeasedIsRefused) {
  RegionStore store(Allowed());
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  RegionLease lease;
  ASSERT_TRUE(store.Acquire("alice", info.handle, 0, 4096, "a_region", &lease).ok());
  int64_t freed = 0;
  absl::Status s = store.Unregister("alice", info.handle, &freed);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(freed, 0);
  lease.data()[4095] = 1;  // still mapped
  lease.Release();
  EXPECT_TRUE(store.Unregister("alice", info.handle, &freed).ok());
}

TEST(RegionStore, UnsealedMemfdIsRefused) {
  RegionStore store(Allowed());
  Memfd file(4096, /*seal_shrink=*/false);
  RegionInfo info;
  absl::Status s = store.Register("alice", ThisProcess(), file.path(), 4096, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("F_SEAL_SHRINK"), std::string::npos) << s;
  // A regular file can't be sealed at all.
  FILE* tmp = tmpfile();
  ASSERT_NE(tmp, nullptr);
  ASSERT_EQ(ftruncate(fileno(tmp), 4096), 0);
  s = store.Register("alice", ThisProcess(), "/proc/self/fd/" + std::to_string(fileno(tmp)), 4096,
                     "", &info);
  fclose(tmp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;  // not /proc/<pid>/fd/<fd>
  EXPECT_TRUE(store.List("alice").empty());
}

TEST(RegionStore, RegularFileIsRefused) {
  RegionStore store(Allowed());
  FILE* tmp = tmpfile();
  ASSERT_NE(tmp, nullptr);
  ASSERT_EQ(ftruncate(fileno(tmp), 4096), 0);
  RegionInfo info;
  absl::Status s = store.Register(
      "alice", ThisProcess(),
      "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fileno(tmp)), 4096, "", &info);
  fclose(tmp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(RegionStore, BadPathsAndSizes) {
  RegionStore store(Allowed());
  Memfd file(4096);
  RegionInfo info;
  for (const std::string& path : {std::string("/etc/passwd"), std::string("/proc/1/fd/"),
                                  std::string("/proc/self/fd/0"), file.path() + "/x"}) {
    EXPECT_EQ(store.Register("alice", ThisProcess(), path, 4096, "", &info).code(),
              absl::StatusCode::kInvalidArgument)
        << path;
  }
  EXPECT_EQ(store.Register("alice", ThisProcess(), file.path(), 0, "", &info).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Register("alice", ThisProcess(), file.path(), 4097, "", &info).code(),
            absl::StatusCode::kInvalidArgument);  // larger than the file
}

TEST(RegionStore, TruncatingASealedMemfdFailsAndTheMappingStays) {
  RegionStore store(Allowed());
  Memfd file(1 << 20);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 1 << 20, "", &info).ok());
  EXPECT_NE(ftruncate(file.fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(fcntl(file.fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);  // mapped writable: EBUSY
  RegionLease lease;
  ASSERT_TRUE(store.Acquire("alice", info.handle, 0, 1 << 20, "a_region", &lease).ok());
  lease.data()[(1 << 20) - 1] = 7;  // the last page is still there: no SIGBUS
  EXPECT_EQ(lease.data()[(1 << 20) - 1], 7);
}

TEST(RegionStore, Quotas) {
  RegionStore store(
      {.allow_shared_memory = true, .max_regions_per_owner = 2, .max_bytes_per_owner = 8192});
  Memfd a(4096), b(4096), c(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), a.path(), 4096, "", &info).ok());
  EXPECT_EQ(store.Register("alice", ThisProcess(), b.path(), 4097, "", &info).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Register("alice", ThisProcess(), b.path(), 4096, "", &info).ok());
  absl::Status s = store.Register("alice", ThisProcess(), c.path(), 2, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ASSERT_TRUE(store.Register("bob", ThisProcess(), c.path(), 4096, "", &info).ok());  // per owner
  // One account's principals ("uid:N/id:X") share its quota: naming oneself anew escapes none.
  RegionStore accounts({.allow_shared_memory = true, .max_regions_per_owner = 1});
  ASSERT_TRUE(accounts.Register("uid:7/id:a", ThisProcess(), a.path(), 4096, "", &info).ok());
  s = accounts.Register("uid:7/id:b", ThisProcess(), b.path(), 4096, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(accounts.Register("uid:8", ThisProcess(), b.path(), 4096, "", &info).ok());
  EXPECT_EQ(accounts.OwnerBytes("uid:7/id:b"), 4096);
  RegionStore bytes({.allow_shared_memory = true, .max_bytes_per_owner = 6000});
  ASSERT_TRUE(bytes.Register("alice", ThisProcess(), a.path(), 4096, "", &info).ok());
  s = bytes.Register("alice", ThisProcess(), b.path(), 4096, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(bytes.Register("alice", ThisProcess(), b.path(), 1904, "", &info).ok());
}

TEST(RegionStore, UnusedRegionsExpireLeasedOnesStay) {
  RegionStore store({.allow_shared_memory = true, .ttl = std::chrono::seconds(1)});
  Memfd a(4096), b(4096);
  RegionInfo idle, held;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), a.path(), 4096, "", &idle).ok());
  ASSERT_TRUE(store.Register("alice", ThisProcess(), b.path(), 4096, "", &held).ok());
  RegionLease lease;
  ASSERT_TRUE(store.Acquire("alice", held.handle, 0, 2, "a_region", &lease).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::vector<RegionInfo> left = store.List("alice");
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].handle, held.handle);
}

// A backend that pins host memory as CUDA's does (or fails to, with `pin_error`), and records
// what is pinned now; an unpin checks that the memory is still mapped (it reads it).
class PinRecorder final : public ForwardingBackend {
 public:
  explicit PinRecorder(absl::Status pin_error = absl::OkStatus())
      : ForwardingBackend(MakeCpuBackend({})), pin_error_(std::move(pin_error)) {}
  absl::Status PinHostMemory(void* data, int64_t bytes, std::function<void()>* unpin) override {
    ++pin_calls;
    if (!pin_error_.ok()) return pin_error_;
    ++pinned;
    *unpin = [this, data, bytes] {
      volatile const uint8_t* last = static_cast<const uint8_t*>(data) + bytes - 1;
      last_byte_at_unpin = *last;  // SIGSEGV if it were already unmapped
      --pinned;
    };
    return absl::OkStatus();
  }
  int pin_calls = 0;
  int pinned = 0;
  int last_byte_at_unpin = -1;

 private:
  const absl::Status pin_error_;
};

// Pinned once at registration; a lease says so; unpinned once, when the region is
// unregistered after its last lease, before it is unmapped.
TEST(RegionStore, PinnedAtRegistrationUnpinnedAfterTheLastLease) {
  PinRecorder backend;
  RegionStore store(Allowed(), &backend);
  Memfd file(4096);
  ASSERT_EQ(pwrite(file.fd(), "\x2a", 1, 4095), 1);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  EXPECT_TRUE(info.dma);
  EXPECT_EQ(backend.pinned, 1);
  RegionLease lease;
  ASSERT_TRUE(store.Acquire("alice", info.handle, 0, 2, "a_region", &lease).ok());
  EXPECT_TRUE(lease.pinned());
  int64_t freed = 0;
  EXPECT_EQ(store.Unregister("alice", info.handle, &freed).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend.pinned, 1);
  lease.Release();
  EXPECT_EQ(backend.pinned, 1);  // still registered
  ASSERT_TRUE(store.Unregister("alice", info.handle, &freed).ok());
  EXPECT_EQ(backend.pinned, 0);
  EXPECT_EQ(backend.last_byte_at_unpin, 0x2a);
  EXPECT_EQ(backend.pin_calls, 1);
  EXPECT_EQ(store.StagedRegions(), 0);
}

// Pinning turned off (--pin_shared_memory=false): nothing pinned, no failure counted.
TEST(RegionStore, PinningTurnedOff) {
  PinRecorder backend;
  RegionStore store({.allow_shared_memory = true, .pin_for_dma = false}, &backend);
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  EXPECT_FALSE(info.dma);
  EXPECT_EQ(backend.pin_calls, 0);
  EXPECT_EQ(store.StagedRegions(), 0);
}

// A failed pin leaves a working region that goes through staging, counted as such.
TEST(RegionStore, FailedPinFallsBackToStagingAndIsCounted) {
  PinRecorder backend(absl::ResourceExhaustedError("cudaHostRegister: out of memory"));
  RegionStore store(Allowed(), &backend);
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  EXPECT_FALSE(info.dma);
  EXPECT_TRUE(info.dma_failed);
  EXPECT_EQ(store.StagedRegions(), 1);
  RegionLease lease;
  ASSERT_TRUE(store.Acquire("alice", info.handle, 0, 2, "a_region", &lease).ok());
  EXPECT_FALSE(lease.pinned());
  lease.Release();
  int64_t freed = 0;
  ASSERT_TRUE(store.Unregister("alice", info.handle, &freed).ok());
  EXPECT_EQ(store.StagedRegions(), 0);
}

// A backend with nothing to pin (the CPU's UNIMPLEMENTED) is no failure.
TEST(RegionStore, BackendWithoutPinningIsNoFailure) {
  auto cpu = MakeCpuBackend({});
  RegionStore store(Allowed(), cpu.get());
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  EXPECT_FALSE(info.dma);
  EXPECT_FALSE(info.dma_failed);
  EXPECT_EQ(store.StagedRegions(), 0);
}

// Over the quota: refused before anything is pinned.
TEST(RegionStore, OverTheQuotaNothingIsPinned) {
  PinRecorder backend;
  RegionStore store({.allow_shared_memory = true, .max_bytes_per_owner = 4096}, &backend);
  Memfd a(4096), b(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), a.path(), 4096, "", &info).ok());
  EXPECT_EQ(store.Register("alice", ThisProcess(), b.path(), 4096, "", &info).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend.pin_calls, 1);
  EXPECT_EQ(backend.pinned, 1);
}

TEST(RegionStore, AllowedOnlyWhenOnAndOverAUnixSocket) {
  EXPECT_EQ(RegionStore({}).CheckAllowed(true).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RegionStore(Allowed()).CheckAllowed(false).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(RegionStore(Allowed()).CheckAllowed(true).ok());
}

// Another process's memfd is never registered, and its refusal is the same whether or not the
// descriptor exists (no oracle for finding them).
TEST(RegionStore, AnotherProcesssMemfdIsRefused) {
  OtherProcessMemfd victim;
  ASSERT_GT(victim.pid(), 0);
  ASSERT_GE(victim.fd(), 0);
  RegionStore store(Allowed());
  RegionInfo info;
  const absl::Status real =
      store.Register("mallory", ThisProcess(), victim.path(), 4096, "", &info);
  EXPECT_EQ(real.code(), absl::StatusCode::kPermissionDenied) << real;
  const absl::Status none =
      store.Register("mallory", ThisProcess(), victim.path(97), 4096, "", &info);
  EXPECT_EQ(none.code(), real.code()) << none;
  EXPECT_TRUE(store.List("mallory").empty());
  // The victim itself may register it.
  const RegisteringProcess owner{.pid = victim.pid(), .alive = [] { return true; }};
  EXPECT_TRUE(store.Register("victim", owner, victim.path(), 4096, "", &info).ok());
}

// A caller that has exited (its pid may be another process's by now) registers nothing, even
// when the path names its pid; without pidfds nothing is registered at all.
TEST(RegionStore, ExitedCallerOrNoPidfdIsRefused) {
  OtherProcessMemfd victim;
  ASSERT_GT(victim.pid(), 0);
  RegionStore store(Allowed());
  RegionInfo info;
  const RegisteringProcess gone{.pid = victim.pid(), .alive = [] { return false; }};
  absl::Status s = store.Register("mallory", gone, victim.path(), 4096, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  Memfd file(4096);
  s = store.Register("alice", {.pid = getpid()}, file.path(), 4096, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(store.List("mallory").empty());
  EXPECT_TRUE(store.List("alice").empty());
}

// A hugetlb memfd can lose a page under the mapping (SIGBUS on the server's next touch): only
// tmpfs memfds are accepted.
TEST(RegionStore, HugetlbMemfdIsRefused) {
  constexpr int64_t kHuge = int64_t{2} << 20;
  Memfd file(kHuge, /*seal_shrink=*/true, /*allocate=*/false, MFD_HUGETLB);
  if (file.fd() < 0) GTEST_SKIP() << "this kernel makes no hugetlb memfds";
  RegionStore store(Allowed());
  RegionInfo info;
  absl::Status s = store.Register("alice", ThisProcess(), file.path(), kHuge, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("tmpfs"), std::string::npos) << s;
}

// Pages the client never allocated would be allocated by the server (pinning faults them in,
// charged to the server): a sparse memfd is refused, with what to do about it.
TEST(RegionStore, SparseMemfdIsRefused) {
  PinRecorder backend;
  RegionStore store(Allowed(), &backend);
  Memfd sparse(1 << 20, /*seal_shrink=*/true, /*allocate=*/false);
  ASSERT_EQ(pwrite(sparse.fd(), "x", 1, 0), 1);  // the first page only
  RegionInfo info;
  absl::Status s = store.Register("alice", ThisProcess(), sparse.path(), 1 << 20, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("fallocate"), std::string::npos) << s;
  EXPECT_EQ(backend.pin_calls, 0);
  ASSERT_EQ(fallocate(sparse.fd(), 0, 0, 1 << 20), 0);
  EXPECT_TRUE(store.Register("alice", ThisProcess(), sparse.path(), 1 << 20, "", &info).ok());
}

// Offsets off the 16-byte alignment (fp32 C at 2 mod 4 would make the device fault) are
// refused; aligned ones pass.
TEST(RegionStore, MisalignedOffsetsAreRefused) {
  RegionStore store(Allowed());
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  RegionLease lease;
  for (uint64_t offset : {1, 2, 4, 8, 18, 4094}) {
    absl::Status s = store.Acquire("alice", info.handle, offset, 2, "c_region", &lease);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << offset << " " << s;
    EXPECT_NE(s.message().find("c_region.offset"), std::string::npos) << s;
  }
  EXPECT_TRUE(store.Acquire("alice", info.handle, 4080, 16, "c_region", &lease).ok());
}

// All accounts' host regions together stay under max_host_bytes (memory the server pins).
TEST(RegionStore, ServerWideCapOnHostBytes) {
  RegionStore store({.allow_shared_memory = true, .max_host_bytes = 8192});
  Memfd a(4096), b(4096), c(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("uid:1", ThisProcess(), a.path(), 4096, "", &info).ok());
  ASSERT_TRUE(store.Register("uid:2", ThisProcess(), b.path(), 4096, "", &info).ok());
  absl::Status s = store.Register("uid:3", ThisProcess(), c.path(), 4096, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--max_region_bytes_total"), std::string::npos) << s;
}

// A backend whose first pin waits until released: a registration in the middle of mapping.
class SlowFirstPin final : public ForwardingBackend {
 public:
  SlowFirstPin() : ForwardingBackend(MakeCpuBackend({})) {}
  absl::Status PinHostMemory(void*, int64_t, std::function<void()>*) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (calls_++ == 0) {
      first_waiting_ = true;
      changed_.notify_all();
      changed_.wait(lock, [this] { return released_; });
    }
    return absl::OkStatus();
  }
  void AwaitFirst() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return first_waiting_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int calls_ = 0;
  bool first_waiting_ = false, released_ = false;
};

// A registration holds its share of the quota while it maps and pins: a concurrent one that
// would pass the quota with it is refused at once.
TEST(RegionStore, ConcurrentRegistrationsReserveTheirQuota) {
  SlowFirstPin backend;
  RegionStore store({.allow_shared_memory = true, .max_bytes_per_owner = 4096}, &backend);
  Memfd a(4096), b(4096);
  RegionInfo first, second;
  absl::Status first_status;
  std::thread registering(
      [&] { first_status = store.Register("alice", ThisProcess(), a.path(), 4096, "", &first); });
  backend.AwaitFirst();
  absl::Status s = store.Register("alice", ThisProcess(), b.path(), 4096, "", &second);
  backend.Release();
  registering.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(first_status.ok()) << first_status;
  EXPECT_EQ(store.List("alice").size(), 1u);
}

// A backend whose unpinning calls back into the store (as a slow cudaHostUnregister holds up
// whoever runs it): expiry must unpin and unmap after releasing the lock every GEMM takes.
class UnpinCallsTheStore final : public ForwardingBackend {
 public:
  UnpinCallsTheStore() : ForwardingBackend(MakeCpuBackend({})) {}
  absl::Status PinHostMemory(void*, int64_t, std::function<void()>* unpin) override {
    *unpin = [this] { bytes_seen_at_unpin = store->OwnerBytes("alice"); };
    return absl::OkStatus();
  }
  RegionStore* store = nullptr;
  int64_t bytes_seen_at_unpin = -1;
};

TEST(RegionStore, ExpiryUnpinsOutsideTheStoresLock) {
  UnpinCallsTheStore backend;
  RegionStore store({.allow_shared_memory = true, .ttl = std::chrono::seconds(1)}, &backend);
  backend.store = &store;
  Memfd file(4096);
  RegionInfo info;
  ASSERT_TRUE(store.Register("alice", ThisProcess(), file.path(), 4096, "", &info).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(store.List("alice").empty());  // expires it: would deadlock under the lock
  EXPECT_EQ(backend.bytes_seen_at_unpin, 0);
}

// CUDA IPC regions only where the operator let trusted clients in (--allow_cuda_ipc).
TEST(RegionStore, CudaIpcIsOffByDefault) {
  auto cpu = MakeCpuBackend({});
  RegionStore store(Allowed(), cpu.get());
  RegionInfo info;
  absl::Status s = store.RegisterCudaIpc("alice", std::string(64, 'h'), "GPU-0", 4096, "", &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--allow_cuda_ipc"), std::string::npos) << s;
}

}  // namespace
}  // namespace hgemm
