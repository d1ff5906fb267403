// GemmServiceImpl over a mock core (MockGemmCore) behind a real gRPC server on 127.0.0.1: what
// the transport alone makes of the core's answers, with no scheduler, store or backend.
#include "server/transport/gemm_service.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "server/core/status.h"
#include "server/testing/mock_gemm_core.h"

namespace hgemm {
namespace {

using ::testing::_;
using ::testing::DoAll;
using ::testing::Return;
using ::testing::SetArgPointee;

// The rules of a server with one kernel: fp16, NN, fp32 accumulation (what "auto" needs for a
// plain GEMM).
ServiceOptions OneKernel() {
  ServiceOptions options;
  options.rules.kernels = {{.name = "plain", .fp32_accumulation = true}};
  return options;
}

// The QuotaFailure subjects of a failed call's google.rpc.Status.
std::vector<std::string> QuotaSubjects(const grpc::Status& s) {
  google::rpc::Status rpc;
  EXPECT_TRUE(rpc.ParseFromString(s.error_details())) << s.error_message();
  std::vector<std::string> subjects;
  for (const google::protobuf::Any& detail : rpc.details()) {
    google::rpc::QuotaFailure quota;
    if (!detail.UnpackTo(&quota)) continue;
    for (const google::rpc::QuotaFailure::Violation& v : quota.violations()) {
      subjects.push_back(v.subject());
    }
  }
  return subjects;
}

class GemmServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
    stub_ = v1::GemmService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                         grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (!server_) return;
    service_.Drain();
    server_->Shutdown();
    server_->Wait();
  }

  // Every call to the core must be expected: the transport does nothing else with it.
  ::testing::StrictMock<MockGemmCore> core_;
  GemmServiceImpl service_{&core_, OneKernel()};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;  // after service_: destroyed before it
  std::unique_ptr<v1::GemmService::Stub> stub_;
};

TEST_F(GemmServiceTest, GemmAnswersWithTheCoresRefusal) {
  // The owner is the caller the transport identified (authentication off: its x-client-id).
  EXPECT_CALL(core_, Admit("id:alice", _, _))
      .WillOnce(Return(status::OverLimit("max_queued_bytes", "the queue holds too many bytes")));
  v1::GemmRequest request;
  request.set_m(2);
  request.set_n(2);
  request.set_k(2);
  request.set_a(std::string(8, '\x3c'));  // 1.0 in fp16 is 0x3c00: any bytes do here
  request.set_b(std::string(8, '\x3c'));
  grpc::ClientContext context;
  context.AddMetadata("x-client-id", "alice");
  v1::GemmResponse response;
  const grpc::Status s = stub_->Gemm(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("the queue holds too many bytes"), std::string::npos)
      << s.error_message();
  EXPECT_THAT(QuotaSubjects(s), ::testing::ElementsAre("max_queued_bytes"));
}

TEST_F(GemmServiceTest, ReleaseMatrixPassesTheCoresAnswerThrough) {
  EXPECT_CALL(core_, ReleaseMatrix("id:alice", "m-gone", /*admin=*/false, _))
      .WillOnce(Return(status::NotFound("handle: no matrix m-gone")));
  EXPECT_CALL(core_, ReleaseMatrix("id:alice", "m-kept", /*admin=*/false, _))
      .WillOnce(DoAll(SetArgPointee<3>(4096), Return(absl::OkStatus())));
  for (const std::string handle : {"m-gone", "m-kept"}) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", "alice");
    v1::ReleaseMatrixRequest request;
    request.set_handle(handle);
    v1::ReleaseMatrixResponse response;
    const grpc::Status s = stub_->ReleaseMatrix(&context, request, &response);
    if (handle == "m-gone") {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
      EXPECT_NE(s.error_message().find("no matrix m-gone"), std::string::npos);
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(response.freed_bytes(), 4096u);
    }
  }
}

}  // namespace
}  // namespace hgemm
