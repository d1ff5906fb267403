// End to end: a real HgemmServer on 127.0.0.1 (CPU backend) and the real client library.
#include "server/server.h"

#include <gtest/gtest.h>

#include <map>
#include <new>
#include <random>
#include <stdexcept>
#include <thread>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"
#include "server/backend/cpu_backend.h"
#include "server/testing/forwarding_backend.h"
#include "server/testing/gated_backend.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

double ErrorAgainstReference(const v1::GemmRequest& r, const std::string& c) {
  EXPECT_EQ(c.size(), 2 * size_t(r.m()) * r.n());
  if (c.size() != 2 * size_t(r.m()) * r.n()) return 1;
  std::vector<float> reference =
      ReferenceGemm(reinterpret_cast<const uint16_t*>(r.a().data()),
                    reinterpret_cast<const uint16_t*>(r.b().data()), r.m(), r.n(), r.k());
  return RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()), reference.data(),
                                reference.size());
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer({}); }

  void StartServer(ServerOptions options) {
    server_.reset();
    options.listen_address = "127.0.0.1:0";
    options.service.stream_chunk_bytes = 256 << 10;
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>(Connect("127.0.0.1:" + std::to_string(server_->port())));
  }

  // A small good request still works (the server keeps serving after errors).
  void ExpectStillServing() {
    v1::GemmRequest r = RandomRequest(17, 9, 33, rng_);
    v1::GemmResponse response;
    ASSERT_TRUE(client_->Gemm(r, &response).ok());
    EXPECT_LT(ErrorAgainstReference(r, response.c()), kServiceTolerance.fp32_acc);
  }

  std::mt19937_64 rng_{20261203};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(ServerTest, UnaryTwoByTwo) {
  v1::GemmRequest r;
  r.set_m(2);
  r.set_n(2);
  r.set_k(2);
  std::vector<uint16_t> a = {FloatToHalf(1), FloatToHalf(2), FloatToHalf(3), FloatToHalf(4)};
  r.set_a(reinterpret_cast<const char*>(a.data()), 8);
  r.set_b(reinterpret_cast<const char*>(a.data()), 8);
  r.mutable_options()->set_request_id("two-by-two");
  v1::GemmResponse response;
  ASSERT_TRUE(client_->Gemm(r, &response).ok());
  const auto* c = reinterpret_cast<const uint16_t*>(response.c().data());
  EXPECT_EQ(HalfToFloat(c[0]), 7);
  EXPECT_EQ(HalfToFloat(c[1]), 10);
  EXPECT_EQ(HalfToFloat(c[2]), 15);
  EXPECT_EQ(HalfToFloat(c[3]), 22);
  EXPECT_EQ(response.request_id(), "two-by-two");
  EXPECT_EQ(response.execution().backend(), "cpu");
  EXPECT_EQ(response.execution().kernel(), "openblas_sgemm");
  EXPECT_EQ(response.execution().accumulation(), v1::ACCUMULATION_FP32);
  EXPECT_GE(response.timing().server_total_ms(), response.timing().kernel_ms());
}

TEST_F(ServerTest, UnaryOddShapesMatchReference) {
  for (auto [m, n, k] :
       {std::tuple{1u, 1u, 1u}, {7u, 5u, 3u}, {33u, 65u, 17u}, {255u, 257u, 100u}}) {
    v1::GemmRequest r = RandomRequest(m, n, k, rng_);
    v1::GemmResponse response;
    ASSERT_TRUE(client_->Gemm(r, &response).ok());
    EXPECT_LT(ErrorAgainstReference(r, response.c()), kServiceTolerance.fp32_acc)
        << m << "x" << n << "x" << k;
  }
}

TEST_F(ServerTest, StreamedLargeMatrices) {
  // 8 MiB per operand: far past gRPC's 4 MiB message default.
  v1::GemmRequest r = RandomRequest(2048, 2048, 2048, rng_);
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&r}, &results).ok());
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.error_message();
  EXPECT_LT(ErrorAgainstReference(r, results[0].response.c()), kServiceTolerance.fp32_acc);
  EXPECT_GT(results[0].response.timing().tflops(), 0);
}

// A backend that hands C over in pieces, as the CUDA backend does while C comes off the GPU:
// the stream sends chunks of C before the GEMM is complete.
class PiecewiseBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    absl::Status s = ForwardingBackend::Run(slot, job, report);
    const int64_t c_bytes = job.shape.CBytes();
    if (s.ok() && job.c_progress) {
      for (int64_t ready : {c_bytes / 3, c_bytes / 3 + 1, c_bytes * 2 / 3, c_bytes}) {
        job.c_progress(ready);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the writer catch up
      }
    }
    return s;
  }
};

// A backend whose GEMMs with m = 13 throw, and whose copies into a 26-byte buffer throw.
class ThrowingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    if (job.shape.m == 13) throw std::runtime_error("kernel exploded");
    return ForwardingBackend::Run(slot, job, report);
  }
  absl::Status WriteResident(ResidentBuffer& buffer, int64_t offset, const void* host,
                             int64_t bytes) override {
    if (buffer.bytes == 26) throw std::bad_alloc();
    return ForwardingBackend::WriteResident(buffer, offset, host, bytes);
  }
};

// An exception in a worker (GEMM or copy) becomes its call's status; the worker must not die
// with it (std::terminate).
TEST_F(ServerTest, ExceptionsInWorkersBecomeStatuses) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  server_ = HgemmServer::Start(options,
                               std::make_unique<ThrowingBackend>(MakeCpuBackend({.workers = 1})));
  ASSERT_NE(server_, nullptr);
  client_ = std::make_unique<GemmClient>(Connect("127.0.0.1:" + std::to_string(server_->port())));
  for (int round = 0; round < 3; ++round) {  // the one worker survives each time
    v1::GemmResponse response;
    grpc::Status s = client_->Gemm(RandomRequest(13, 4, 4, rng_), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
    EXPECT_NE(s.error_message().find("kernel exploded"), std::string::npos) << s.error_message();
  }
  // A streamed 13x1 A (26 bytes): its copy throws; the GEMM is answered, the stream goes on.
  v1::GemmRequest copy_fails = RandomRequest(13, 1, 1, rng_), fine = RandomRequest(5, 6, 7, rng_);
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&copy_fails, &fine}, &results).ok());
  EXPECT_EQ(results[0].status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << results[0].status.error_message();
  ASSERT_TRUE(results[1].status.ok()) << results[1].status.error_message();
  EXPECT_LT(ErrorAgainstReference(fine, results[1].response.c()), kServiceTolerance.fp32_acc);
  ExpectStillServing();
}

TEST_F(ServerTest, StreamSendsCWhileItIsStillArriving) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.service.stream_chunk_bytes = 100'000;  // not a divisor of the pieces
  server_ = HgemmServer::Start(options,
                               std::make_unique<PiecewiseBackend>(MakeCpuBackend({.workers = 2})));
  ASSERT_NE(server_, nullptr);
  client_ = std::make_unique<GemmClient>(Connect("127.0.0.1:" + std::to_string(server_->port())));
  std::vector<v1::GemmRequest> requests;
  for (uint32_t m : {777u, 300u, 1024u}) requests.push_back(RandomRequest(m, 513, 129, rng_));
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&requests[0], &requests[1], &requests[2]}, &results).ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_LT(ErrorAgainstReference(requests[i], results[i].response.c()),
              kServiceTolerance.fp32_acc)
        << i;
  }
}

TEST_F(ServerTest, ManyGemmsOnOneStream) {
  std::vector<v1::GemmRequest> requests;
  for (uint32_t i = 0; i < 12; ++i)
    requests.push_back(RandomRequest(30 + 37 * i, 200 - 11 * i, 1 + 53 * i, rng_));
  std::vector<const v1::GemmRequest*> pointers;
  for (auto& r : requests) pointers.push_back(&r);
  std::vector<StreamedGemm> results;
  CallOptions options;
  options.chunk_bytes = 4096;  // many chunks per operand
  ASSERT_TRUE(client_->GemmStream(pointers, &results, options).ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_LT(ErrorAgainstReference(requests[i], results[i].response.c()),
              kServiceTolerance.fp32_acc)
        << i;
  }
}

TEST_F(ServerTest, RunPicksUnaryOrStreamBySize) {
  for (uint32_t size : {64u, 1200u}) {
    v1::GemmRequest r = RandomRequest(size, size, size, rng_);
    v1::GemmResponse response;
    ASSERT_TRUE(client_->Run(r, &response).ok());
    EXPECT_LT(ErrorAgainstReference(r, response.c()), kServiceTolerance.fp32_acc);
  }
}

TEST_F(ServerTest, BadUnaryRequestsGetInvalidArgument) {
  v1::GemmResponse response;
  v1::GemmRequest wrong_length = RandomRequest(4, 4, 4, rng_);
  wrong_length.mutable_a()->resize(30);
  grpc::Status s = client_->Gemm(wrong_length, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("a: 30 bytes"), std::string::npos) << s.error_message();

  v1::GemmRequest zero = RandomRequest(4, 4, 4, rng_);
  zero.set_n(0);
  EXPECT_EQ(client_->Gemm(zero, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::GemmRequest unknown = RandomRequest(4, 4, 4, rng_);
  unknown.mutable_options()->set_kernel("warp_drive");
  s = client_->Gemm(unknown, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("warp_drive"), std::string::npos);
  ExpectStillServing();
}

// Overflowing shapes and empty handles, through the server.
TEST_F(ServerTest, UnaryOverflowingShapesAndEmptyHandlesAreRefused) {
  v1::GemmResponse response;
  v1::GemmRequest wraps;  // the 2·m·k-wraps case of item 1 is in validation_test
  wraps.set_m(4294967295u);
  wraps.set_n(4294967295u);
  wraps.set_k(4294967295u);
  grpc::Status s = client_->Gemm(wraps, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(s.error_message().find('-'), std::string::npos) << s.error_message();

  for (int operand = 0; operand < 3; ++operand) {
    v1::GemmRequest empty = RandomRequest(262144, 1, 256, rng_);
    if (operand != 1) empty.set_a_handle("");
    if (operand != 0) empty.set_b_handle("");
    s = client_->Gemm(empty, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << operand;
    EXPECT_NE(s.error_message().find("_handle: empty"), std::string::npos) << s.error_message();
  }
  ExpectStillServing();
}

// FP16 asked of a backend without it is refused, and ListKernels says so.
TEST_F(ServerTest, Fp16OnTheCpuBackendIsRefusedAndNotListed) {
  v1::GemmRequest r = RandomRequest(8, 8, 8, rng_);
  r.mutable_options()->set_accumulation(v1::ACCUMULATION_FP16);
  v1::GemmResponse response;
  grpc::Status s = client_->Gemm(r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  v1::ListKernelsResponse kernels;
  ASSERT_TRUE(client_->ListKernels(&kernels).ok());
  ASSERT_GT(kernels.kernels_size(), 0);
  EXPECT_EQ(kernels.kernels(0).name(), "auto");
  for (const v1::KernelInfo& k : kernels.kernels()) {
    for (int a : k.accumulations()) EXPECT_NE(a, v1::ACCUMULATION_FP16) << k.name();
  }
}

TEST_F(ServerTest, OverLimitIsResourceExhausted) {
  ServerOptions options;
  options.service.rules.max_elements_per_matrix = 1000;
  StartServer(options);
  v1::GemmResponse response;
  EXPECT_EQ(client_->Gemm(RandomRequest(40, 40, 40, rng_), &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectStillServing();
}

// Sends raw stream messages, then reads until the server ends the call.
grpc::Status RawStream(GemmClient&, v1::GemmService::Stub& stub,
                       const std::vector<v1::GemmStreamRequest>& messages, bool writes_done,
                       std::vector<v1::GemmStreamResponse>* answers = nullptr) {
  grpc::ClientContext context;
  auto stream = stub.GemmStream(&context);
  for (const auto& m : messages) {
    if (!stream->Write(m)) break;
  }
  if (writes_done) stream->WritesDone();
  v1::GemmStreamResponse response;
  while (stream->Read(&response)) {
    if (answers) answers->push_back(response);
  }
  return stream->Finish();
}

// The `done` of every GEMM among a stream's answers, by gemm_id.
std::map<uint64_t, v1::GemmDone> DonesById(const std::vector<v1::GemmStreamResponse>& answers) {
  std::map<uint64_t, v1::GemmDone> done;
  for (const v1::GemmStreamResponse& a : answers) {
    if (a.has_done()) done[a.gemm_id()] = a.done();
  }
  return done;
}

v1::GemmStreamRequest Header(uint64_t id, uint32_t m, uint32_t n, uint32_t k) {
  v1::GemmStreamRequest message;
  auto* h = message.mutable_header();
  h->set_gemm_id(id);
  h->set_m(m);
  h->set_n(n);
  h->set_k(k);
  return message;
}

v1::GemmStreamRequest Chunk(uint64_t id, v1::Operand operand, uint64_t offset, size_t bytes) {
  v1::GemmStreamRequest message;
  auto* c = message.mutable_chunk();
  c->set_gemm_id(id);
  c->set_operand(operand);
  c->set_offset(offset);
  c->set_data(std::string(bytes, '\x3c'));
  return message;
}

TEST_F(ServerTest, StreamChunkOutOfOrderEndsStreamWithInvalidArgument) {
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  grpc::Status s = RawStream(
      *client_, *stub,
      {Header(1, 4, 4, 4), Chunk(1, v1::OPERAND_A, 0, 16), Chunk(1, v1::OPERAND_A, 24, 8)}, true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("chunk.offset"), std::string::npos) << s.error_message();
  ExpectStillServing();
}

TEST_F(ServerTest, StreamClosedMidMatrixAnswersFinishedGemmsThenFails) {
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  std::vector<v1::GemmStreamResponse> answers;
  grpc::Status s =
      RawStream(*client_, *stub,
                {Header(1, 2, 2, 2), Chunk(1, v1::OPERAND_A, 0, 8), Chunk(1, v1::OPERAND_B, 0, 8),
                 Header(2, 4, 4, 4), Chunk(2, v1::OPERAND_A, 0, 10)},
                true, &answers);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("gemm_id 2 was incomplete"), std::string::npos)
      << s.error_message();
  ASSERT_FALSE(answers.empty());
  EXPECT_TRUE(answers.back().has_done());
  EXPECT_EQ(answers.back().gemm_id(), 1u);
  EXPECT_EQ(answers.back().done().status_code(), 0);
  ExpectStillServing();
}

// Bad header values (m = 0, an unknown kernel, 2³²−1 cubed, FP16 on a backend without it) are
// answered per GEMM and the stream goes on; the wrapped sizes of 2³²−1 must not leave the
// stream unanswered and shutdown wedged.
TEST_F(ServerTest, StreamBadHeadersAreAnsweredPerGemmAndTheStreamGoesOn) {
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  v1::GemmStreamRequest unknown_kernel = Header(3, 4, 4, 4);
  unknown_kernel.mutable_header()->mutable_options()->set_kernel("nope");
  v1::GemmStreamRequest fp16 = Header(6, 2, 2, 2);
  fp16.mutable_header()->mutable_options()->set_accumulation(v1::ACCUMULATION_FP16);
  std::vector<v1::GemmStreamResponse> answers;
  grpc::Status s =
      RawStream(*client_, *stub,
                {Header(1, 2, 2, 2), Chunk(1, v1::OPERAND_A, 0, 8), unknown_kernel,
                 Chunk(3, v1::OPERAND_A, 0, 32), Header(4, 0, 4, 4),
                 Header(5, 4294967295u, 4294967295u, 4294967295u), Chunk(5, v1::OPERAND_A, 0, 64),
                 fp16, Chunk(1, v1::OPERAND_B, 0, 8), Header(7, 2, 2, 2),
                 Chunk(7, v1::OPERAND_A, 0, 8), Chunk(7, v1::OPERAND_B, 0, 8)},
                true, &answers);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::map<uint64_t, v1::GemmDone> done = DonesById(answers);
  ASSERT_EQ(done.size(), 6u);
  EXPECT_EQ(done[1].status_code(), grpc::StatusCode::OK) << done[1].status_message();
  EXPECT_EQ(done[7].status_code(), grpc::StatusCode::OK) << done[7].status_message();
  EXPECT_EQ(done[3].status_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(done[3].status_message().find("gemm_id 3: header.options.kernel"), std::string::npos)
      << done[3].status_message();
  EXPECT_EQ(done[4].status_code(), grpc::StatusCode::INVALID_ARGUMENT) << done[4].status_message();
  EXPECT_EQ(done[5].status_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << done[5].status_message();
  EXPECT_NE(done[5].status_message().find("18446744065119617025"), std::string::npos)
      << done[5].status_message();
  EXPECT_EQ(done[6].status_code(), grpc::StatusCode::INVALID_ARGUMENT) << done[6].status_message();
  ExpectStillServing();
}

// A GEMM refused at its header (too large, unknown handle) still has its chunks coming: they
// are dropped, the GEMM is answered with the reason, and the stream goes on.
TEST_F(ServerTest, StreamGemmRefusedAtHeaderIsAnsweredAndTheStreamGoesOn) {
  ServerOptions options;
  options.service.scheduler.max_queued_bytes = 1 << 20;
  StartServer(options);
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  v1::GemmStreamRequest by_handle = Header(2, 4, 4, 4);
  by_handle.mutable_header()->set_a_handle("m-00000000000000000000000000000000");
  std::vector<v1::GemmStreamResponse> answers;
  grpc::Status s =
      RawStream(*client_, *stub,
                {Header(1, 512, 512, 512), Chunk(1, v1::OPERAND_A, 0, 256 << 10),  // 1.5 MiB in all
                 Chunk(1, v1::OPERAND_A, 256 << 10, 256 << 10),
                 Chunk(1, v1::OPERAND_B, 0, 512 << 10), by_handle, Chunk(2, v1::OPERAND_B, 0, 32),
                 Header(3, 2, 2, 2), Chunk(3, v1::OPERAND_A, 0, 8), Chunk(3, v1::OPERAND_B, 0, 8)},
                true, &answers);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::map<uint64_t, v1::GemmDone> done = DonesById(answers);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[1].status_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << done[1].status_message();
  EXPECT_EQ(done[2].status_code(), grpc::StatusCode::NOT_FOUND) << done[2].status_message();
  EXPECT_EQ(done[3].status_code(), grpc::StatusCode::OK) << done[3].status_message();
  ExpectStillServing();
}

// Sends a whole 2x2x2 GEMM tagged `id` and reads up to its done (or the stream's end): the
// server has then read everything sent on the stream before it (messages are read in order).
void SmallGemmRoundTrip(GemmStreamWriter& stream, uint64_t id) {
  ASSERT_TRUE(stream.Write(Header(id, 2, 2, 2)));
  ASSERT_TRUE(stream.Write(Chunk(id, v1::OPERAND_A, 0, 8)));
  ASSERT_TRUE(stream.Write(Chunk(id, v1::OPERAND_B, 0, 8)));
  v1::GemmStreamResponse response;
  do {
    ASSERT_TRUE(stream.Read(&response));
  } while (!response.has_done());
  EXPECT_EQ(response.gemm_id(), id);
  EXPECT_EQ(response.done().status_code(), 0) << response.done().status_message();
}

// GEMMs whose chunks stop coming are refused after the idle timeout (their
// buffers freed) and the stream goes on; an upload that stops is ended; one client's streams
// together can't pin more than its pending budget.
TEST_F(ServerTest, IdleStreamedGemmsAndUploadsTimeOut) {
  ServerOptions options;
  options.service.idle_timeout = std::chrono::seconds(1);
  StartServer(options);
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  grpc::ClientContext context;
  auto stream = stub->GemmStream(&context);
  ASSERT_TRUE(stream->Write(Header(1, 256, 256, 256)));
  ASSERT_TRUE(stream->Write(Chunk(1, v1::OPERAND_A, 0, 4096)));  // then nothing for > 1 s
  v1::GemmStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.gemm_id(), 1u);
  ASSERT_TRUE(response.has_done());
  EXPECT_EQ(response.done().status_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << response.done().status_message();
  ASSERT_TRUE(stream->Write(Chunk(1, v1::OPERAND_A, 4096, 4096)));  // late: dropped
  ASSERT_TRUE(stream->Write(Header(2, 2, 2, 2)));
  ASSERT_TRUE(stream->Write(Chunk(2, v1::OPERAND_A, 0, 8)));
  ASSERT_TRUE(stream->Write(Chunk(2, v1::OPERAND_B, 0, 8)));
  ASSERT_TRUE(stream->WritesDone());
  std::map<uint64_t, v1::GemmDone> done;
  while (stream->Read(&response)) {
    if (response.has_done()) done[response.gemm_id()] = response.done();
  }
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(done.count(2), 1u);
  EXPECT_EQ(done[2].status_code(), 0) << done[2].status_message();

  grpc::ClientContext upload_context;
  v1::MatrixInfo info;
  auto upload = stub->UploadMatrix(&upload_context, &info);
  v1::UploadMatrixRequest header;
  header.mutable_header()->set_rows(64);
  header.mutable_header()->set_cols(64);
  ASSERT_TRUE(upload->Write(header));  // and no chunk
  grpc::Status s = upload->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  v1::ListMatricesResponse matrices;
  ASSERT_TRUE(client_->ListMatrices(&matrices).ok());
  EXPECT_EQ(matrices.client_bytes(), 0);  // its quota reservation was given back
  ExpectStillServing();
}

TEST_F(ServerTest, PendingBytesAreBoundedPerClient) {
  ServerOptions options;
  options.service.max_client_pending_bytes = 300'000;  // one 256³ GEMM's A and B: 262 144
  StartServer(options);
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  grpc::ClientContext first_context, second_context;
  auto first = stub->GemmStream(&first_context);
  auto second = stub->GemmStream(&second_context);
  ASSERT_TRUE(first->Write(Header(1, 256, 256, 256)));
  ASSERT_TRUE(first->Write(Chunk(1, v1::OPERAND_A, 0, 1024)));
  ASSERT_NO_FATAL_FAILURE(SmallGemmRoundTrip(*first, 2));  // GEMM 1's header is in now
  v1::GemmStreamResponse response;
  ASSERT_TRUE(second->Write(Header(7, 256, 256, 256)));
  ASSERT_TRUE(second->Read(&response));  // refused at once: the first stream holds the budget
  EXPECT_EQ(response.gemm_id(), 7u);
  EXPECT_EQ(response.done().status_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << response.done().status_message();
  EXPECT_NE(response.done().status_message().find("max_client_pending_bytes"), std::string::npos);
  first_context.TryCancel();
  first->Finish();
  // The budget comes back once the first stream's GEMM is gone.
  for (int attempt = 0;; ++attempt) {
    ASSERT_TRUE(second->Write(Header(8 + attempt, 256, 256, 256)));
    ASSERT_TRUE(second->Write(Chunk(8 + attempt, v1::OPERAND_A, 0, 131072)));
    ASSERT_TRUE(second->Write(Chunk(8 + attempt, v1::OPERAND_B, 0, 131072)));
    std::map<uint64_t, v1::GemmDone> done;
    while (done.empty() && second->Read(&response)) {
      if (response.has_done()) done[response.gemm_id()] = response.done();
    }
    ASSERT_FALSE(done.empty());
    if (done.begin()->second.status_code() == 0) break;
    ASSERT_LT(attempt, 100) << done.begin()->second.status_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  second->WritesDone();
  EXPECT_TRUE(second->Finish().ok());
}

// At shutdown an idle stream ends at once with UNAVAILABLE (rather than hold the drain until
// its deadline, then get CANCELLED), and a busy one once its GEMM is answered.
TEST_F(ServerTest, ShutdownEndsIdleStreamsWithUnavailable) {
  ServerOptions options;
  options.drain_deadline = std::chrono::seconds(60);
  StartServer(options);
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  grpc::ClientContext idle_context, busy_context;
  auto idle = stub->GemmStream(&idle_context);
  auto busy = stub->GemmStream(&busy_context);
  ASSERT_NO_FATAL_FAILURE(SmallGemmRoundTrip(*idle, 1));  // answered: the stream is idle now
  // A 2-byte C: the answer fits HTTP/2's flow-control window, so the client has nothing to
  // send back while the server finishes. (Window updates still on the wire when the stopped
  // server closes the socket would reset the connection under the client's last frames.)
  ASSERT_TRUE(busy->Write(Header(1, 1, 1, 300000)));
  ASSERT_TRUE(busy->Write(Chunk(1, v1::OPERAND_A, 0, 600000)));
  ASSERT_NO_FATAL_FAILURE(SmallGemmRoundTrip(*busy, 2));  // the big one is half-received now
  v1::GemmStreamResponse response;
  std::thread shutdown([this] { server_->Shutdown(); });
  while (idle->Read(&response)) {
  }
  grpc::Status s = idle->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // The busy stream's GEMM was half-received when the drain began: it completes, then the
  // stream ends.
  EXPECT_TRUE(busy->Write(Chunk(1, v1::OPERAND_B, 0, 600000)));
  std::map<uint64_t, v1::GemmDone> done;
  while (busy->Read(&response)) {
    if (response.has_done()) done[response.gemm_id()] = response.done();
  }
  s = busy->Finish();
  shutdown.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  ASSERT_EQ(done.count(1), 1u) << s.error_message();
  EXPECT_EQ(done[1].status_code(), 0) << done[1].status_message();
}

// Between the start of the drain and grpc::Server::Shutdown (which waits for the GEMMs
// admitted before), gRPC still takes calls: a new Gemm used to be admitted and then wait out its
// deadline behind them (or be answered by a server going away). Now every new call is refused
// at once with UNAVAILABLE, on an open connection or a new one, while the GEMM admitted before
// the drain runs and is answered.
TEST(ServerDrain, NewCallsAreRefusedAtOnceWhileAdmittedGemmsFinish) {
  auto gated = std::make_unique<GatedBackend>(MakeCpuBackend({.workers = 2}));
  GatedBackend* gate = gated.get();
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.drain_deadline = std::chrono::seconds(120);
  std::unique_ptr<HgemmServer> server = HgemmServer::Start(options, std::move(gated));
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(server->port());
  std::shared_ptr<v1::GemmService::Stub> stub = v1::GemmService::NewStub(Connect(target));
  auto deadline = [](grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  };
  std::mt19937_64 rng(11);
  const v1::GemmRequest held_request = RandomRequest(33, 17, 65, rng);
  v1::GemmResponse held_response;
  grpc::Status held_status;
  std::thread held([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    held_status = stub->Gemm(&context, held_request, &held_response);
  });
  gate->AwaitWaiting();  // admitted, and running until the gate opens
  std::thread shutdown([&] { server->Shutdown(); });

  // The drain has begun once a call is refused (before, calls were answered until the drain
  // deadline: the bound only keeps a failure from waiting that long).
  grpc::Status info;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    grpc::ClientContext context;
    deadline(&context);
    v1::ServerInfo response;
    info = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  } while (info.ok() && std::chrono::steady_clock::now() < give_up);
  EXPECT_EQ(info.error_code(), grpc::StatusCode::UNAVAILABLE) << info.error_message();

  for (bool new_connection : {false, true}) {
    SCOPED_TRACE(new_connection ? "a new connection" : "the open connection");
    std::shared_ptr<v1::GemmService::Stub> caller =
        new_connection ? v1::GemmService::NewStub(Connect(target)) : stub;
    grpc::ClientContext context;
    deadline(&context);
    v1::GemmResponse response;
    grpc::Status s = caller->Gemm(&context, RandomRequest(8, 8, 8, rng), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_NE(s.error_message().find("shutting down"), std::string::npos) << s.error_message();
  }
  {
    grpc::ClientContext context;
    deadline(&context);
    v1::ListKernelsResponse response;
    grpc::Status s = stub->ListKernels(&context, v1::ListKernelsRequest(), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  {
    grpc::ClientContext context;
    deadline(&context);
    auto stream = stub->GemmStream(&context);
    v1::GemmStreamResponse response;
    while (stream->Read(&response)) {
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }

  gate->Open();
  held.join();
  shutdown.join();
  ASSERT_TRUE(held_status.ok()) << held_status.error_message();
  EXPECT_LT(ErrorAgainstReference(held_request, held_response.c()), kServiceTolerance.fp32_acc);
}

// One client could fill the scheduler's whole queue (16 rings of 64 GEMMs in flight, say), and
// every other client got "queue full". Each now has a share of it: past its share a client's
// GEMM is refused (UNAVAILABLE, naming the flag) while another client's is still admitted.
TEST(ServerFairness, OneClientCannotTakeMoreThanItsShareOfTheQueue) {
  auto gated = std::make_unique<GatedBackend>(MakeCpuBackend({.workers = 1}));
  GatedBackend* gate = gated.get();
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.service.scheduler.max_queued_requests = 8;
  options.service.scheduler.max_queued_per_owner = 2;
  std::unique_ptr<HgemmServer> server = HgemmServer::Start(options, std::move(gated));
  ASSERT_NE(server, nullptr);
  std::unique_ptr<v1::GemmService::Stub> stub =
      v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server->port())));
  std::mt19937_64 rng(12);
  // A GEMM of `client` (the principal "x-client-id" names over TCP), on a thread of its own.
  struct Call {
    v1::GemmRequest request;
    v1::GemmResponse response;
    grpc::Status status;
    std::thread thread;
  };
  auto gemm = [&](const std::string& client, Call* call) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", client);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    call->status = stub->Gemm(&context, call->request, &call->response);
  };
  auto queued = [&] {
    grpc::ClientContext context;
    v1::ServerInfo info;
    EXPECT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    return info.load().queued();
  };
  std::vector<std::unique_ptr<Call>> alice;
  for (int i = 0; i < 3; ++i) {  // one running (held at the gate), two queued: her share
    alice.push_back(std::make_unique<Call>());
    alice.back()->request = RandomRequest(9, 7, 5, rng);
    alice.back()->thread = std::thread(gemm, "alice", alice.back().get());
    if (i == 0) gate->AwaitWaiting();
  }
  while (queued() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  Call over{.request = RandomRequest(9, 7, 5, rng)};
  gemm("alice", &over);
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::UNAVAILABLE) << over.status.error_message();
  EXPECT_NE(over.status.error_message().find("--max_queued_per_client"), std::string::npos)
      << over.status.error_message();

  Call bob{.request = RandomRequest(13, 11, 9, rng)};
  bob.thread = std::thread(gemm, "bob", &bob);
  while (queued() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // admitted
  gate->Open();
  bob.thread.join();
  ASSERT_TRUE(bob.status.ok()) << bob.status.error_message();
  EXPECT_LT(ErrorAgainstReference(bob.request, bob.response.c()), kServiceTolerance.fp32_acc);
  for (auto& call : alice) {
    call->thread.join();
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
  }
  v1::ServerInfo info;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.limits().max_queued_per_client(), 2u);
}

TEST_F(ServerTest, ClientCancelMidStreamLeavesServerServing) {
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  {
    grpc::ClientContext context;
    auto stream = stub->GemmStream(&context);
    ASSERT_TRUE(stream->Write(Header(1, 512, 512, 512)));
    ASSERT_TRUE(stream->Write(Chunk(1, v1::OPERAND_A, 0, 4096)));
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ExpectStillServing();
}

TEST_F(ServerTest, ExpiredDeadlineIsDeadlineExceeded) {
  v1::GemmRequest r = RandomRequest(1024, 1024, 1024, rng_);
  v1::GemmResponse response;
  CallOptions options;
  options.timeout = std::chrono::milliseconds(1);
  EXPECT_EQ(client_->Gemm(r, &response, options).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ExpectStillServing();
}

TEST_F(ServerTest, ListKernelsAndServerInfo) {
  v1::ListKernelsResponse kernels;
  ASSERT_TRUE(client_->ListKernels(&kernels).ok());
  ASSERT_EQ(kernels.kernels_size(), 2);
  EXPECT_EQ(kernels.kernels(0).name(), "auto");
  EXPECT_EQ(kernels.kernels(1).name(), "openblas_sgemm");
  v1::ServerInfo info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_EQ(info.version(), kVersion);
  EXPECT_GT(info.limits().max_message_bytes(), 4u << 20);
  EXPECT_EQ(info.limits().stream_chunk_bytes(), 256u << 10);
  ASSERT_EQ(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).streams(), 2);
}

TEST_F(ServerTest, ConcurrentClientsAllGetCorrectAnswers) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 5; ++i) {
        v1::GemmRequest r = RandomRequest(64 + t, 96, 128 + i, rng);
        v1::GemmResponse response;
        if (!client_->Gemm(r, &response).ok() ||
            ErrorAgainstReference(r, response.c()) > kServiceTolerance.fp32_acc) {
          failures++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
}

TEST_F(ServerTest, ResidentLifecycleChainingAndRelease) {
  std::mt19937_64 rng(3);
  const uint32_t m = 70, k = 90, n = 50, p = 30;
  std::string a = HalfBytes(RandomHalfMatrix(m * k, rng)),
              b = HalfBytes(RandomHalfMatrix(k * n, rng)),
              b2 = HalfBytes(RandomHalfMatrix(n * p, rng));
  v1::MatrixInfo a_info, b_info, b2_info;
  ASSERT_TRUE(client_->UploadMatrix(m, k, a, &a_info, 0, "A").ok());
  ASSERT_TRUE(client_->UploadMatrix(k, n, b, &b_info).ok());
  ASSERT_TRUE(client_->UploadMatrix(n, p, b2, &b2_info).ok());
  EXPECT_EQ(a_info.rows(), m);
  EXPECT_EQ(a_info.bytes(), 2u * m * k);
  EXPECT_EQ(a_info.label(), "A");
  EXPECT_NE(a_info.handle(), b_info.handle());

  // C = A·B stays resident, then C·B2 chains it as the next A.
  v1::GemmRequest first;
  first.set_m(m);
  first.set_n(n);
  first.set_k(k);
  first.set_a_handle(a_info.handle());
  first.set_b_handle(b_info.handle());
  first.set_keep_c_resident(true);
  v1::GemmResponse c_response;
  ASSERT_TRUE(client_->Gemm(first, &c_response).ok());
  EXPECT_TRUE(c_response.c().empty());
  ASSERT_TRUE(c_response.has_c_matrix());
  EXPECT_EQ(c_response.c_matrix().rows(), m);
  EXPECT_EQ(c_response.c_matrix().cols(), n);

  std::string c;
  ASSERT_TRUE(client_->DownloadMatrix(c_response.c_matrix().handle(), &c).ok());
  v1::GemmRequest plain;
  plain.set_m(m);
  plain.set_n(n);
  plain.set_k(k);
  plain.set_a(a);
  plain.set_b(b);
  EXPECT_LT(ErrorAgainstReference(plain, c), kServiceTolerance.fp32_acc);

  v1::GemmRequest chained;
  chained.set_m(m);
  chained.set_n(p);
  chained.set_k(n);
  chained.set_a_handle(c_response.c_matrix().handle());
  chained.set_b_handle(b2_info.handle());
  v1::GemmResponse chained_response;
  ASSERT_TRUE(client_->Gemm(chained, &chained_response).ok());
  v1::GemmRequest chained_plain;
  chained_plain.set_m(m);
  chained_plain.set_n(p);
  chained_plain.set_k(n);
  chained_plain.set_a(c);
  chained_plain.set_b(b2);
  EXPECT_LT(ErrorAgainstReference(chained_plain, chained_response.c()), kServiceTolerance.fp32_acc);

  v1::ListMatricesResponse listed;
  ASSERT_TRUE(client_->ListMatrices(&listed).ok());
  EXPECT_EQ(listed.matrices_size(), 4);  // A, B, B2, C
  EXPECT_EQ(listed.client_bytes(), 2u * (m * k + k * n + n * p + m * n));

  ASSERT_TRUE(client_->ReleaseMatrix(a_info.handle()).ok());
  v1::GemmResponse response;
  grpc::Status s = client_->Gemm(first, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("a_handle"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("released"), std::string::npos) << s.error_message();
  EXPECT_EQ(client_->ReleaseMatrix(a_info.handle()).error_code(), grpc::StatusCode::NOT_FOUND);
  ExpectStillServing();
}

TEST_F(ServerTest, ResidentMixedWithBytesConcurrentlyAndOnStreams) {
  std::mt19937_64 rng(4);
  const uint32_t m = 64, k = 128, n = 96;
  std::string b = HalfBytes(RandomHalfMatrix(k * n, rng));
  v1::MatrixInfo b_info;
  ASSERT_TRUE(client_->UploadMatrix(k, n, b, &b_info).ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(t);
      v1::GemmRequest r;
      r.set_m(m);
      r.set_n(n);
      r.set_k(k);
      r.set_a(HalfBytes(RandomHalfMatrix(m * k, local)));
      r.set_b_handle(b_info.handle());
      v1::GemmResponse response;
      v1::GemmRequest plain = r;
      plain.set_b(b);
      for (int i = 0; i < 4; ++i) {
        if (!client_->Gemm(r, &response).ok() ||
            ErrorAgainstReference(plain, response.c()) > kServiceTolerance.fp32_acc) {
          failures++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);

  // On a stream: one GEMM with B by handle, one with both by handle and C kept.
  v1::MatrixInfo a_info;
  std::string a = HalfBytes(RandomHalfMatrix(m * k, rng));
  ASSERT_TRUE(client_->UploadMatrix(m, k, a, &a_info).ok());
  v1::GemmRequest with_b, with_both;
  for (v1::GemmRequest* r : {&with_b, &with_both}) {
    r->set_m(m);
    r->set_n(n);
    r->set_k(k);
    r->set_b_handle(b_info.handle());
  }
  with_b.set_a(a);
  with_both.set_a_handle(a_info.handle());
  with_both.set_keep_c_resident(true);
  std::vector<StreamedGemm> results;
  CallOptions options;
  options.chunk_bytes = 1000;
  ASSERT_TRUE(client_->GemmStream({&with_b, &with_both}, &results, options).ok());
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.error_message();
  ASSERT_TRUE(results[1].status.ok()) << results[1].status.error_message();
  v1::GemmRequest plain = with_b;
  plain.set_b(b);
  EXPECT_LT(ErrorAgainstReference(plain, results[0].response.c()), kServiceTolerance.fp32_acc);
  std::string c;
  ASSERT_TRUE(client_->DownloadMatrix(results[1].response.c_matrix().handle(), &c).ok());
  // The same inputs as results[0]'s, but not bit for bit the same C: the two may have run in
  // one launch (batching), whose rows change the kernel's blocking.
  EXPECT_LT(ErrorAgainstReference(plain, c), kServiceTolerance.fp32_acc);
}

TEST_F(ServerTest, ResidentErrors) {
  ServerOptions options;
  options.service.resident.quota_bytes_per_client = 4096;
  StartServer(options);
  std::mt19937_64 rng(5);
  v1::MatrixInfo info;
  ASSERT_TRUE(client_->UploadMatrix(16, 16, HalfBytes(RandomHalfMatrix(256, rng)), &info).ok());
  // Over the quota (512 B used of 4 KiB; 8 KiB more).
  EXPECT_EQ(
      client_->UploadMatrix(64, 64, HalfBytes(RandomHalfMatrix(4096, rng)), &info).error_code(),
      grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Short upload.
  EXPECT_EQ(
      client_->UploadMatrix(16, 16, HalfBytes(RandomHalfMatrix(100, rng)), &info).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(client_->UploadMatrix(16, 16, HalfBytes(RandomHalfMatrix(256, rng)), &info).ok());
  // Wrong shape for its place.
  v1::GemmRequest r = RandomRequest(16, 8, 16, rng_);
  r.set_b_handle(info.handle());
  v1::GemmResponse response;
  grpc::Status s = client_->Gemm(r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("b_handle: matrix"), std::string::npos) << s.error_message();
  // Another client's handle, and one that never existed.
  r = RandomRequest(16, 16, 16, rng_);
  r.set_b_handle(info.handle());
  CallOptions other;
  other.client_id = "someone-else";
  EXPECT_EQ(client_->Gemm(r, &response, other).error_code(), grpc::StatusCode::NOT_FOUND);
  r.set_b_handle("m-00000000000000000000000000000000");
  EXPECT_EQ(client_->Gemm(r, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  // A kept C over the quota.
  r.set_b_handle(info.handle());
  r.set_keep_c_resident(true);
  r.set_m(200);
  r.set_a(HalfBytes(RandomHalfMatrix(200 * 16, rng)));
  EXPECT_EQ(client_->Gemm(r, &response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectStillServing();
}

// UploadMatrix is read raw: a lone chunk goes to the matrix as its slices, any other message
// through protobuf, and both land where they belong.
TEST_F(ServerTest, UploadMatrixTakesLoneChunksAsSlicesAndOthersThroughProtobuf) {
  auto stub = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  std::mt19937_64 rng(11);
  const std::string bytes = HalfBytes(RandomHalfMatrix(64 * 48, rng));
  // `messages` on one UploadMatrix call, to its end.
  auto upload = [&](const std::vector<v1::UploadMatrixRequest>& messages, v1::MatrixInfo* info) {
    grpc::ClientContext context;
    auto writer = stub->UploadMatrix(&context, info);
    for (const v1::UploadMatrixRequest& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  v1::UploadMatrixRequest header;
  header.mutable_header()->set_rows(64);
  header.mutable_header()->set_cols(48);
  auto chunk = [&](size_t at, size_t size) {
    v1::UploadMatrixRequest m;
    m.set_chunk(bytes.substr(at, size));
    return m;
  };
  // The middle chunk carries a field this server does not know: not a lone chunk.
  v1::UploadMatrixRequest middle = chunk(1000, 3000);
  middle.GetReflection()->MutableUnknownFields(&middle)->AddVarint(99, 1);
  v1::MatrixInfo info;
  ASSERT_TRUE(
      upload({header, chunk(0, 1000), middle, chunk(4000, bytes.size() - 4000)}, &info).ok());
  EXPECT_EQ(info.rows(), 64u);
  EXPECT_EQ(info.bytes(), bytes.size());
  std::string downloaded;
  ASSERT_TRUE(client_->DownloadMatrix(info.handle(), &downloaded).ok());
  EXPECT_EQ(downloaded, bytes);
  // A lone chunk past the end, and one before any header, still get their clear statuses.
  grpc::Status s = upload({header, chunk(0, 4000), chunk(0, bytes.size())}, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("past the end"), std::string::npos) << s.error_message();
  s = upload({chunk(0, 16), header}, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("header"), std::string::npos) << s.error_message();
  ExpectStillServing();
}

// The client core writes its upload chunks from the caller's memory (static slices), and an
// upload's matrix comes back byte for byte, on each path; a --grpc_arg reaches the channels.
TEST_F(ServerTest, ClientUploadsFromTheCallersMemoryWithGrpcArgs) {
  ConnectOptions connect;
  connect.grpc_args = {{"grpc.http2.max_frame_size", 1 << 20}, {"grpc.http2.bdp_probe", 0}};
  GemmClient client(Connect("127.0.0.1:" + std::to_string(server_->port()), connect));
  std::mt19937_64 rng(12);
  const std::string bytes = HalfBytes(RandomHalfMatrix(512 * 300, rng));
  CallOptions call;
  call.chunk_bytes = 7000;  // odd chunks: the last one short
  v1::MatrixInfo info;
  ASSERT_TRUE(client.UploadMatrix(512, 300, bytes, &info, 0, "", call).ok());
  std::string downloaded;
  ASSERT_TRUE(client.DownloadMatrix(info.handle(), &downloaded).ok());
  EXPECT_EQ(downloaded, bytes);
}

}  // namespace
}  // namespace hgemm
