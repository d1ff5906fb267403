// Submission rings end to end over a real Unix socket (in a temporary directory) with the CPU
// backend: RingClient (client/ring_client.h) against HgemmServer, operands and C in real
// memfds, and raw AttachRing calls for what a well-behaved client never does.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "client/ring_client.h"
#include "client/shared_region.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"
#include "proto/ring_execution.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/child_process.h"

namespace hgemm {
namespace {

constexpr uint16_t kHalfNan = 0x7e00;

class RingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/hgemm_ring_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.more_listen_addresses = {"unix:" + dir_ + "/hgemm.sock"};
    options.service.regions.allow_shared_memory = true;
    options.service.rings = {.spin_us = 20, .max_in_flight = 8, .max_rings_per_owner = 4};
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>("unix:" + dir_ + "/hgemm.sock");
    tcp_ = std::make_unique<GemmClient>("127.0.0.1:" + std::to_string(server_->port()));
    call_.client_id = "alice";
  }
  void TearDown() override {
    client_.reset();
    tcp_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A registered region of `bytes`, mapped here.
  std::unique_ptr<SharedRegion> Region(int64_t bytes, std::string* handle) {
    std::string error;
    auto region = SharedRegion::Create(bytes, &error);
    EXPECT_NE(region, nullptr) << error;
    v1::RegionInfo info;
    grpc::Status s = client_->RegisterRegion(region->path(), bytes, "data", &info, call_);
    EXPECT_TRUE(s.ok()) << s.error_message();
    *handle = info.region();
    return region;
  }
  void FillRandom(uint16_t* values, int64_t count) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (int64_t i = 0; i < count; ++i) values[i] = FloatToHalf(value(rng_));
  }
  static uint16_t* Half(const SharedRegion& region, uint64_t offset) {
    return reinterpret_cast<uint16_t*>(region.data() + offset);
  }
  static RingSubmission Entry(uint32_t m, uint32_t n, uint32_t k, RingOperand a, RingOperand b,
                              RingOperand c) {
    RingSubmission e{};
    e.m = m;
    e.n = n;
    e.k = k;
    e.a = a;
    e.b = b;
    e.c = c;
    return e;
  }
  std::unique_ptr<RingClient> Attach(const std::vector<std::string>& regions,
                                     const std::vector<std::string>& matrices = {},
                                     uint32_t entries = 16) {
    grpc::Status s;
    RingClientOptions options{
        .sq_entries = entries, .cq_entries = entries, .spin_us = 20, .call = call_};
    auto ring = RingClient::Attach(*client_, regions, matrices, options, &s);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return ring;
  }
  // The ring region's leases as ListRegions says (1 while attached), or -1 if it is gone.
  int RegionInUse(const std::string& handle) {
    v1::ListRegionsResponse list;
    EXPECT_TRUE(client_->ListRegions(&list, call_).ok());
    for (const v1::RegionInfo& r : list.regions()) {
      if (r.region() == handle) return int(r.in_use());
    }
    return -1;
  }

  std::string dir_;
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_, tcp_;
  CallOptions call_;
  std::mt19937 rng_{2026};
};

TEST_F(RingTest, GemmsThroughTheRingMatchTheReference) {
  constexpr uint32_t m = 67, n = 45, k = 129;
  constexpr uint64_t a_at = 0, b_at = SharedRegion::AlignPart(2 * m * k);
  constexpr uint64_t c_at = b_at + SharedRegion::AlignPart(2 * k * n);
  std::string data_handle;
  auto data = Region(int64_t(c_at + 2 * m * n), &data_handle);
  // B also as a resident matrix, in matrix slot 0.
  std::vector<uint16_t> b_resident(k * n);
  FillRandom(b_resident.data(), k * n);
  v1::MatrixInfo matrix;
  ASSERT_TRUE(client_
                  ->UploadMatrix(k, n,
                                 {reinterpret_cast<const char*>(b_resident.data()), 2 * k * n},
                                 &matrix, 0, "", call_)
                  .ok());
  auto ring = Attach({data_handle}, {matrix.handle()});
  ASSERT_NE(ring, nullptr);
  EXPECT_GT(ring->attached().max_in_flight(), 0u);
  EXPECT_EQ(ring->KernelIndex("auto"), 0);
  for (bool resident_b : {false, true, false}) {
    SCOPED_TRACE(resident_b ? "B resident" : "B in the region");
    FillRandom(Half(*data, a_at), m * k);
    FillRandom(Half(*data, b_at), k * n);
    std::fill_n(Half(*data, c_at), m * n, kHalfNan);
    RingSubmission e = Entry(m, n, k, {kRingOperandRegion, 0, a_at},
                             resident_b ? RingOperand{kRingOperandMatrix, 0, 0}
                                        : RingOperand{kRingOperandRegion, 0, b_at},
                             {kRingOperandRegion, 0, c_at});
    RingCompletion done{};
    grpc::Status s = ring->Gemm(e, &done);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_GT(done.server_total_ms, 0.0f);
    const uint16_t* b = resident_b ? b_resident.data() : Half(*data, b_at);
    std::vector<float> reference = ReferenceGemm(Half(*data, a_at), b, m, n, k);
    EXPECT_LT(RelativeFrobeniusError(Half(*data, c_at), reference.data(), m * n), 1e-3);
  }
}

// All resident: A, B and C are resident matrices (C written in place), so a GEMM moves no
// bytes at all: what the ring is for on a GPU.
TEST_F(RingTest, AllResidentGemmWritesCInPlace) {
  constexpr uint32_t m = 40, n = 56, k = 72;
  std::vector<uint16_t> a(m * k), b(k * n), poison(m * n, kHalfNan);
  auto upload = [&](uint32_t rows, uint32_t cols, const std::vector<uint16_t>& values) {
    v1::MatrixInfo info;
    grpc::Status s = client_->UploadMatrix(
        rows, cols, {reinterpret_cast<const char*>(values.data()), values.size() * 2}, &info, 0, "",
        call_);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info.handle();
  };
  std::unique_ptr<RingClient> ring;
  for (int round = 0; round < 2; ++round) {
    FillRandom(a.data(), m * k);
    FillRandom(b.data(), k * n);
    // Fresh operands: uploaded again, bound again (a new ring over the new handles).
    const std::string a_handle = upload(m, k, a), b_handle = upload(k, n, b);
    const std::string c_handle = upload(m, n, poison);
    ring = Attach({}, {a_handle, b_handle, c_handle});
    ASSERT_NE(ring, nullptr);
    grpc::Status s = ring->Gemm(Entry(m, n, k, {kRingOperandMatrix, 0, 0},
                                      {kRingOperandMatrix, 1, 0}, {kRingOperandMatrix, 2, 0}));
    ASSERT_TRUE(s.ok()) << s.error_message();
    std::string c;
    ASSERT_TRUE(client_->DownloadMatrix(c_handle, &c, call_).ok());
    ASSERT_EQ(c.size(), size_t(2 * m * n));
    std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
    EXPECT_LT(RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()), reference.data(),
                                     m * n),
              1e-3);
  }
  // C's matrix may not be an operand too, and must have C's shape.
  grpc::Status s = ring->Gemm(Entry(m, n, k, {kRingOperandMatrix, 0, 0}, {kRingOperandMatrix, 1, 0},
                                    {kRingOperandMatrix, 0, 0}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("c_handle"), std::string::npos) << s.error_message();
  s = ring->Gemm(Entry(m, n, k, {kRingOperandMatrix, 0, 0}, {kRingOperandMatrix, 1, 0},
                       {kRingOperandMatrix, 1, 0}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RingTest, ManyThreadsShareOneRing) {
  constexpr uint32_t m = 32, n = 24, k = 40;
  constexpr int kThreads = 4, kPerThread = 30;
  constexpr uint64_t a_at = 0, b_at = 2 * m * k, c_base = b_at + 2 * k * n;
  constexpr uint64_t c_bytes = 2 * m * n;
  std::string data_handle;
  auto data = Region(int64_t(c_base + kThreads * c_bytes), &data_handle);
  FillRandom(Half(*data, a_at), m * k);
  FillRandom(Half(*data, b_at), k * n);
  std::vector<float> reference = ReferenceGemm(Half(*data, a_at), Half(*data, b_at), m, n, k);
  auto ring = Attach({data_handle});
  ASSERT_NE(ring, nullptr);
  std::vector<double> worst(kThreads, 0);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t c_at = c_base + t * c_bytes;
      for (int i = 0; i < kPerThread; ++i) {
        std::fill_n(Half(*data, c_at), m * n, kHalfNan);
        grpc::Status s =
            ring->Gemm(Entry(m, n, k, {kRingOperandRegion, 0, a_at}, {kRingOperandRegion, 0, b_at},
                             {kRingOperandRegion, 0, c_at}));
        if (!s.ok()) {
          ++failures[t];
          continue;
        }
        worst[t] =
            std::max(worst[t], RelativeFrobeniusError(Half(*data, c_at), reference.data(), m * n));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_LT(worst[t], 1e-3) << "thread " << t;
  }
}

TEST_F(RingTest, ABadEntryIsAnsweredAndTheRingGoesOn) {
  constexpr uint32_t m = 16, n = 16, k = 16;
  std::string data_handle;
  auto data = Region(3 * 2 * m * n, &data_handle);
  auto ring = Attach({data_handle});
  ASSERT_NE(ring, nullptr);
  grpc::Status s = ring->Gemm(Entry(m, n, k, {kRingOperandRegion, 3, 0},
                                    {kRingOperandRegion, 0, 512}, {kRingOperandRegion, 0, 1024}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("a.slot"), std::string::npos) << s.error_message();
  s = ring->Gemm(Entry(m, n, k, {kRingOperandRegion, 0, 0}, {kRingOperandRegion, 0, 512},
                       {kRingOperandRegion, 0, 1040}));  // C past the end
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(s.error_message().find("c_region"), std::string::npos) << s.error_message();
  FillRandom(Half(*data, 0), 2 * m * n);
  s = ring->Gemm(Entry(m, n, k, {kRingOperandRegion, 0, 0}, {kRingOperandRegion, 0, 512},
                       {kRingOperandRegion, 0, 1024}));
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(ring->detached().ok());
}

// A ring's completion says what ran its GEMM, as a Gemm call's answer does: completions used
// to carry timings only, and hgemm_client --transport=ring printed no kernel and no device.
TEST_F(RingTest, CompletionsNameTheKernelAndDeviceAsAGemmCallDoes) {
  constexpr uint32_t m = 21, n = 13, k = 34;
  constexpr uint64_t a_at = 0, b_at = SharedRegion::AlignPart(2 * m * k);
  constexpr uint64_t c_at = b_at + SharedRegion::AlignPart(2 * k * n);
  std::string data_handle;
  auto data = Region(int64_t(c_at + 2 * m * n), &data_handle);
  FillRandom(Half(*data, a_at), m * k);
  FillRandom(Half(*data, b_at), k * n);
  auto ring = Attach({data_handle});
  ASSERT_NE(ring, nullptr);
  RingCompletion done{};
  grpc::Status s = ring->Gemm(Entry(m, n, k, {kRingOperandRegion, 0, a_at},
                                    {kRingOperandRegion, 0, b_at}, {kRingOperandRegion, 0, c_at}),
                              &done);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Execution through_ring;
  ASSERT_TRUE(RingExecution(done, ring->attached(), &through_ring));

  v1::GemmRequest request;  // the same GEMM as a Gemm call, its operands as bytes
  request.set_m(m);
  request.set_n(n);
  request.set_k(k);
  request.set_a(reinterpret_cast<const char*>(Half(*data, a_at)), 2 * m * k);
  request.set_b(reinterpret_cast<const char*>(Half(*data, b_at)), 2 * k * n);
  v1::GemmResponse response;
  s = tcp_->Gemm(request, &response, call_);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::Execution& unary = response.execution();
  EXPECT_FALSE(through_ring.kernel().empty());
  EXPECT_EQ(through_ring.kernel(), unary.kernel());
  EXPECT_EQ(through_ring.accumulation(), unary.accumulation());
  EXPECT_EQ(through_ring.backend(), unary.backend());
  EXPECT_EQ(through_ring.device_id(), unary.device_id());
  EXPECT_FALSE(through_ring.device_name().empty());
  EXPECT_EQ(through_ring.device_name(), unary.device_name());
  EXPECT_GE(through_ring.stream_id(), 0);  // one of the CPU backend's 2 workers, as unary's
  EXPECT_LT(through_ring.stream_id(), 2);

  // A failed entry ran nowhere: its completion names nothing.
  RingCompletion failed{};
  s = ring->Gemm(Entry(m, n, k, {kRingOperandRegion, 7, 0}, {kRingOperandRegion, 0, b_at},
                       {kRingOperandRegion, 0, c_at}),
                 &failed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(failed.flags & kRingCompletionExecution, 0u);
  EXPECT_FALSE(RingExecution(failed, ring->attached(), &through_ring));
}

TEST_F(RingTest, AttachFollowsTheRulesOfSharedMemory) {
  std::string error;
  auto memory = SharedRegion::Create(int64_t(RingBytes(4, 4)), &error);
  ASSERT_NE(memory, nullptr);
  v1::RegionInfo info;
  ASSERT_TRUE(client_->RegisterRegion(memory->path(), memory->bytes(), "ring", &info, call_).ok());
  auto attach = [&](GemmClient& over, const std::string& client_id) {
    auto stub = v1::GemmService::NewStub(over.ChannelTo(""));
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", client_id);
    v1::AttachRingRequest request;
    request.set_ring_region(info.region());
    request.set_sq_entries(4);
    request.set_cq_entries(4);
    auto call = stub->AttachRing(&context, request);
    v1::RingEvent event;
    EXPECT_FALSE(call->Read(&event));
    return call->Finish();
  };
  std::memcpy(memory->data(), &kRingMagic, 4);
  std::memcpy(memory->data() + 4, &kRingVersion, 4);
  EXPECT_EQ(attach(*tcp_, "alice").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(attach(*client_, "mallory").error_code(), grpc::StatusCode::NOT_FOUND);
  std::memset(memory->data(), 0, 8);  // no magic
  grpc::Status s = attach(*client_, "alice");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("magic"), std::string::npos) << s.error_message();
}

// A client that scribbles over its ring's header: the server detaches that ring with the
// reason and keeps serving everyone else.
TEST_F(RingTest, AScribbledRingIsDetachedAndTheServerServesOthers) {
  constexpr uint32_t m = 16, n = 16, k = 16;
  std::string data_handle;
  auto data = Region(3 * 2 * m * n, &data_handle);
  FillRandom(Half(*data, 0), 2 * m * n);
  auto bad = Attach({data_handle}, {}, 8);  // its size tells its memfd apart
  auto good = Attach({data_handle});
  ASSERT_NE(bad, nullptr);
  ASSERT_NE(good, nullptr);
  // What a stray write does: an SQ tail far past the head. RingClient's mapping is its own:
  // reach the ring through the memfd of its size in /proc/self/fd.
  const uint64_t bad_bytes = RingBytes(8, 8);
  int scribbled = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || target.find("memfd:") == std::string::npos) continue;
    const int fd = std::stoi(entry.path().filename().string());
    if (lseek(fd, 0, SEEK_END) != off_t(bad_bytes)) continue;
    void* mapped = mmap(nullptr, bad_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    RingHeader* h = static_cast<RingHeader*>(mapped);
    h->sq_tail.store(h->sq_head.load() + 100000);
    RingWakeSleeper(&h->server_sleeping);
    munmap(mapped, bad_bytes);
    ++scribbled;
  }
  ASSERT_EQ(scribbled, 1);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (bad->detached().ok() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  grpc::Status s = bad->detached();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("INVALID_ARGUMENT"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("sq_tail"), std::string::npos) << s.error_message();
  // A GEMM on the detached ring gets the reason, not a hang.
  s = bad->Gemm(Entry(m, n, k, {kRingOperandRegion, 0, 0}, {kRingOperandRegion, 0, 512},
                      {kRingOperandRegion, 0, 1024}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("sq_tail"), std::string::npos) << s.error_message();
  s = good->Gemm(Entry(m, n, k, {kRingOperandRegion, 0, 0}, {kRingOperandRegion, 0, 512},
                       {kRingOperandRegion, 0, 1024}));
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<float> reference = ReferenceGemm(Half(*data, 0), Half(*data, 512), m, n, k);
  EXPECT_LT(RelativeFrobeniusError(Half(*data, 1024), reference.data(), m * n), 1e-3);
}

// The client ends the AttachRing call (as its process going away does): the ring is detached,
// its region let go (unregistered by RingClient), and the client can attach again.
TEST_F(RingTest, EndingTheCallReleasesTheRing) {
  std::string data_handle;
  auto data = Region(4096, &data_handle);
  std::string error;
  auto memory = SharedRegion::Create(int64_t(RingBytes(4, 4)), &error);
  ASSERT_NE(memory, nullptr);
  std::memcpy(memory->data(), &kRingMagic, 4);
  std::memcpy(memory->data() + 4, &kRingVersion, 4);
  v1::RegionInfo info;
  ASSERT_TRUE(client_->RegisterRegion(memory->path(), memory->bytes(), "ring", &info, call_).ok());
  auto stub = v1::GemmService::NewStub(client_->ChannelTo(""));
  {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", "alice");
    v1::AttachRingRequest request;
    request.set_ring_region(info.region());
    request.set_sq_entries(4);
    request.set_cq_entries(4);
    request.add_regions(data_handle);
    auto call = stub->AttachRing(&context, request);
    v1::RingEvent event;
    ASSERT_TRUE(call->Read(&event));
    EXPECT_EQ(RegionInUse(info.region()), 1) << "the attached ring holds its region";
    EXPECT_EQ(RegionInUse(data_handle), 0) << "a bound slot holds nothing";
    context.TryCancel();
    EXPECT_FALSE(call->Read(&event));
    EXPECT_EQ(call->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (RegionInUse(info.region()) != 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(RegionInUse(info.region()), 0);
  EXPECT_TRUE(client_->UnregisterRegion(info.region(), call_).ok());
  // RingClient does all of it in its destructor.
  std::string ring_region;
  {
    auto ring = Attach({data_handle});
    ASSERT_NE(ring, nullptr);
  }
  v1::ListRegionsResponse list;
  ASSERT_TRUE(client_->ListRegions(&list, call_).ok());
  ASSERT_EQ(list.regions_size(), 1) << "only the data region is left";
  EXPECT_EQ(list.regions(0).region(), data_handle);
}

// keep_c through the ring: C stays on the server, its handle in the completion; bound after
// the attach (BindRingSlots), the kept C is the next GEMM's A.
TEST_F(RingTest, KeptCThroughTheRingChainsIntoTheNextGemm) {
  constexpr uint32_t m = 48, n = 40, k = 56;
  constexpr uint64_t a_at = 0, b_at = 2 * m * k, b2_at = b_at + 2 * k * n, c_at = b2_at + 2 * n * n;
  std::string data_handle;
  auto data = Region(int64_t(c_at + 2 * m * n), &data_handle);
  FillRandom(Half(*data, a_at), m * k);
  FillRandom(Half(*data, b_at), k * n);
  FillRandom(Half(*data, b2_at), n * n);
  std::fill_n(Half(*data, c_at), m * n, kHalfNan);
  auto ring = Attach({data_handle});
  ASSERT_NE(ring, nullptr);
  v1::GemmRequest request;
  request.set_m(m);
  request.set_n(n);
  request.set_k(k);
  request.mutable_a_region()->set_region(data_handle);
  request.mutable_a_region()->set_offset(a_at);
  request.mutable_b_region()->set_region(data_handle);
  request.mutable_b_region()->set_offset(b_at);
  request.set_keep_c_resident(true);
  RingSubmission entry;
  grpc::Status s = ring->ToSubmission(request, "", std::chrono::microseconds(0), &entry);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(entry.flags & kRingKeepC, uint32_t(kRingKeepC));
  EXPECT_EQ(entry.c.kind, uint32_t(kRingOperandNone));
  RingCompletion done{};
  s = ring->Gemm(entry, &done);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string kept = RingClient::KeptHandle(done);
  ASSERT_EQ(kept.rfind("m-", 0), 0u) << kept;
  std::string c;
  ASSERT_TRUE(client_->DownloadMatrix(kept, &c, call_).ok());
  ASSERT_EQ(c.size(), size_t(2 * m * n));
  std::vector<float> reference = ReferenceGemm(Half(*data, a_at), Half(*data, b_at), m, n, k);
  EXPECT_LT(
      RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()), reference.data(), m * n),
      1e-3);
  EXPECT_TRUE(std::all_of(Half(*data, c_at), Half(*data, c_at) + m * n, [](uint16_t v) {
    return v == kHalfNan;
  })) << "a kept C is written nowhere in the regions";

  // The kept C is bound after the attach and is A of C2 = C · B2 (into the region).
  EXPECT_FALSE(ring->HasMatrix(kept));
  ASSERT_TRUE(ring->Bind({}, {kept}).ok());
  EXPECT_TRUE(ring->HasMatrix(kept));
  v1::GemmRequest next;
  next.set_m(m);
  next.set_n(n);
  next.set_k(n);
  next.set_a_handle(kept);
  next.mutable_b_region()->set_region(data_handle);
  next.mutable_b_region()->set_offset(b2_at);
  next.mutable_c_region()->set_region(data_handle);
  next.mutable_c_region()->set_offset(c_at);
  s = ring->ToSubmission(next, "", std::chrono::microseconds(0), &entry);
  ASSERT_TRUE(s.ok()) << s.error_message();
  s = ring->Gemm(entry);
  ASSERT_TRUE(s.ok()) << s.error_message();
  reference =
      ReferenceGemm(reinterpret_cast<const uint16_t*>(c.data()), Half(*data, b2_at), m, n, n);
  EXPECT_LT(RelativeFrobeniusError(Half(*data, c_at), reference.data(), m * n), 1e-3);

  // keep_c with a C named too is refused, by the client and by the server.
  request.mutable_c_region()->set_region(data_handle);
  s = ring->ToSubmission(request, "", std::chrono::microseconds(0), &entry);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("keep_c_resident"), std::string::npos) << s.error_message();
  RingSubmission both = Entry(m, n, k, {kRingOperandRegion, 0, a_at}, {kRingOperandRegion, 0, b_at},
                              {kRingOperandRegion, 0, c_at});
  both.flags = kRingKeepC;
  s = ring->Gemm(both);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("c.kind"), std::string::npos) << s.error_message();
}

// Slots bound after the attach: a region registered and a matrix uploaded once the ring runs
// are usable from it; BindRingSlots finds only the caller's own attached ring.
TEST_F(RingTest, SlotsBoundAfterTheAttachAreUsable) {
  constexpr uint32_t m = 24, n = 32, k = 40;
  auto ring = Attach({});
  ASSERT_NE(ring, nullptr);
  std::string data_handle;
  auto data = Region(int64_t(2 * (m * k + m * n)), &data_handle);  // A, then C
  std::vector<uint16_t> b(k * n);
  FillRandom(b.data(), k * n);
  v1::MatrixInfo matrix;
  ASSERT_TRUE(client_
                  ->UploadMatrix(k, n, {reinterpret_cast<const char*>(b.data()), 2 * k * n},
                                 &matrix, 0, "", call_)
                  .ok());
  const RingSubmission gemm = Entry(m, n, k, {kRingOperandRegion, 0, 0}, {kRingOperandMatrix, 0, 0},
                                    {kRingOperandRegion, 0, 2 * m * k});
  grpc::Status s = ring->Gemm(gemm);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "nothing is bound yet";
  EXPECT_NE(s.error_message().find("a.slot"), std::string::npos) << s.error_message();
  ASSERT_TRUE(ring->Bind({data_handle}, {matrix.handle()}).ok());
  ASSERT_TRUE(ring->Bind({data_handle}, {}).ok()) << "binding a bound handle again is a no-op";
  FillRandom(Half(*data, 0), m * k);
  std::fill_n(Half(*data, 2 * m * k), m * n, kHalfNan);
  s = ring->Gemm(gemm);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<float> reference = ReferenceGemm(Half(*data, 0), b.data(), m, n, k);
  EXPECT_LT(RelativeFrobeniusError(Half(*data, 2 * m * k), reference.data(), m * n), 1e-3);

  // BindRingSlots itself: another principal, a region that holds no ring, an empty handle.
  auto stub = v1::GemmService::NewStub(client_->ChannelTo(""));
  auto bind = [&](const std::string& client_id, const std::string& ring_region,
                  const std::string& region) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", client_id);
    v1::BindRingSlotsRequest request;
    request.set_ring_region(ring_region);
    request.add_regions(region);
    v1::RingSlots slots;
    return stub->BindRingSlots(&context, request, &slots);
  };
  EXPECT_EQ(bind("mallory", ring->region(), data_handle).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(bind("alice", data_handle, data_handle).error_code(), grpc::StatusCode::NOT_FOUND);
  s = bind("alice", ring->region(), "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("regions[0]"), std::string::npos) << s.error_message();
}

// Deadlines. An entry whose deadline passed before the server read it is answered
// DEADLINE_EXCEEDED without running (its C untouched). A GEMM the caller stops waiting for
// returns DEADLINE_EXCEEDED at once; its late completion is dropped when it comes, and C then
// holds the whole product (the server ran it: no deadline in the entry) and nothing after.
TEST_F(RingTest, DeadlinesAnswerOnTimeAndLateCompletionsAreDropped) {
  constexpr uint32_t small = 32, big = 768;
  constexpr uint64_t b_at = 2 * uint64_t{big} * big, c_at = 2 * b_at;
  std::string data_handle;
  auto data = Region(int64_t(3 * b_at), &data_handle);
  auto ring = Attach({data_handle});
  ASSERT_NE(ring, nullptr);
  FillRandom(Half(*data, 0), uint64_t{big} * big);
  FillRandom(Half(*data, b_at), uint64_t{big} * big);
  const RingOperand a{kRingOperandRegion, 0, 0}, b{kRingOperandRegion, 0, b_at},
      c{kRingOperandRegion, 0, c_at};

  std::fill_n(Half(*data, c_at), small * small, kHalfNan);
  RingSubmission expired = Entry(small, small, small, a, b, c);
  expired.flags = kRingHasDeadline;
  expired.deadline_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  grpc::Status s = ring->Gemm(expired);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_TRUE(std::all_of(Half(*data, c_at), Half(*data, c_at) + small * small, [](uint16_t v) {
    return v == kHalfNan;
  })) << "an expired entry does not run";

  // 768^3 on the CPU backend takes far longer than the 1 ms the caller waits.
  std::fill_n(Half(*data, c_at), uint64_t{big} * big, kHalfNan);
  const uint64_t ticket = ring->Submit(Entry(big, big, big, a, b, c));
  s = ring->Wait(ticket, nullptr, std::chrono::steady_clock::now() + std::chrono::milliseconds(1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  ASSERT_TRUE(ring->Drain().ok());
  std::vector<float> reference = ReferenceGemm(Half(*data, 0), Half(*data, b_at), big, big, big);
  EXPECT_LT(RelativeFrobeniusError(Half(*data, c_at), reference.data(), uint64_t{big} * big), 1e-3)
      << "the late GEMM wrote all of C";
  // The ring goes on, and the late completion was not handed to anyone.
  std::fill_n(Half(*data, c_at), small * small, kHalfNan);
  FillRandom(Half(*data, 0), small * small);
  s = ring->Gemm(Entry(small, small, small, a, {kRingOperandRegion, 0, 0}, c));
  ASSERT_TRUE(s.ok()) << s.error_message();
  reference = ReferenceGemm(Half(*data, 0), Half(*data, 0), small, small, small);
  EXPECT_LT(RelativeFrobeniusError(Half(*data, c_at), reference.data(), small * small), 1e-3);
  // ToSubmission turns a timeout into the entry's deadline.
  v1::GemmRequest request;
  request.set_m(small);
  request.set_n(small);
  request.set_k(small);
  request.mutable_a_region()->set_region(data_handle);
  request.mutable_b_region()->set_region(data_handle);
  request.mutable_c_region()->set_region(data_handle);
  request.mutable_c_region()->set_offset(c_at);
  RingSubmission entry;
  ASSERT_TRUE(ring->ToSubmission(request, "", std::chrono::seconds(30), &entry).ok());
  EXPECT_EQ(entry.flags & kRingHasDeadline, uint32_t(kRingHasDeadline));
  EXPECT_GT(entry.deadline_ns, expired.deadline_ns);
  EXPECT_TRUE(ring->Gemm(entry).ok());
}

// A server process killed while threads run GEMMs through its ring: every GEMM is either
// correct or UNAVAILABLE, none hangs, and the ring says why it ended.
TEST(RingServerProcess, AKilledServerFailsEveryGemmInFlightWithUnavailable) {
  char dir[] = "/tmp/hgemm_ring_kill_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string socket = std::string(dir) + "/hgemm.sock";
  subprocess::ServerProcess server(
      {"--backend=cpu", "--listen=unix:" + socket, "--allow_shared_memory"});
  ASSERT_TRUE(server.WaitUntilListening()) << server.process().Output();
  GemmClient client("unix:" + socket);
  constexpr uint32_t m = 64, n = 64, k = 64;
  constexpr int kThreads = 4;
  constexpr uint64_t b_at = 2 * m * k, c_base = b_at + 2 * k * n, c_bytes = 2 * m * n;
  std::string error;
  auto data = SharedRegion::Create(int64_t(c_base + kThreads * c_bytes), &error);
  ASSERT_NE(data, nullptr) << error;
  v1::RegionInfo info;
  ASSERT_TRUE(client.RegisterRegion(data->path(), data->bytes(), "data", &info, {}).ok());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  uint16_t* ab = reinterpret_cast<uint16_t*>(data->data());
  for (uint64_t i = 0; i < m * k + k * n; ++i) ab[i] = FloatToHalf(value(rng));
  const std::vector<float> reference = ReferenceGemm(ab, ab + m * k, m, n, k);
  grpc::Status s;
  auto ring = RingClient::Attach(client, {info.region()}, {}, {.spin_us = 20}, &s);
  ASSERT_NE(ring, nullptr) << s.error_message();
  std::atomic<int> completed{0};
  std::vector<int> wrong(kThreads, 0), other(kThreads, 0);
  std::vector<std::string> last(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t c_at = c_base + t * c_bytes;
      uint16_t* c = reinterpret_cast<uint16_t*>(data->data() + c_at);
      while (true) {
        std::fill_n(c, m * n, kHalfNan);
        RingSubmission e{};
        e.m = m;
        e.n = n;
        e.k = k;
        e.a = {kRingOperandRegion, 0, 0};
        e.b = {kRingOperandRegion, 0, b_at};
        e.c = {kRingOperandRegion, 0, c_at};
        const grpc::Status status = ring->Gemm(e);
        if (status.ok()) {
          if (RelativeFrobeniusError(c, reference.data(), m * n) > 1e-3) ++wrong[t];
          ++completed;
          continue;
        }
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE && ring->detached().ok()) {
          continue;  // the server's queue was full
        }
        if (status.error_code() != grpc::StatusCode::UNAVAILABLE) ++other[t];
        last[t] = status.error_message();
        return;
      }
    });
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (completed.load() < 200 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(completed.load(), 200) << server.process().Output();
  server.process().Kill(SIGKILL);
  for (std::thread& t : threads) t.join();  // a GEMM that hangs hangs the test (its timeout)
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(wrong[t], 0) << "thread " << t;
    EXPECT_EQ(other[t], 0) << "thread " << t << ": " << last[t];
    EXPECT_NE(last[t].find("the ring was detached"), std::string::npos) << last[t];
  }
  EXPECT_EQ(ring->detached().error_code(), grpc::StatusCode::UNAVAILABLE);
  ring.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hgemm
