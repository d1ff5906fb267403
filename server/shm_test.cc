// End to end over a real Unix socket (in a temporary directory) with the CPU backend: the
// listener beside TCP, and shared-memory regions (real memfds) named by Gemm calls.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/forwarding_backend.h"
#include "server/testing/gated_backend.h"
#include "server/testing/memfd.h"
#include "server/testing/region_test.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

double ErrorAgainstReference(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint32_t m,
                             uint32_t n, uint32_t k) {
  std::vector<float> reference = ReferenceGemm(a, b, m, n, k);
  return RelativeFrobeniusError(c, reference.data(), reference.size());
}

const uint16_t* Half(const std::string& bytes) {
  return reinterpret_cast<const uint16_t*>(bytes.data());
}

class ShmTest : public RegionTest {
 protected:
  void SetUp() override { MakeSocketDir(); }
  void TearDown() override {
    server_.reset();
    RegionTest::TearDown();
  }

  void StartServer(ServerOptions options, std::unique_ptr<Backend> backend = nullptr) {
    server_.reset();
    options.listen_address = "127.0.0.1:0";
    options.more_listen_addresses = {socket_address()};
    if (!backend) backend = MakeCpuBackend({.workers = 2});
    server_ = HgemmServer::Start(options, std::move(backend));
    ASSERT_NE(server_, nullptr);
    stub_ = v1::GemmService::NewStub(Connect(socket_address()));
    tcp_ = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  }

  static ServerOptions SharedMemoryOn() {
    ServerOptions options;
    options.service.regions.allow_shared_memory = true;
    return options;
  }

  std::mt19937_64 rng_{20261204};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<v1::GemmService::Stub> tcp_;
};

TEST_F(ShmTest, UnixSocketServesBesideTcpWithItsMode) {
  ServerOptions options;
  options.unix_socket_mode = 0660;
  StartServer(options);
  struct stat st {};
  ASSERT_EQ(stat(socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  for (v1::GemmService::Stub* stub : {stub_.get(), tcp_.get()}) {
    v1::GemmRequest r = RandomRequest(19, 7, 33, rng_);
    v1::GemmResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Gemm(&context, r, &response).ok());
    EXPECT_LT(ErrorAgainstReference(Half(r.a()), Half(r.b()), Half(response.c()), 19, 7, 33),
              kServiceTolerance.fp32_acc);
  }
}

constexpr uint32_t kM = 33, kN = 17, kK = 65;

// A and B from one region, C into another: checked against the fp32 reference; then both
// unregistered, and a later use is NOT_FOUND.
TEST_F(ShmTest, RegisterUseUnregister) {
  StartServer(SharedMemoryOn());
  const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  TestMemfd operands(Pad(r.a().size()) + r.b().size()), result(2 * kM * kN);
  Write(operands, 0, r.a());
  Write(operands, Pad(r.a().size()), r.b());
  v1::RegionInfo in, out;
  ASSERT_TRUE(Register(operands, Pad(r.a().size()) + r.b().size(), &in).ok());
  ASSERT_TRUE(Register(result, 2 * kM * kN, &out).ok());
  v1::GemmRequest shm;
  shm.set_m(kM);
  shm.set_n(kN);
  shm.set_k(kK);
  SetRegion(shm.mutable_a_region(), in.region(), 0);
  SetRegion(shm.mutable_b_region(), in.region(), Pad(r.a().size()));
  SetRegion(shm.mutable_c_region(), out.region(), 0);
  v1::GemmResponse response;
  grpc::Status s = Gemm(shm, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(response.c().empty());
  const std::string c = Read(result, 0, 2 * kM * kN);
  EXPECT_LT(ErrorAgainstReference(Half(r.a()), Half(r.b()), Half(c), kM, kN, kK),
            kServiceTolerance.fp32_acc);

  grpc::ClientContext context;
  context.AddMetadata("x-client-id", "alice");
  v1::ListRegionsResponse list;
  ASSERT_TRUE(stub_->ListRegions(&context, {}, &list).ok());
  EXPECT_EQ(list.regions_size(), 2);
  EXPECT_EQ(list.client_bytes(), Pad(r.a().size()) + r.b().size() + 2 * kM * kN);
  EXPECT_TRUE(Unregister(in.region()).ok());
  EXPECT_TRUE(Unregister(out.region()).ok());
  s = Gemm(shm, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(Unregister(in.region()).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ShmTest, AFromARegionBInline) {
  StartServer(SharedMemoryOn());
  const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  TestMemfd file(4096 + r.a().size());
  Write(file, 4096, r.a());
  v1::RegionInfo info;
  ASSERT_TRUE(Register(file, 4096 + r.a().size(), &info).ok());
  v1::GemmRequest shm = r;
  SetRegion(shm.mutable_a_region(), info.region(), 4096);
  ASSERT_FALSE(shm.has_a());
  v1::GemmResponse response;
  grpc::Status s = Gemm(shm, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(ErrorAgainstReference(Half(r.a()), Half(r.b()), Half(response.c()), kM, kN, kK),
            kServiceTolerance.fp32_acc);
}

// alpha/beta with C_in in a region, read and written in place (C_in and C the same bytes): the
// BLAS update C = alpha·A·B + beta·C. Against float64.
TEST_F(ShmTest, CInRegionUpdatedInPlace) {
  StartServer(SharedMemoryOn());
  v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  r.set_alpha(-0.5f);
  r.set_beta(2);
  SetRandomCIn(&r, rng_);
  TestMemfd file(4096 + r.c_in().size());
  Write(file, 4096, r.c_in());
  v1::RegionInfo info;
  ASSERT_TRUE(Register(file, 4096 + r.c_in().size(), &info).ok());
  v1::GemmRequest shm = r;
  SetRegion(shm.mutable_c_in_region(), info.region(), 4096);
  SetRegion(shm.mutable_c_region(), info.region(), 4096);
  ASSERT_FALSE(shm.has_c_in());
  v1::GemmResponse response;
  grpc::Status s = Gemm(shm, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(RelativeErrorOfC(r, Read(file, 4096, r.c_in().size())), kServiceTolerance.fp32_acc);

  SetRegion(shm.mutable_c_in_region(), info.region(), 4112);  // C_in past the region's end
  s = Gemm(shm, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_NE(s.error_message().find("c_in_region"), std::string::npos) << s.error_message();
}

// An operand ending exactly at the region's end is taken; one byte more is OUT_OF_RANGE (and
// an offset off the 16-byte alignment INVALID_ARGUMENT); offsets near 2^64 don't wrap around.
TEST_F(ShmTest, BoundsAndOverflowingOffsets) {
  StartServer(SharedMemoryOn());
  const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  const int64_t c_bytes = 2 * kM * kN;
  TestMemfd file(c_bytes + 16);
  v1::RegionInfo exact, short_by_one;
  ASSERT_TRUE(Register(file, c_bytes + 16, &exact).ok());
  ASSERT_TRUE(Register(file, c_bytes + 15, &short_by_one).ok());
  v1::GemmRequest shm = r;
  v1::GemmResponse response;
  SetRegion(shm.mutable_c_region(), exact.region(), 16);  // C's last byte is the region's last
  grpc::Status s = Gemm(shm, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(
      ErrorAgainstReference(Half(r.a()), Half(r.b()), Half(Read(file, 16, c_bytes)), kM, kN, kK),
      kServiceTolerance.fp32_acc);
  SetRegion(shm.mutable_c_region(), short_by_one.region(), 16);  // one byte past the end
  s = Gemm(shm, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_NE(s.error_message().find("c_region"), std::string::npos) << s.error_message();
  for (uint64_t offset : {3, 2, 8}) {
    SetRegion(shm.mutable_c_region(), exact.region(), offset);
    s = Gemm(shm, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  for (uint64_t offset : {max - 1, max - uint64_t(c_bytes) + 1, uint64_t{1} << 63}) {
    shm = r;
    SetRegion(shm.mutable_a_region(), exact.region(), offset & ~uint64_t{15});
    s = Gemm(shm, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << offset << " " << s.error_message();
  }
}

// A client names another process's sealed memfd as its region, to read it through a GEMM (as
// C_in with alpha = 0, beta = 1): refused before the server opens anything, with the same
// answer whether or not the descriptor exists.
TEST_F(ShmTest, AnotherProcesssMemfdCannotBeRegistered) {
  StartServer(SharedMemoryOn());
  OtherProcessMemfd victim;
  ASSERT_GT(victim.pid(), 0);
  ASSERT_GE(victim.fd(), 0);
  v1::RegisterRegionRequest request;
  request.set_path(victim.path());
  request.set_byte_size(4096);
  v1::RegionInfo info;
  grpc::Status s = RegisterRegion(request, &info, kClient, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  request.set_path(victim.path(/*past=*/97));
  grpc::Status none = RegisterRegion(request, &info, kClient, nullptr);
  EXPECT_EQ(none.error_code(), s.error_code()) << none.error_message();
  grpc::ClientContext context;
  context.AddMetadata("x-client-id", kClient);
  v1::ListRegionsResponse list;
  ASSERT_TRUE(stub_->ListRegions(&context, {}, &list).ok());
  EXPECT_EQ(list.regions_size(), 0);
  // Its own memfds still register.
  TestMemfd mine(4096);
  EXPECT_TRUE(Register(mine, 4096, &info).ok());
}

TEST_F(ShmTest, ForeignAndUnknownRegionsAreNotFound) {
  StartServer(SharedMemoryOn());
  const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  TestMemfd file(r.a().size());
  Write(file, 0, r.a());
  v1::RegionInfo info;
  ASSERT_TRUE(Register(file, r.a().size(), &info, "alice").ok());
  v1::GemmRequest shm = r;
  SetRegion(shm.mutable_a_region(), info.region(), 0);
  v1::GemmResponse response;
  grpc::Status s = Gemm(shm, &response, "mallory");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(Unregister(info.region(), "mallory").error_code(), grpc::StatusCode::NOT_FOUND);
  SetRegion(shm.mutable_a_region(), "r-00000000000000000000000000000000", 0);
  s = Gemm(shm, &response, "alice");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  SetRegion(shm.mutable_a_region(), info.region(), 0);
  EXPECT_TRUE(Gemm(shm, &response, "alice").ok());  // still alice's
}

// A GEMM holds its regions until it is answered: unregistering them meanwhile is refused, and
// works once the GEMM is done.
TEST_F(ShmTest, UnregisterDuringARunningGemmIsRefused) {
  auto gated = std::make_unique<GatedBackend>(MakeCpuBackend({.workers = 1}));
  GatedBackend* gate = gated.get();
  StartServer(SharedMemoryOn(), std::move(gated));
  const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  TestMemfd file(r.a().size());
  Write(file, 0, r.a());
  v1::RegionInfo info;
  ASSERT_TRUE(Register(file, r.a().size(), &info).ok());
  v1::GemmRequest shm = r;
  SetRegion(shm.mutable_a_region(), info.region(), 0);
  v1::GemmResponse response;
  auto running = std::async(std::launch::async, [&] { return Gemm(shm, &response); });
  gate->AwaitWaiting();
  grpc::Status s = Unregister(info.region());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  gate->Open();
  ASSERT_TRUE(running.get().ok());
  EXPECT_LT(ErrorAgainstReference(Half(r.a()), Half(r.b()), Half(response.c()), kM, kN, kK),
            kServiceTolerance.fp32_acc);
  EXPECT_TRUE(Unregister(info.region()).ok());
}

TEST_F(ShmTest, MemfdWithoutTheShrinkSealIsRefused) {
  StartServer(SharedMemoryOn());
  TestMemfd file(4096, /*seal_shrink=*/false);
  v1::RegionInfo info;
  grpc::Status s = Register(file, 4096, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("F_SEAL_SHRINK"), std::string::npos) << s.error_message();
}

// The client truncates its sealed memfd after registering: ftruncate fails, and GEMMs reading
// the whole region (up to its last page) keep working.
TEST_F(ShmTest, TruncatingASealedMemfdFailsAndTheServerKeepsServing) {
  StartServer(SharedMemoryOn());
  const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  const int64_t bytes = (int64_t{1} << 20) + int64_t(r.a().size());
  TestMemfd file(bytes);
  Write(file, bytes - r.a().size(), r.a());
  v1::RegionInfo info;
  ASSERT_TRUE(Register(file, bytes, &info).ok());
  EXPECT_NE(ftruncate(file.fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(file.fd(), 4096), 0);
  v1::GemmRequest shm = r;
  SetRegion(shm.mutable_a_region(), info.region(), bytes - r.a().size());
  for (int i = 0; i < 2; ++i) {
    v1::GemmResponse response;
    grpc::Status s = Gemm(shm, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(ErrorAgainstReference(Half(r.a()), Half(r.b()), Half(response.c()), kM, kN, kK),
              kServiceTolerance.fp32_acc);
  }
}

TEST_F(ShmTest, QuotaOfRegionsAndBytes) {
  ServerOptions options = SharedMemoryOn();
  options.service.regions.max_regions_per_owner = 2;
  options.service.regions.max_bytes_per_owner = 3 * 4096;
  StartServer(options);
  TestMemfd a(4096), b(4096), c(4096);
  v1::RegionInfo info;
  ASSERT_TRUE(Register(a, 4096, &info).ok());
  grpc::Status s = Register(b, 4096, &info);
  ASSERT_TRUE(s.ok());
  s = Register(c, 2, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  ASSERT_TRUE(Unregister(info.region()).ok());
  TestMemfd big(2 * 4096 + 2);
  s = Register(big, 2 * 4096 + 2, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(Register(big, 2 * 4096, &info).ok());
  // Over a Unix socket an x-client-id names a principal within the caller's uid, whose quota
  // it shares: a new name escapes nothing.
  s = Register(c, 4096, &info, "bob");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
}

TEST_F(ShmTest, RefusedOverTcpAndWhenOff) {
  StartServer(SharedMemoryOn());
  const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  TestMemfd file(r.a().size());
  Write(file, 0, r.a());
  v1::RegionInfo info;
  grpc::Status s = Register(file, r.a().size(), &info, "alice", tcp_.get());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  ASSERT_TRUE(Register(file, r.a().size(), &info).ok());
  v1::GemmRequest shm = r;
  SetRegion(shm.mutable_a_region(), info.region(), 0);
  v1::GemmResponse response;
  s = Gemm(shm, &response, "alice", tcp_.get());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  StartServer(ServerOptions{});  // without --allow_shared_memory
  s = Register(file, r.a().size(), &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("--allow_shared_memory"), std::string::npos);
  s = Gemm(shm, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_TRUE(Gemm(r, &response).ok());  // the plain path is untouched
}

// UploadMatrix whose header names a region: the matrix comes from it in one copy, and is
// the region's bytes exactly; then the refusals.
TEST_F(ShmTest, ResidentMatrixUploadedFromARegion) {
  StartServer(SharedMemoryOn());
  const std::string bytes = HalfBytes(RandomHalfMatrix(kM * kK, rng_));
  TestMemfd file(64 + bytes.size());
  Write(file, 64, bytes);
  v1::RegionInfo region;
  ASSERT_TRUE(Register(file, 64 + bytes.size(), &region).ok());
  // Sends the header (and `chunk`, if any) over `stub`; the call's status.
  auto upload = [&](uint64_t offset, const std::string& chunk, v1::MatrixInfo* info,
                    v1::GemmService::Stub* stub) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", "alice");
    auto writer = stub->UploadMatrix(&context, info);
    v1::UploadMatrixRequest header;
    header.mutable_header()->set_rows(kM);
    header.mutable_header()->set_cols(kK);
    SetRegion(header.mutable_header()->mutable_region(), region.region(), offset);
    writer->Write(header);
    if (!chunk.empty()) {
      v1::UploadMatrixRequest more;
      more.set_chunk(chunk);
      writer->Write(more);
    }
    writer->WritesDone();
    return writer->Finish();
  };
  auto download = [&](const std::string& handle) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", "alice");
    v1::DownloadMatrixRequest request;
    request.set_handle(handle);
    auto reader = stub_->DownloadMatrix(&context, request);
    std::string got;
    for (v1::ResultChunk chunk; reader->Read(&chunk);) got += chunk.data();
    EXPECT_TRUE(reader->Finish().ok());
    return got;
  };
  v1::MatrixInfo info;
  grpc::Status s = upload(64, "", &info, stub_.get());
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.bytes(), bytes.size());
  EXPECT_EQ(download(info.handle()), bytes);
  Write(file, 64, std::string(bytes.size(), '\0'));  // copied at the upload: no later effect
  EXPECT_EQ(download(info.handle()), bytes);

  EXPECT_EQ(upload(64, "xx", &info, stub_.get()).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = upload(80, "", &info, stub_.get());  // past the end
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(s.error_message().find("header.region"), std::string::npos) << s.error_message();
  EXPECT_EQ(upload(64, "", &info, tcp_.get()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// The CPU backend with the pinning of a GPU backend faked: PinHostMemory succeeds (or fails with
// `pin_error`), and Run records which operands came as pinned host memory.
class FakePinningBackend final : public ForwardingBackend {
 public:
  FakePinningBackend(std::unique_ptr<Backend> inner, absl::Status pin_error)
      : ForwardingBackend(std::move(inner)), pin_error_(std::move(pin_error)) {}
  absl::Status PinHostMemory(void*, int64_t, std::function<void()>* unpin) override {
    if (!pin_error_.ok()) return pin_error_;
    std::lock_guard<std::mutex> lock(mu_);
    ++pinned_;
    *unpin = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      --pinned_;
    };
    return absl::OkStatus();
  }
  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = job.pinned;
    }
    return ForwardingBackend::Run(slot, job, report);
  }
  GemmJob::PinnedHost last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  int pinned() {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_;
  }

 private:
  const absl::Status pin_error_;
  std::mutex mu_;
  GemmJob::PinnedHost last_;  // guarded by mu_
  int pinned_ = 0;            // regions pinned now; guarded by mu_
};

// A backend that pins host memory (CUDA's DMA path) gets the region operands and C as pinned
// memory, inline ones not; ListRegions says dma; unregistering unpins. When pinning fails
// (RLIMIT_MEMLOCK, say) the region still serves, through staging: dma false, nothing pinned.
TEST_F(ShmTest, RegionsArePinnedForDmaOrFallBackToStaging) {
  for (const absl::Status& pin_error :
       {absl::OkStatus(), absl::ResourceExhaustedError("cudaHostRegister: out of memory")}) {
    SCOPED_TRACE(pin_error.ToString());
    auto pinning = std::make_unique<FakePinningBackend>(MakeCpuBackend({.workers = 1}), pin_error);
    FakePinningBackend* backend = pinning.get();
    StartServer(SharedMemoryOn(), std::move(pinning));
    const v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
    TestMemfd file(Pad(r.a().size()) + 2 * kM * kN);
    Write(file, 0, r.a());
    Write(file, Pad(r.a().size()), std::string(2 * kM * kN, '\xff'));  // C poisoned: NaN
    v1::RegionInfo info;
    ASSERT_TRUE(Register(file, Pad(r.a().size()) + 2 * kM * kN, &info).ok());
    EXPECT_EQ(info.dma(), pin_error.ok());
    EXPECT_EQ(backend->pinned(), pin_error.ok() ? 1 : 0);
    v1::GemmRequest shm = r;
    SetRegion(shm.mutable_a_region(), info.region(), 0);
    SetRegion(shm.mutable_c_region(), info.region(), Pad(r.a().size()));
    v1::GemmResponse response;
    grpc::Status s = Gemm(shm, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(ErrorAgainstReference(Half(r.a()), Half(r.b()),
                                    Half(Read(file, Pad(r.a().size()), 2 * kM * kN)), kM, kN, kK),
              kServiceTolerance.fp32_acc);
    const GemmJob::PinnedHost pinned = backend->last();
    EXPECT_EQ(pinned.a, pin_error.ok());
    EXPECT_FALSE(pinned.b);  // inline
    EXPECT_FALSE(pinned.c_in);
    EXPECT_EQ(pinned.c, pin_error.ok());

    grpc::ClientContext context;
    context.AddMetadata("x-client-id", "alice");
    v1::ListRegionsResponse list;
    ASSERT_TRUE(stub_->ListRegions(&context, {}, &list).ok());
    ASSERT_EQ(list.regions_size(), 1);
    EXPECT_EQ(list.regions(0).dma(), pin_error.ok());
    ASSERT_TRUE(Unregister(info.region()).ok());
    EXPECT_EQ(backend->pinned(), 0);
  }
}

// The CPU backend has nothing to pin: its regions say dma false.
TEST_F(ShmTest, CpuBackendRegionsAreNotDma) {
  StartServer(SharedMemoryOn());
  TestMemfd file(4096);
  v1::RegionInfo info;
  ASSERT_TRUE(Register(file, 4096, &info).ok());
  EXPECT_FALSE(info.dma());
}

// CUDA IPC regions where the server cannot open them: the CPU backend refuses by name, and
// the request's own mistakes are INVALID_ARGUMENT; the rules of system regions come first.
TEST_F(ShmTest, CudaIpcRegionsAreRefusedOnTheCpuBackend) {
  ServerOptions options = SharedMemoryOn();
  options.service.regions.allow_cuda_ipc = true;
  StartServer(options);
  auto register_ipc = [&](const std::string& path, v1::GemmService::Stub* stub) {
    grpc::ClientContext context;
    v1::RegisterRegionRequest request;
    request.set_path(path);
    request.set_byte_size(4096);
    request.mutable_cuda_ipc()->set_handle(std::string(64, '\x5a'));
    request.mutable_cuda_ipc()->set_device("GPU-00000000-0000-0000-0000-000000000000");
    v1::RegionInfo info;
    return stub->RegisterRegion(&context, request, &info);
  };
  grpc::Status s = register_ipc("", stub_.get());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("CUDA IPC needs the CUDA backend"), std::string::npos)
      << s.error_message();
  s = register_ipc("/proc/1/fd/3", stub_.get());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("path"), std::string::npos) << s.error_message();
  EXPECT_EQ(register_ipc("", tcp_.get()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  StartServer(ServerOptions{});
  s = register_ipc("", stub_.get());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("--allow_shared_memory"), std::string::npos);
}

// The CPU backend posing as a GPU with CUDA IPC: a "handle" names one of the test's buffers of
// "device memory" (resident buffers of the CPU backend, i.e. host memory) on the device
// "GPU-fake"; any other device is not the server's.
class FakeIpcBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  // Device memory of `bytes`, shared under the returned handle.
  std::string Share(int64_t bytes, std::shared_ptr<ResidentBuffer>* memory) {
    EXPECT_TRUE(AllocateResident(0, bytes, memory).ok());
    std::string handle(64, '\0');
    std::snprintf(handle.data(), handle.size(), "fake-%zu", shared_.size());
    shared_[handle] = *memory;
    return handle;
  }
  absl::Status OpenIpcMemory(const std::string& handle, const std::string& device, int64_t bytes,
                             std::shared_ptr<ResidentBuffer>* buffer) override {
    if (device != "GPU-fake") return absl::FailedPreconditionError("not one of its devices");
    auto it = shared_.find(handle);
    if (it == shared_.end()) return absl::InvalidArgumentError("cuda_ipc.handle: does not open");
    if (bytes > it->second->bytes) return absl::InvalidArgumentError("byte_size: too large");
    *buffer = std::make_shared<ResidentBuffer>(0, bytes, it->second->data,
                                               [memory = it->second](void*) {});
    return absl::OkStatus();
  }

 private:
  std::map<std::string, std::shared_ptr<ResidentBuffer>> shared_;  // by handle
};

// A, B and C_in read from a CUDA IPC region and C written into it in place (the GEMM's device
// buffers, no host copy), against float64; ListRegions names the device; the region's bounds,
// owner and unregistering are those of system regions.
TEST_F(ShmTest, CudaIpcRegionUsedInPlace) {
  auto fake = std::make_unique<FakeIpcBackend>(MakeCpuBackend({.workers = 1}));
  FakeIpcBackend* backend = fake.get();
  ServerOptions options = SharedMemoryOn();
  options.service.regions.allow_cuda_ipc = true;
  StartServer(options, std::move(fake));
  v1::GemmRequest r = RandomRequest(kM, kN, kK, rng_);
  r.set_alpha(0.5f);
  r.set_beta(2.0f);
  SetRandomCIn(&r, rng_);
  const int64_t b_offset = Pad(r.a().size());
  const int64_t c_offset = b_offset + Pad(r.b().size());
  const int64_t bytes = c_offset + r.c_in().size();
  std::shared_ptr<ResidentBuffer> memory;
  const std::string handle = backend->Share(bytes, &memory);
  char* device = static_cast<char*>(memory->data);
  std::memcpy(device, r.a().data(), r.a().size());
  std::memcpy(device + b_offset, r.b().data(), r.b().size());
  std::memcpy(device + c_offset, r.c_in().data(), r.c_in().size());

  v1::RegionInfo info;
  EXPECT_EQ(RegisterIpc(handle, "GPU-other", bytes, &info).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(RegisterIpc(std::string(64, 'x'), "GPU-fake", bytes, &info).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RegisterIpc(handle, "GPU-fake", bytes + 1, &info).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status s = RegisterIpc(handle, "GPU-fake", bytes, &info);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(info.cuda_ipc());
  EXPECT_EQ(info.device_id(), uint32_t(server_->backend().Devices()[0].id));
  EXPECT_FALSE(info.dma());

  v1::GemmRequest ipc = r;
  SetRegion(ipc.mutable_a_region(), info.region(), 0);
  SetRegion(ipc.mutable_b_region(), info.region(), b_offset);
  SetRegion(ipc.mutable_c_in_region(), info.region(), c_offset);
  SetRegion(ipc.mutable_c_region(), info.region(), c_offset);
  v1::GemmResponse response;
  s = Gemm(ipc, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(response.c().empty());
  EXPECT_LT(RelativeErrorOfC(r, std::string(device + c_offset, 2 * kM * kN)),
            kServiceTolerance.fp32_acc);

  SetRegion(ipc.mutable_c_region(), info.region(), c_offset + 16);  // past the end
  s = Gemm(ipc, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(s.error_message().find("c_region"), std::string::npos) << s.error_message();
  EXPECT_EQ(Gemm(ipc, &response, "mallory").error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext context;
  context.AddMetadata("x-client-id", "alice");
  v1::ListRegionsResponse list;
  ASSERT_TRUE(stub_->ListRegions(&context, {}, &list).ok());
  ASSERT_EQ(list.regions_size(), 1);
  EXPECT_TRUE(list.regions(0).cuda_ipc());
  EXPECT_TRUE(Unregister(info.region()).ok());
  SetRegion(ipc.mutable_c_region(), info.region(), c_offset);
  EXPECT_EQ(Gemm(ipc, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ShmTest, CRegionWithKeepCResidentIsInvalid) {
  StartServer(SharedMemoryOn());
  v1::GemmRequest shm = RandomRequest(kM, kN, kK, rng_);
  SetRegion(shm.mutable_c_region(), "r-1", 0);
  shm.set_keep_c_resident(true);
  v1::GemmResponse response;
  EXPECT_EQ(Gemm(shm, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  shm.set_keep_c_resident(false);
  SetRegion(shm.mutable_c_region(), "", 0);
  EXPECT_EQ(Gemm(shm, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace hgemm
