// EchoServer with and without --reply_delay_us: replies intact and in order, and a shutdown
// with delayed replies still pending ends every call.
#include "bench/echo_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>

#include "bench/echo.grpc.pb.h"

namespace hgemm::bench {
namespace {

std::unique_ptr<EchoServer> StartEcho(std::chrono::microseconds delay) {
  EchoServerOptions options;
  options.reply_delay = delay;
  return EchoServer::Start(options);
}

std::unique_ptr<EchoService::Stub> StubFor(const EchoServer& server) {
  return EchoService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server.port()),
                                                  grpc::InsecureChannelCredentials()));
}

class EchoDelayTest : public ::testing::TestWithParam<int> {};

TEST_P(EchoDelayTest, UnaryReplyHasTheAskedBytes) {
  std::unique_ptr<EchoServer> server = StartEcho(std::chrono::microseconds(GetParam()));
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  for (uint64_t bytes : {0, 1, 12345}) {
    EchoRequest request;
    request.set_payload(std::string(777, 'x'));
    request.set_reply_bytes(bytes);
    EchoReply reply;
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Echo(&context, request, &reply).ok());
    EXPECT_EQ(reply.payload().size(), bytes);
  }
}

TEST_P(EchoDelayTest, StreamRepliesComeInOrder) {
  std::unique_ptr<EchoServer> server = StartEcho(std::chrono::microseconds(GetParam()));
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  grpc::ClientContext context;
  auto stream = stub->EchoStream(&context);
  const uint64_t reply_bytes[] = {5000, 0, 300};
  for (uint64_t id = 0; id < 3; ++id) {  // all three sent before any reply is read
    EchoStreamRequest header;
    header.mutable_header()->set_call_id(id);
    header.mutable_header()->set_request_bytes(100);
    header.mutable_header()->set_reply_bytes(reply_bytes[id]);
    header.mutable_header()->set_reply_chunk_bytes(2048);
    ASSERT_TRUE(stream->Write(header));
    EchoStreamRequest data;
    data.set_data(std::string(100, 'd'));
    ASSERT_TRUE(stream->Write(data));
  }
  stream->WritesDone();
  EchoStreamReply reply;
  for (uint64_t id = 0; id < 3; ++id) {
    uint64_t received = 0;
    for (;;) {
      ASSERT_TRUE(stream->Read(&reply)) << "call " << id;
      ASSERT_EQ(reply.call_id(), id);
      if (reply.done()) break;
      received += reply.data().size();
    }
    EXPECT_EQ(received, reply_bytes[id]) << "call " << id;
  }
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_TRUE(stream->Finish().ok());
}

INSTANTIATE_TEST_SUITE_P(Delays, EchoDelayTest, ::testing::Values(0, 2000),
                         [](const auto& info) { return "delay_us_" + std::to_string(info.param); });

TEST(EchoDelay, ShutdownEndsCallsWhoseRepliesArePending) {
  std::unique_ptr<EchoServer> server = StartEcho(std::chrono::seconds(600));
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  grpc::ClientContext unary_context, stream_context;
  EchoRequest request;
  request.set_reply_bytes(10);
  EchoReply reply;
  std::future<grpc::Status> unary =
      std::async(std::launch::async, [&] { return stub->Echo(&unary_context, request, &reply); });
  auto stream = stub->EchoStream(&stream_context);
  EchoStreamRequest header;
  header.mutable_header()->set_call_id(1);
  ASSERT_TRUE(stream->Write(header));  // a complete call (no data): its reply is now delayed
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let both calls arrive
  server->Shutdown();  // must not wait the 10 minutes out (the test would time out): pending
                       // replies go at once
  EXPECT_TRUE(unary.get().ok());
  EchoStreamReply stream_reply;
  while (stream->Read(&stream_reply)) {
  }
  stream->Finish();
}

}  // namespace
}  // namespace hgemm::bench
