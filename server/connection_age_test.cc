// Connection age (ServerOptions::max_connection_age): a real HgemmServer on 127.0.0.1 sends a
// GOAWAY on connections older than the age, so that clients reconnect (and, through DNS, find
// replicas added since), and closes them under their open calls only after the grace, if any.
// Waits are generous; nothing asserts how soon the GOAWAY comes.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/hgemm.grpc.pb.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"

namespace hgemm {
namespace {

using std::chrono::seconds;

// Long enough for any GOAWAY of a one-second age to have come, even on a loaded machine.
constexpr seconds kGenerousWait{20};

class ConnectionAgeTest : public ::testing::Test {
 protected:
  void Start(seconds age, seconds grace) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.max_connection_age = age;
    options.max_connection_age_grace = grace;
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 1}));
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
  }

  grpc::Status CallServerInfo() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kGenerousWait);
    v1::ServerInfo info;
    return v1::GemmService::NewStub(channel_)->GetServerInfo(&context, {}, &info);
  }

  // True once the channel's connection is no longer READY (it got a GOAWAY or was closed),
  // false if it stayed READY for `wait`.
  bool ConnectionEndsWithin(seconds wait) {
    return channel_->WaitForStateChange(GRPC_CHANNEL_READY,
                                        std::chrono::system_clock::now() + wait);
  }

  std::unique_ptr<HgemmServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A health Watch: a call that stays open until its deadline unless the server ends it.
class OpenCall {
 public:
  OpenCall(const std::shared_ptr<grpc::Channel>& channel, seconds deadline)
      : stub_(grpc::health::v1::Health::NewStub(channel)) {
    context_.set_deadline(std::chrono::system_clock::now() + deadline);
    reader_ = stub_->Watch(&context_, {});
    grpc::health::v1::HealthCheckResponse first;
    opened_ = reader_->Read(&first);
  }
  bool opened() const { return opened_; }
  // Blocks until the call ends; its status.
  grpc::Status End() {
    grpc::health::v1::HealthCheckResponse response;
    while (reader_->Read(&response)) {
    }
    return reader_->Finish();
  }

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> reader_;
  bool opened_ = false;
};

TEST_F(ConnectionAgeTest, OldConnectionGetsGoawayAndTheNextCallReconnects) {
  Start(seconds(1), seconds(0));
  ASSERT_TRUE(CallServerInfo().ok());
  ASSERT_EQ(channel_->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(ConnectionEndsWithin(kGenerousWait)) << "no GOAWAY after the connection's age";
  const grpc::Status again = CallServerInfo();  // on a new connection
  EXPECT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(channel_->GetState(false), GRPC_CHANNEL_READY);
}

TEST_F(ConnectionAgeTest, ConnectionsDoNotAgeByDefault) {
  Start(seconds(0), seconds(0));
  ASSERT_TRUE(CallServerInfo().ok());
  // Three times the age the other tests set: their connections have ended by then.
  EXPECT_FALSE(ConnectionEndsWithin(seconds(3)));
  EXPECT_TRUE(CallServerInfo().ok());
}

TEST_F(ConnectionAgeTest, WithoutGraceOpenCallsOutliveTheGoaway) {
  Start(seconds(1), seconds(0));
  OpenCall watch(channel_, seconds(8));
  ASSERT_TRUE(watch.opened());
  EXPECT_TRUE(ConnectionEndsWithin(kGenerousWait));
  EXPECT_TRUE(CallServerInfo().ok());  // new calls go over a new connection meanwhile
  // Still open at its own deadline: the old connection was not closed under it.
  EXPECT_EQ(watch.End().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_F(ConnectionAgeTest, AfterTheGraceOpenCallsAreEnded) {
  Start(seconds(1), seconds(1));
  OpenCall watch(channel_, kGenerousWait);
  ASSERT_TRUE(watch.opened());
  const grpc::Status ended = watch.End();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_TRUE(CallServerInfo().ok());
}

TEST(ConnectionAge, GraceWithoutAgeIsRefused) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.max_connection_age_grace = seconds(30);
  EXPECT_EQ(HgemmServer::Start(options, MakeCpuBackend({.workers = 1})), nullptr);
}

}  // namespace
}  // namespace hgemm
