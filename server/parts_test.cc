// Parallel parts end to end (proto/hgemm.proto, "Parallel parts"): a real HgemmServer on
// 127.0.0.1 (CPU backend), uploads filled by parts over several real connections, ranged
// downloads, and every refusal with its status while the server keeps serving.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <utility>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

class PartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.service.stream_chunk_bytes = 64 << 10;
    options.service.resident.upload_idle_timeout = std::chrono::seconds(1);
    options.service.resident.max_parts_per_upload = 8;
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>(address());
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  CallOptions As(const std::string& client_id) const {
    CallOptions options;
    options.client_id = client_id;
    options.chunk_bytes = 4 << 10;  // several chunks per part
    options.parallel_parts = 3;
    options.parallel_min_bytes = 0;
    return options;
  }

  std::string RandomBytes(size_t n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = char(rng_() | 1);  // never all zeros
    return bytes;
  }

  // The client's resident bytes, as the server counts them.
  uint64_t ClientBytes(const std::string& client_id) {
    v1::ListMatricesResponse list;
    EXPECT_TRUE(client_->ListMatrices(&list, As(client_id)).ok());
    return list.client_bytes();
  }

  void ExpectStillServing() {
    v1::GemmRequest r = RandomRequest(17, 9, 33, rng_);
    v1::GemmResponse response;
    ASSERT_TRUE(client_->Gemm(r, &response).ok());
    EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc);
  }

  std::mt19937_64 rng_{2026120427};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(PartsTest, RunSendsOddShapesAsPartsAndLeavesNothingBehind) {
  for (auto [m, n, k] : {std::tuple{301u, 257u, 199u}, {1u, 3u, 5u}, {64u, 1u, 129u}}) {
    v1::GemmRequest r = RandomRequest(m, n, k, rng_);
    ASSERT_TRUE(GemmClient::ShouldSendParts(r, As("alice")));
    v1::GemmResponse response;
    // Poison, C's size or longer: Run writes C into this buffer, every byte the server's.
    response.set_c(RandomBytes(2 * m * n + (m % 2) * 1000));
    grpc::Status s = client_->Run(r, &response, As("alice"));
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(response.c().size(), 2 * m * n);
    EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc)
        << m << "x" << n << "x" << k;
    EXPECT_FALSE(response.has_c_matrix());
    EXPECT_EQ(response.execution().backend(), "cpu");
    // A and B were released by the GEMM, C after its download.
    EXPECT_EQ(ClientBytes("alice"), 0u);
  }
}

// A client's GEMMs in flight share its parts: a loaded client sends its GEMMs whole.
TEST(PartsFor, ShareTheConnectionsAmongTheGemmsInFlight) {
  EXPECT_EQ(GemmClient::PartsFor(8, 1), 8);
  EXPECT_EQ(GemmClient::PartsFor(8, 2), 4);
  EXPECT_EQ(GemmClient::PartsFor(8, 3), 2);
  EXPECT_EQ(GemmClient::PartsFor(4, 16), 0);
  EXPECT_EQ(GemmClient::PartsFor(4, 0), 4);
  std::mt19937_64 rng(1);
  const v1::GemmRequest r = RandomRequest(301, 257, 199, rng);
  CallOptions loaded;
  loaded.parallel_min_bytes = 0;
  loaded.parallel_parts = GemmClient::PartsFor(4, 4);
  EXPECT_FALSE(GemmClient::ShouldSendParts(r, loaded));
}

TEST_F(PartsTest, TransposedBf16WithFp32CAsParts) {
  v1::GemmRequest r =
      FormRequest(77, 45, 130, true, true, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP32, rng_);
  v1::GemmResponse response;
  grpc::Status s = client_->Run(r, &response, As("alice"));
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(RelativeErrorOfC(r, response.c()),
            ServiceTolerance(
                false, {.transpose_a = true, .transpose_b = true, .bf16 = true, .c_fp32 = true}));
}

// Parts carry A and B only: a GEMM with alpha/beta and C_in, or a batch, goes the old way and
// keeps its semantics.
TEST_F(PartsTest, ScaledAndBatchedGemmsKeepTheirSemanticsThroughRun) {
  v1::GemmRequest scaled = RandomRequest(96, 80, 70, rng_);
  scaled.set_alpha(0.5f);
  scaled.set_beta(-2.0f);
  SetRandomCIn(&scaled, rng_);
  const v1::GemmRequest batched = FormRequest(40, 24, 33, false, false, v1::DATA_TYPE_FP16,
                                              v1::DATA_TYPE_UNSPECIFIED, rng_, /*batch=*/3);
  for (const v1::GemmRequest* r : {&std::as_const(scaled), &batched}) {
    EXPECT_FALSE(GemmClient::ShouldSendParts(*r, As("alice")));
    v1::GemmResponse response;
    grpc::Status s = client_->Run(*r, &response, As("alice"));
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(RelativeErrorOfC(*r, response.c()), kServiceTolerance.fp32_acc);
  }
}

TEST_F(PartsTest, PartsOutOfOrderOverSeveralConnectionsAndRangedDownloads) {
  const CallOptions alice = As("alice");
  v1::MatrixInfo upload;
  ASSERT_TRUE(client_->CreateUpload(40, 50, v1::DATA_TYPE_FP16, false, &upload, alice).ok());
  EXPECT_EQ(upload.missing_bytes(), 4000u);
  const std::string bytes = RandomBytes(4000);
  uint64_t missing = 0;
  // Last part first, each on its own connection.
  for (auto [offset, length, route] :
       {std::tuple{3000u, 1000u, 2}, {0u, 1200u, 0}, {1200u, 1800u, 1}}) {
    ASSERT_TRUE(client_
                    ->UploadPart(upload.handle(), offset, bytes.data() + offset, length, route,
                                 alice, &missing)
                    .ok());
  }
  EXPECT_EQ(missing, 0u);
  std::string range(1500, '\x7f');
  ASSERT_TRUE(client_->DownloadRange(upload.handle(), 1000, 1500, range.data(), 1, alice).ok());
  EXPECT_EQ(range, bytes.substr(1000, 1500));
  std::string whole;
  ASSERT_TRUE(client_->DownloadMatrix(upload.handle(), &whole, alice).ok());
  EXPECT_EQ(whole, bytes);
  // Past the end.
  EXPECT_EQ(client_->DownloadRange(upload.handle(), 3999, 2, range.data(), 0, alice).error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  // release_after: the bytes come back, then the matrix is gone.
  auto stub = v1::GemmService::NewStub(Connect(address()));
  grpc::ClientContext context;
  context.AddMetadata("x-client-id", "alice");
  v1::DownloadMatrixRequest request;
  request.set_handle(upload.handle());
  request.set_offset(3990);
  request.set_release_after(true);
  auto reader = stub->DownloadMatrix(&context, request);
  v1::ResultChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  EXPECT_EQ(chunk.offset(), 3990u);
  EXPECT_EQ(chunk.data(), bytes.substr(3990));
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(ClientBytes("alice"), 0u);
}

TEST_F(PartsTest, RefusalsHaveTheirStatusAndTheServerKeepsServing) {
  const CallOptions alice = As("alice");
  v1::MatrixInfo upload;
  ASSERT_TRUE(client_->CreateUpload(10, 10, v1::DATA_TYPE_FP16, true, &upload, alice).ok());
  const std::string bytes = RandomBytes(200);
  ASSERT_TRUE(client_->UploadPart(upload.handle(), 0, bytes.data(), 100, 0, alice).ok());
  // Duplicate and overlapping.
  EXPECT_EQ(client_->UploadPart(upload.handle(), 0, bytes.data(), 100, 1, alice).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(client_->UploadPart(upload.handle(), 98, bytes.data(), 4, 2, alice).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Past the end.
  EXPECT_EQ(client_->UploadPart(upload.handle(), 150, bytes.data(), 51, 0, alice).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Another principal's upload: as if it did not exist.
  grpc::Status foreign =
      client_->UploadPart(upload.handle(), 100, bytes.data(), 100, 0, As("mallory"));
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(foreign.error_message().find("does not exist"), std::string::npos)
      << foreign.error_message();
  // A GEMM naming the incomplete upload says how much is missing.
  v1::GemmRequest gemm = RandomRequest(10, 10, 10, rng_);
  gemm.set_a_handle(upload.handle());
  v1::GemmResponse response;
  grpc::Status incomplete = client_->Gemm(gemm, &response, alice);
  EXPECT_EQ(incomplete.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(incomplete.error_message().find("missing 100 of its 200 bytes"), std::string::npos)
      << incomplete.error_message();
  ExpectStillServing();
  // The rest, then the GEMM runs and releases the transient upload.
  ASSERT_TRUE(client_->UploadPart(upload.handle(), 100, bytes.data() + 100, 100, 1, alice).ok());
  grpc::Status ran = client_->Gemm(gemm, &response, alice);
  ASSERT_TRUE(ran.ok()) << ran.error_message();
  EXPECT_EQ(client_->Gemm(gemm, &response, alice).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ClientBytes("alice"), 0u);
}

TEST_F(PartsTest, MorePartsThanTheLimitAreRefused) {
  const CallOptions alice = As("alice");
  v1::MatrixInfo upload;
  ASSERT_TRUE(client_->CreateUpload(1, 100, v1::DATA_TYPE_FP16, false, &upload, alice).ok());
  const std::string bytes = RandomBytes(200);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(client_->UploadPart(upload.handle(), 2 * i, bytes.data(), 2, i % 3, alice).ok());
  }
  grpc::Status ninth = client_->UploadPart(upload.handle(), 16, bytes.data(), 2, 0, alice);
  EXPECT_EQ(ninth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << ninth.error_message();
  ExpectStillServing();
}

TEST_F(PartsTest, AClientThatDiesMidPartLeavesItsRangeFreeAndAnAbandonedUploadIsReclaimed) {
  const CallOptions alice = As("alice");
  v1::MatrixInfo upload;
  ASSERT_TRUE(client_->CreateUpload(256, 256, v1::DATA_TYPE_FP16, false, &upload, alice).ok());
  EXPECT_EQ(ClientBytes("alice"), 2u * 256 * 256);
  {  // A part cancelled after half its bytes, on a connection of its own.
    auto stub = v1::GemmService::NewStub(Connect(address(), {.private_subchannels = true}));
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", "alice");
    v1::PartResponse response;
    auto writer = stub->UploadPart(&context, &response);
    v1::PartRequest message;
    message.mutable_header()->set_handle(upload.handle());
    message.mutable_header()->set_length(2000);
    ASSERT_TRUE(writer->Write(message));
    message.set_chunk(RandomBytes(1000));
    ASSERT_TRUE(writer->Write(message));
    context.TryCancel();
    EXPECT_FALSE(writer->Finish().ok());
  }
  // Its range is free again (once the server has seen the cancellation).
  const std::string bytes = RandomBytes(2000);
  grpc::Status again;
  for (int i = 0; i < 100; ++i) {
    again = client_->UploadPart(upload.handle(), 0, bytes.data(), 2000, 0, alice);
    if (again.error_code() != grpc::StatusCode::INVALID_ARGUMENT) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  // Nothing more comes: after the idle timeout (1 s) the memory and the quota are back.
  for (int i = 0; i < 200 && ClientBytes("alice") > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(ClientBytes("alice"), 0u);
  v1::GemmRequest gemm = RandomRequest(256, 8, 256, rng_);
  gemm.set_a_handle(upload.handle());
  v1::GemmResponse response;
  grpc::Status gone = client_->Gemm(gemm, &response, alice);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(gone.error_message().find("got no part in time"), std::string::npos)
      << gone.error_message();
  ExpectStillServing();
}

}  // namespace
}  // namespace hgemm
