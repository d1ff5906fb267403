// The error contract end to end (docs/errors.md): a real HgemmServer on 127.0.0.1 (CPU backend)
// answers one bad request per status code, and each status carries the google.rpc.Status its
// code promises: on unary calls in gRPC's grpc-status-details-bin trailer, on a stream in the
// GEMM's GemmDone.status, read back by the client library (client/error_details.h).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/error_details.h"
#include "client/gemm_client.h"
#include "google/rpc/status.pb.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/auth/test_certs.h"
#include "server/backend/cpu_backend.h"
#include "server/core/status.h"
#include "server/server.h"
#include "server/testing/forwarding_backend.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;

constexpr char kUnknownHandle[] = "m-00000000000000000000000000000000";

// A backend whose every GEMM fails with `failure` (a backend error, a failed device).
class FailingBackend final : public ForwardingBackend {
 public:
  explicit FailingBackend(absl::Status failure)
      : ForwardingBackend(MakeCpuBackend({.workers = 1})), failure_(std::move(failure)) {}
  absl::Status Run(int, const GemmJob&, GemmReport*) override { return failure_; }

 private:
  const absl::Status failure_;
};

// The details of a failed `s`, once its google.rpc.Status is checked against its code and
// message, and each detail is one of the public google.rpc types (what any client decodes).
ErrorDetails DetailsOf(const grpc::Status& s) {
  google::rpc::Status rpc;
  EXPECT_TRUE(rpc.ParseFromString(s.error_details())) << s.error_message();
  EXPECT_EQ(rpc.code(), int(s.error_code()));
  EXPECT_EQ(rpc.message(), s.error_message());
  EXPECT_FALSE(rpc.details().empty()) << "an ErrorInfo at least: " << s.error_message();
  for (const google::protobuf::Any& detail : rpc.details()) {
    EXPECT_EQ(detail.type_url().rfind("type.googleapis.com/google.rpc.", 0), 0u)
        << detail.type_url();
  }
  const ErrorDetails details = ErrorDetailsOf(s);
  EXPECT_EQ(details.domain, "hgemm") << s.error_message();
  return details;
}

std::vector<std::string> Fields(const ErrorDetails& d) {
  std::vector<std::string> fields;
  for (const FieldViolation& v : d.field_violations) {
    EXPECT_FALSE(v.description.empty()) << v.field;
    fields.push_back(v.field);
  }
  return fields;
}

std::vector<std::string> Subjects(const ErrorDetails& d) {
  std::vector<std::string> subjects;
  for (const QuotaViolation& v : d.quota_violations) subjects.push_back(v.subject);
  return subjects;
}

class ErrorDetailsTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {},
             std::unique_ptr<Backend> backend = MakeCpuBackend({.workers = 2})) {
    server_.reset();
    options.listen_address = "127.0.0.1:0";
    server_ = HgemmServer::Start(std::move(options), std::move(backend));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>(Target());
  }
  std::string Target() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  grpc::Status Gemm(const v1::GemmRequest& request) const {
    v1::GemmResponse response;
    return client_->Gemm(request, &response, {.timeout = 30s});
  }
  // The status of `request` as the one GEMM of a GemmStream: its GemmDone's.
  grpc::Status StreamedGemmStatus(const v1::GemmRequest& request) const {
    std::vector<StreamedGemm> results;
    EXPECT_TRUE(client_->GemmStream({&request}, &results, {.timeout = 30s}).ok());
    EXPECT_TRUE(results.at(0).answered);
    return results.at(0).status;
  }
  grpc::Status Upload(uint32_t rows, uint32_t cols, v1::MatrixInfo* info) {
    return client_->UploadMatrix(rows, cols, HalfBytes(RandomHalfMatrix(rows * cols, rng_)), info,
                                 0, "", {.timeout = 30s});
  }

  std::mt19937_64 rng_{48};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(ErrorDetailsTest, InvalidArgumentNamesTheFieldUnaryAndStreamed) {
  Start();
  v1::GemmRequest zero_k = RandomRequest(4, 4, 4, rng_);
  zero_k.set_k(0);
  zero_k.clear_a();
  zero_k.clear_b();
  v1::GemmRequest bad_kernel = RandomRequest(4, 4, 4, rng_);
  bad_kernel.mutable_options()->set_kernel("no_such_kernel");
  for (const auto& [status, field] :
       {std::pair{Gemm(zero_k), "k"}, std::pair{Gemm(bad_kernel), "options.kernel"},
        std::pair{StreamedGemmStatus(bad_kernel), "header.options.kernel"}}) {
    ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    const ErrorDetails d = DetailsOf(status);
    EXPECT_EQ(d.reason, "INVALID_FIELD");
    EXPECT_EQ(Fields(d), std::vector<std::string>{field}) << status.error_message();
    EXPECT_TRUE(d.quota_violations.empty());
    EXPECT_FALSE(d.retry_delay);
  }
}

TEST_F(ErrorDetailsTest, OutOfRangeNamesTheField) {
  Start();
  v1::MatrixInfo matrix;
  ASSERT_TRUE(Upload(4, 4, &matrix).ok());
  char into[32];
  const grpc::Status s =
      client_->DownloadInto(matrix.handle(), 64, 8, CBuffer{into, sizeof(into)}, nullptr);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  const ErrorDetails d = DetailsOf(s);
  EXPECT_EQ(d.reason, "OUT_OF_RANGE");
  EXPECT_EQ(Fields(d), std::vector<std::string>{"offset"});
}

TEST_F(ErrorDetailsTest, NotFoundHasItsReasonAndNoField) {
  Start();
  const grpc::Status s = client_->ReleaseMatrix(kUnknownHandle);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  const ErrorDetails d = DetailsOf(s);
  EXPECT_EQ(d.reason, "NOT_FOUND");
  EXPECT_TRUE(d.field_violations.empty());
  v1::GemmRequest by_handle = RandomRequest(4, 4, 4, rng_);
  by_handle.set_b_handle(kUnknownHandle);
  const grpc::Status streamed = StreamedGemmStatus(by_handle);
  ASSERT_EQ(streamed.error_code(), grpc::StatusCode::NOT_FOUND) << streamed.error_message();
  EXPECT_EQ(DetailsOf(streamed).reason, "NOT_FOUND");
}

TEST_F(ErrorDetailsTest, ResourceExhaustedNamesTheLimit) {
  ServerOptions options;
  options.service.resident.quota_bytes_per_client = 1024;
  options.service.scheduler.max_queued_bytes = 4096;
  options.service.rules.max_elements_per_matrix = 2048;
  Start(options);
  v1::MatrixInfo matrix;
  const grpc::Status quota = Upload(32, 32, &matrix);                      // 2048 bytes
  const grpc::Status queue_bytes = Gemm(RandomRequest(32, 32, 32, rng_));  // 6144 bytes
  const grpc::Status elements = Gemm(RandomRequest(64, 64, 8, rng_));      // C: 4096 elements
  for (const auto& [status, limit] :
       {std::pair{quota, "resident_quota_bytes"}, std::pair{queue_bytes, "max_queued_bytes"},
        std::pair{elements, "max_elements_per_matrix"}}) {
    ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    const ErrorDetails d = DetailsOf(status);
    EXPECT_EQ(d.reason, "OVER_LIMIT");
    EXPECT_EQ(Subjects(d), std::vector<std::string>{limit}) << status.error_message();
    EXPECT_EQ(d.quota_violations.at(0).description, status.error_message());
    EXPECT_FALSE(d.retry_delay) << "retrying will not help";
  }
}

TEST_F(ErrorDetailsTest, QueueFullSaysWhenToRetryUnaryAndStreamed) {
  ServerOptions options;
  options.service.scheduler.max_queued_requests = 0;  // every GEMM finds the queue full
  Start(options);
  const v1::GemmRequest request = RandomRequest(4, 4, 4, rng_);
  for (const grpc::Status& s : {Gemm(request), StreamedGemmStatus(request)}) {
    ASSERT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    const ErrorDetails d = DetailsOf(s);
    EXPECT_EQ(d.reason, "QUEUE_FULL");
    ASSERT_TRUE(d.retry_delay);
    EXPECT_EQ(*d.retry_delay, status::kQueueFullRetryDelay);
  }
}

TEST_F(ErrorDetailsTest, SharedMemoryRefusalsHaveTheirReasons) {
  Start();  // shared memory off
  v1::RegionInfo region;
  const grpc::Status off = client_->RegisterRegion("/proc/1/fd/0", 4096, "", &region);
  ASSERT_EQ(off.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << off.error_message();
  EXPECT_EQ(DetailsOf(off).reason, "FAILED_PRECONDITION");
  ServerOptions options;
  options.service.regions.allow_shared_memory = true;  // but this is TCP
  Start(options);
  const grpc::Status tcp = client_->RegisterRegion("/proc/1/fd/0", 4096, "", &region);
  ASSERT_EQ(tcp.error_code(), grpc::StatusCode::PERMISSION_DENIED) << tcp.error_message();
  EXPECT_EQ(DetailsOf(tcp).reason, "PERMISSION_DENIED");
}

TEST_F(ErrorDetailsTest, UnauthenticatedWithATokenFile) {
  const std::string tokens = std::string(std::getenv("TEST_TMPDIR")) + "/error_details_tokens";
  testing::ReplaceFile(tokens, testing::TokenLine("alice", "alice-token"));
  ServerOptions options;
  options.auth.tokens_file = tokens;
  Start(options);
  for (const std::string& token : {std::string(), std::string("not-a-token")}) {
    const GemmClient client(Connect(Target(), {.token = token}));
    v1::ServerInfo info;
    const grpc::Status s = client.GetServerInfo(&info, {.timeout = 30s});
    ASSERT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_EQ(DetailsOf(s).reason, "UNAUTHENTICATED");
  }
  const GemmClient alice(Connect(Target(), {.token = "alice-token"}));
  v1::ServerInfo info;
  ASSERT_TRUE(alice.GetServerInfo(&info, {.timeout = 30s}).ok());
  EXPECT_TRUE(info.features().authentication());
}

TEST_F(ErrorDetailsTest, BackendFailureIsInternalAndAFailedDeviceUnavailable) {
  const v1::GemmRequest request = RandomRequest(4, 4, 4, rng_);
  Start({}, std::make_unique<FailingBackend>(status::BackendFailure("injected copy failure")));
  const grpc::Status internal = Gemm(request);
  ASSERT_EQ(internal.error_code(), grpc::StatusCode::INTERNAL) << internal.error_message();
  EXPECT_EQ(DetailsOf(internal).reason, "BACKEND_FAILURE");
  Start({}, std::make_unique<FailingBackend>(status::DeviceFailed("device 0 has failed")));
  for (const grpc::Status& s : {Gemm(request), StreamedGemmStatus(request)}) {
    ASSERT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    const ErrorDetails d = DetailsOf(s);
    EXPECT_EQ(d.reason, "DEVICE_FAILED");
    EXPECT_FALSE(d.retry_delay) << "it may have run: not retried as a full queue is";
  }
}

// A streamed GEMM whose chunks stop coming: its GemmDone, read off the wire, says
// DEADLINE_EXCEEDED in status_code and in its google.rpc.Status.
TEST_F(ErrorDetailsTest, StreamedGemmWhoseChunksStopIsIdleInItsGemmDone) {
  ServerOptions options;
  options.service.idle_timeout = 1s;
  Start(options);
  auto stub = v1::GemmService::NewStub(Connect(Target()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 30s);
  auto stream = stub->GemmStream(&context);
  v1::GemmStreamRequest header;
  header.mutable_header()->set_gemm_id(7);
  header.mutable_header()->set_m(4);
  header.mutable_header()->set_n(4);
  header.mutable_header()->set_k(4);
  ASSERT_TRUE(stream->Write(header));  // and no chunk of A or B
  v1::GemmStreamResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  ASSERT_TRUE(answer.has_done());
  const v1::GemmDone& done = answer.done();
  EXPECT_EQ(answer.gemm_id(), 7u);
  ASSERT_EQ(done.status_code(), int(grpc::StatusCode::DEADLINE_EXCEEDED)) << done.status_message();
  ASSERT_TRUE(done.has_status());
  EXPECT_EQ(done.status().code(), done.status_code());
  EXPECT_EQ(done.status().message(), done.status_message());
  EXPECT_EQ(DetailsOf(StatusOf(done)).reason, "IDLE");
  context.TryCancel();
}

TEST_F(ErrorDetailsTest, ServerInfoListsTheFeatures) {
  Start();
  v1::ServerInfo info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  ASSERT_TRUE(info.has_features());
  EXPECT_TRUE(info.features().error_details());
  EXPECT_TRUE(info.features().parallel_parts());
  EXPECT_TRUE(info.features().verification());
  EXPECT_FALSE(info.features().verify_all());
  EXPECT_FALSE(info.features().shared_memory());
  EXPECT_FALSE(info.features().unix_socket());
  EXPECT_FALSE(info.features().tls());
  EXPECT_FALSE(info.features().authentication());
  EXPECT_FALSE(info.features().cuda_ipc()) << "the CPU backend has none";
  ServerOptions options;
  options.service.regions.allow_shared_memory = true;
  options.service.scheduler.verify_all = true;
  Start(options);
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_TRUE(info.features().shared_memory());
  EXPECT_TRUE(info.features().submission_ring());
  EXPECT_TRUE(info.features().verify_all());
}

}  // namespace
}  // namespace hgemm
