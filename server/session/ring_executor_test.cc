// RingExecutor over real memfds (registered regions) with the CPU backend: this test plays the
// client, writing entries and the SQ tail into the ring and reading completions back, and also
// plays a hostile one that scribbles over the ring.
#include "server/session/ring_executor.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"
#include "server/backend/cpu_backend.h"
#include "server/testing/core_regions.h"
#include "server/testing/gated_backend.h"
#include "server/testing/memfd.h"

namespace hgemm {
namespace {

constexpr uint16_t kHalfNan = 0x7e00;
constexpr auto kPatience = std::chrono::seconds(20);

// A memfd of this process, registered as a region of `owner` and mapped here.
class MappedRegion {
 public:
  MappedRegion(GemmCore& core, const std::string& owner, int64_t bytes)
      : file_(bytes), bytes_(bytes) {
    EXPECT_GE(file_.fd(), 0);
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file_.fd(), 0);
    EXPECT_NE(base, MAP_FAILED);
    base_ = static_cast<uint8_t*>(base);
    RegionInfo info;
    EXPECT_TRUE(
        RegisterMemfdNow(core, owner, ThisProcess(), file_.path(), bytes, "test", &info).ok());
    handle_ = info.handle;
  }
  ~MappedRegion() { munmap(base_, bytes_); }
  uint8_t* base() const { return base_; }
  uint16_t* half(uint64_t offset) const { return reinterpret_cast<uint16_t*>(base_ + offset); }
  const std::string& handle() const { return handle_; }

 private:
  TestMemfd file_;
  int64_t bytes_;
  uint8_t* base_ = nullptr;
  std::string handle_;
};

// The client's side of a ring in a MappedRegion, without wake-ups (it wakes the server after
// each publish, and polls for completions).
class TestRing {
 public:
  TestRing(GemmCore& core, const std::string& owner, uint32_t sq, uint32_t cq)
      : region_(core, owner, int64_t(RingBytes(sq, cq))), sq_entries_(sq), cq_entries_(cq) {
    header()->magic = kRingMagic;
    header()->version = kRingVersion;
  }
  RingHeader* header() const { return reinterpret_cast<RingHeader*>(region_.base()); }
  RingSubmission* sq() const {
    return reinterpret_cast<RingSubmission*>(region_.base() + RingSqOffset());
  }
  RingCompletion* cq() const {
    return reinterpret_cast<RingCompletion*>(region_.base() + RingCqOffset(sq_entries_));
  }
  RingSpec Spec(std::vector<std::string> regions, std::vector<std::string> matrices = {}) const {
    return {region_.handle(), sq_entries_, cq_entries_, std::move(regions), std::move(matrices)};
  }
  const std::string& handle() const { return region_.handle(); }

  void Submit(const RingSubmission& entry) {
    while (sq_tail_ - header()->sq_head.load() >= sq_entries_) std::this_thread::yield();
    sq()[sq_tail_ & (sq_entries_ - 1)] = entry;
    header()->sq_tail.store(++sq_tail_);
    RingWakeSleeper(&header()->server_sleeping);
  }
  // The next completion, or nothing within kPatience.
  std::optional<RingCompletion> Next() {
    const auto give_up = std::chrono::steady_clock::now() + kPatience;
    while (header()->cq_tail.load() == cq_head_) {
      if (std::chrono::steady_clock::now() > give_up) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    RingCompletion c = cq()[cq_head_ & (cq_entries_ - 1)];
    header()->cq_head.store(++cq_head_);
    RingWakeSleeper(&header()->server_sleeping);
    return c;
  }

 private:
  MappedRegion region_;
  uint32_t sq_entries_, cq_entries_;
  uint32_t sq_tail_ = 0, cq_head_ = 0;
};

RingOperand InRegion(uint32_t slot, uint64_t offset) { return {kRingOperandRegion, slot, offset}; }

// What the ring's on_detached reported: its code and message as plain values (absl's
// shared status payload, uninstrumented, would look like a race to TSan).
struct Detached {
  absl::StatusCode code;
  std::string message;
};
struct DetachReport {
  std::mutex mu;
  std::condition_variable changed;
  std::optional<Detached> reason;  // guarded by mu

  RingDetached Callback() {
    return [this](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      reason = Detached{s.code(), std::string(s.message())};
      changed.notify_all();
    };
  }
  std::optional<Detached> Await() {
    std::unique_lock<std::mutex> lock(mu);
    changed.wait_for(lock, kPatience, [&] { return reason.has_value(); });
    return reason;
  }
  bool Seen() {
    std::lock_guard<std::mutex> lock(mu);
    return reason.has_value();
  }
};

class RingExecutorTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kM = 48, kN = 40, kK = 56;
  static constexpr uint64_t kA = 0, kB = 2 * kM * kK, kC = kB + 2 * kK * kN;
  static constexpr int64_t kDataBytes = int64_t(kC + 2 * kM * kN);

  explicit RingExecutorTest(
      std::unique_ptr<Backend> backend = MakeCpuBackend({.workers = 2}),
      SchedulerOptions scheduler = {.idle_spin = std::chrono::microseconds(0)})
      : backend_(std::move(backend)), scheduler_(backend_.get(), scheduler) {}

  // Fresh random A and B (never zeros), C poisoned.
  void Fill(const MappedRegion& data) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (uint32_t i = 0; i < kM * kK; ++i) data.half(kA)[i] = FloatToHalf(value(rng_));
    for (uint32_t i = 0; i < kK * kN; ++i) data.half(kB)[i] = FloatToHalf(value(rng_));
    for (uint32_t i = 0; i < kM * kN; ++i) data.half(kC)[i] = kHalfNan;
  }
  double Error(const MappedRegion& data) {
    std::vector<float> reference = ReferenceGemm(data.half(kA), data.half(kB), kM, kN, kK);
    return RelativeFrobeniusError(data.half(kC), reference.data(), int64_t(reference.size()));
  }
  static RingSubmission Good(uint64_t user_data) {
    RingSubmission e{};
    e.user_data = user_data;
    e.m = kM;
    e.n = kN;
    e.k = kK;
    e.a = InRegion(0, kA);
    e.b = InRegion(0, kB);
    e.c = InRegion(0, kC);
    return e;
  }
  std::shared_ptr<RingExecutor> Attach(const TestRing& ring, const RingSpec& spec,
                                       DetachReport* detached, const std::string& owner = "alice") {
    std::shared_ptr<RingExecutor> executor;
    absl::Status s = RingExecutor::Attach(&core_, &registry_, owner, true, spec, nullptr,
                                          detached->Callback(), &executor);
    EXPECT_TRUE(s.ok()) << s;
    return executor;
  }

  // Unregisters alice's region `handle`, as over her Unix socket.
  absl::Status Unregister(const std::string& handle, int64_t* freed) {
    return core_.UnregisterRegion("alice", /*over_unix_socket=*/true, handle, freed);
  }

  std::unique_ptr<Backend> backend_;
  MatrixStore store_{backend_.get(), {}};
  Scheduler scheduler_;
  UploadQueue uploads_{backend_.get(), 1};
  GemmCore core_{&scheduler_, backend_.get(), &store_, &uploads_,
                 GemmCoreOptions{.rules = {.kernels = backend_->Kernels()},
                                 .regions = {.allow_shared_memory = true}}};
  RingRegistry registry_{{.spin_us = 20, .max_in_flight = 4, .max_rings_per_owner = 2}};
  std::mt19937 rng_{31};
};

TEST_F(RingExecutorTest, GemmThroughTheRingMatchesTheReference) {
  MappedRegion data(core_, "alice", kDataBytes);
  TestRing ring(core_, "alice", 8, 8);
  DetachReport detached;
  auto executor = Attach(ring, ring.Spec({data.handle()}), &detached);
  ASSERT_NE(executor, nullptr);
  for (uint64_t round = 1; round <= 3; ++round) {
    Fill(data);
    ring.Submit(Good(round));
    std::optional<RingCompletion> done = ring.Next();
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->user_data, round);
    ASSERT_EQ(done->code, 0) << done->message;
    EXPECT_LT(Error(data), 1e-3);
    EXPECT_GT(done->server_total_ms, 0.0f);
  }
  executor->Stop();
  EXPECT_FALSE(detached.Seen());
}

TEST_F(RingExecutorTest, BadEntriesCompleteWithTheirErrorAndTheRingGoesOn) {
  MappedRegion data(core_, "alice", kDataBytes);
  MappedRegion foreign(core_, "mallory", kDataBytes);
  TestRing ring(core_, "alice", 16, 16);
  DetachReport detached;
  auto executor = Attach(ring, ring.Spec({data.handle(), foreign.handle()}), &detached);
  ASSERT_NE(executor, nullptr);
  struct Case {
    const char* what;
    RingSubmission entry;
    absl::StatusCode code;
    const char* field;  // in the message
  };
  std::vector<Case> cases;
  auto with = [](auto change) {
    RingSubmission e = Good(0);
    change(e);
    return e;
  };
  cases.push_back(
      {"m = 0", with([](RingSubmission& e) { e.m = 0; }), absl::StatusCode::kInvalidArgument, "m"});
  cases.push_back({"unbound region slot", with([](RingSubmission& e) { e.b.slot = 7; }),
                   absl::StatusCode::kInvalidArgument, "b.slot"});
  cases.push_back({"unbound matrix slot", with([](RingSubmission& e) {
                     e.a = {kRingOperandMatrix, 0, 0};
                   }),
                   absl::StatusCode::kInvalidArgument, "a.slot"});
  cases.push_back({"unknown kind", with([](RingSubmission& e) { e.a.kind = 9; }),
                   absl::StatusCode::kInvalidArgument, "a.kind"});
  cases.push_back({"C nowhere", with([](RingSubmission& e) { e.c.kind = kRingOperandNone; }),
                   absl::StatusCode::kInvalidArgument, "c.kind"});
  cases.push_back({"dtype", with([](RingSubmission& e) { e.dtype = 77; }),
                   absl::StatusCode::kInvalidArgument, "dtype"});
  cases.push_back({"kernel index", with([](RingSubmission& e) { e.kernel = 100000; }),
                   absl::StatusCode::kInvalidArgument, "kernel"});
  cases.push_back({"flags", with([](RingSubmission& e) { e.flags = 0x80; }),
                   absl::StatusCode::kInvalidArgument, "flags"});
  cases.push_back({"another owner's region", with([](RingSubmission& e) { e.a.slot = 1; }),
                   absl::StatusCode::kNotFound, "a_region"});
  cases.push_back({"C past the end", with([](RingSubmission& e) { e.c.offset = kC + 16; }),
                   absl::StatusCode::kOutOfRange, "c_region"});
  cases.push_back({"offset that overflows",
                   with([](RingSubmission& e) { e.a.offset = UINT64_MAX - 15; }),
                   absl::StatusCode::kOutOfRange, "a_region"});
  cases.push_back({"odd offset", with([](RingSubmission& e) { e.b.offset = kB + 1; }),
                   absl::StatusCode::kInvalidArgument, "b_region"});
  cases.push_back({"C off the 16-byte alignment",
                   with([](RingSubmission& e) { e.c.offset = kC - 2; }),
                   absl::StatusCode::kInvalidArgument, "c_region"});
  cases.push_back({"beta without C_in", with([](RingSubmission& e) { e.beta = 1; }),
                   absl::StatusCode::kInvalidArgument, "beta"});
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].what);
    cases[i].entry.user_data = 100 + i;
    Fill(data);
    ring.Submit(cases[i].entry);
    std::optional<RingCompletion> done = ring.Next();
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->user_data, 100 + i);
    EXPECT_EQ(absl::StatusCode(done->code), cases[i].code) << done->message;
    EXPECT_NE(std::string(done->message).find(cases[i].field), std::string::npos) << done->message;
    EXPECT_EQ(data.half(kC)[0], kHalfNan) << "C was written";
    // The ring keeps working after each.
    ring.Submit(Good(1000 + i));
    done = ring.Next();
    ASSERT_TRUE(done.has_value());
    ASSERT_EQ(done->code, 0) << done->message;
    EXPECT_LT(Error(data), 1e-3);
  }
  executor->Stop();
}

TEST_F(RingExecutorTest, AttachRefusesBadSizesForeignRingsAndTooManyRings) {
  TestRing ring(core_, "alice", 8, 8);
  DetachReport detached;
  std::shared_ptr<RingExecutor> executor;
  auto attach = [&](RingSpec spec, const std::string& owner = "alice", bool unix_socket = true) {
    return RingExecutor::Attach(&core_, &registry_, owner, unix_socket, spec, nullptr,
                                detached.Callback(), &executor);
  };
  RingSpec spec = ring.Spec({});
  spec.sq_entries = 6;
  EXPECT_EQ(attach(spec).code(), absl::StatusCode::kInvalidArgument);
  spec = ring.Spec({});
  spec.cq_entries = 16;  // the region holds 8
  EXPECT_EQ(attach(spec).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(attach(ring.Spec({}), "mallory").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(attach(ring.Spec({}), "alice", false).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(attach(ring.Spec({""})).code(), absl::StatusCode::kInvalidArgument);
  ring.header()->magic = 0x1234;
  EXPECT_EQ(attach(ring.Spec({})).code(), absl::StatusCode::kInvalidArgument);
  ring.header()->magic = kRingMagic;
  std::vector<std::shared_ptr<RingExecutor>> rings;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(attach(ring.Spec({})).ok());
    rings.push_back(executor);
  }
  EXPECT_EQ(attach(ring.Spec({})).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_.Attached(), 2);
  rings[0]->Stop();
  EXPECT_EQ(registry_.Attached(), 1);
  EXPECT_TRUE(attach(ring.Spec({})).ok());
  executor->Stop();
  rings[1]->Stop();
  EXPECT_EQ(registry_.Attached(), 0);
}

TEST_F(RingExecutorTest, ATailTooFarAheadDetachesTheRingAndOthersKeepWorking) {
  MappedRegion data(core_, "alice", kDataBytes);
  TestRing bad(core_, "alice", 8, 8), good(core_, "alice", 8, 8);
  DetachReport bad_detached, good_detached;
  auto bad_ring = Attach(bad, bad.Spec({data.handle()}), &bad_detached);
  auto good_ring = Attach(good, good.Spec({data.handle()}), &good_detached);
  bad.header()->sq_tail.store(bad.header()->sq_head.load() + 1000);
  RingWakeSleeper(&bad.header()->server_sleeping);
  std::optional<Detached> reason = bad_detached.Await();
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(reason->code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reason->message.find("sq_tail"), std::string::npos) << reason->message;
  EXPECT_EQ(registry_.Attached(), 1);
  Fill(data);
  good.Submit(Good(5));
  std::optional<RingCompletion> done = good.Next();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code, 0) << done->message;
  EXPECT_LT(Error(data), 1e-3);
  bad_ring->Stop();
  good_ring->Stop();
}

TEST_F(RingExecutorTest, ACqHeadPastTheTailDetachesTheRing) {
  MappedRegion data(core_, "alice", kDataBytes);
  TestRing ring(core_, "alice", 8, 8);
  DetachReport detached;
  auto executor = Attach(ring, ring.Spec({data.handle()}), &detached);
  ring.header()->cq_head.store(12345);
  ring.Submit(Good(1));  // the server looks at the CQ head before taking it
  std::optional<Detached> reason = detached.Await();
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(reason->code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reason->message.find("cq_head"), std::string::npos) << reason->message;
  executor->Stop();
}

// A client that writes garbage over its whole ring, over and over, while the server serves
// it: the server never crashes nor hangs; it either completes garbage entries with errors or
// detaches the ring, and another ring keeps working meanwhile.
TEST_F(RingExecutorTest, GarbageOverTheWholeRingNeverHurtsTheServer) {
  MappedRegion data(core_, "alice", kDataBytes);
  TestRing hostile(core_, "alice", 4, 4), good(core_, "alice", 8, 8);
  DetachReport hostile_detached, good_detached;
  auto hostile_ring =
      Attach(hostile, hostile.Spec({data.handle()}, {"m-nothing"}), &hostile_detached);
  auto good_ring = Attach(good, good.Spec({data.handle()}), &good_detached);
  std::mt19937_64 noise(7);
  uint8_t* bytes = reinterpret_cast<uint8_t*>(hostile.header());
  RingHeader* h = hostile.header();
  int plausible_rounds = 0;
  for (int round = 0; round < 300 && !hostile_detached.Seen(); ++round) {
    // Garbage over the entries every round, over the header too every 50th.
    const uint64_t from = round % 50 == 49 ? 0 : RingSqOffset();
    for (uint64_t i = from; i + 8 <= RingBytes(4, 4); i += 8) {
      const uint64_t word = noise();
      std::memcpy(bytes + i, &word, 8);
    }
    if (from > 0) {  // a tail and head that pass, so the garbage entries get taken
      h->cq_head.store(h->cq_tail.load());
      h->sq_tail.store(h->sq_head.load() + 1 + uint32_t(noise() % 4));
      ++plausible_rounds;
    }
    RingWakeSleeper(&h->server_sleeping);
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  EXPECT_GT(plausible_rounds, 10);
  Fill(data);
  good.Submit(Good(9));
  std::optional<RingCompletion> done = good.Next();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code, 0) << done->message;
  EXPECT_LT(Error(data), 1e-3);
  hostile_ring->Stop();
  good_ring->Stop();
}

TEST_F(RingExecutorTest, StoppingReleasesTheRingRegionAndTheSlots) {
  MappedRegion data(core_, "alice", kDataBytes);
  TestRing ring(core_, "alice", 8, 8);
  DetachReport detached;
  auto executor = Attach(ring, ring.Spec({data.handle()}), &detached);
  int64_t freed = 0;
  EXPECT_EQ(Unregister(ring.handle(), &freed).code(), absl::StatusCode::kFailedPrecondition)
      << "the attached ring holds its region";
  executor->Stop();
  executor.reset();
  // The ring thread lets go of the region as it ends.
  const auto give_up = std::chrono::steady_clock::now() + kPatience;
  absl::Status s;
  while (!(s = Unregister(ring.handle(), &freed)).ok() &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(Unregister(data.handle(), &freed).ok()) << "a bound slot holds nothing";
  EXPECT_EQ(registry_.Attached(), 0);
  EXPECT_FALSE(detached.Seen());
}

// One worker held at a gate, a queue of one: the third GEMM finds the queue full.
class RingExecutorFullQueueTest : public RingExecutorTest {
 protected:
  RingExecutorFullQueueTest()
      : RingExecutorTest(std::make_unique<GatedBackend>(MakeCpuBackend({.workers = 1})),
                         {.max_queued_requests = 1, .idle_spin = std::chrono::microseconds(0)}) {}
  GatedBackend& gate() { return static_cast<GatedBackend&>(*backend_); }
};

TEST_F(RingExecutorFullQueueTest, AFullQueueCompletesTheEntryUnavailable) {
  MappedRegion data(core_, "alice", kDataBytes);
  TestRing ring(core_, "alice", 8, 8);
  DetachReport detached;
  auto executor = Attach(ring, ring.Spec({data.handle()}), &detached);
  Fill(data);
  ring.Submit(Good(1));  // runs, held at the gate
  gate().AwaitWaiting();
  ring.Submit(Good(2));  // queued
  ring.Submit(Good(3));  // refused
  std::optional<RingCompletion> done = ring.Next();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->user_data, 3u);
  EXPECT_EQ(absl::StatusCode(done->code), absl::StatusCode::kUnavailable) << done->message;
  gate().Open();
  for (uint64_t expected : {1, 2}) {
    done = ring.Next();
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->user_data, expected);
    EXPECT_EQ(done->code, 0) << done->message;
  }
  EXPECT_LT(Error(data), 1e-3);
  executor->Stop();
}

}  // namespace
}  // namespace hgemm
