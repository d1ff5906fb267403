// GemmClient::DownloadInto against a real server (CPU backend) on 127.0.0.1: a resident
// matrix's bytes, whole or a range, land in the caller's buffer as they were uploaded, over
// several chunks; a buffer too small for them is INVALID_ARGUMENT with nothing written past it.
// Against a lying server on 127.0.0.1: chunks outside the range asked for are INTERNAL, and
// nothing lands outside the range's place in the buffer.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "client/gemm_client.h"
#include "proto/hgemm.grpc.pb.h"
#include "server/testing/cpu_server_test.h"

namespace hgemm {
namespace {

constexpr char kGuard = '\x5a';

class DownloadIntoTest : public CpuServerTest {
 protected:
  // A 1024×1536 fp16 matrix of random bytes (3 MiB: several chunks of a download), uploaded.
  void SetUp() override {
    CpuServerTest::SetUp();
    std::mt19937_64 rng(31);
    data_.resize(2 * 1024 * 1536);
    for (char& c : data_) c = char(rng());
    ASSERT_TRUE(client_->UploadMatrix(1024, 1536, data_, &info_).ok());
  }

  std::string data_;
  v1::MatrixInfo info_;
};

TEST_F(DownloadIntoTest, WholeAndRangedDownloadsLandInTheCallersBuffer) {
  std::string whole(data_.size() + 64, kGuard);
  uint64_t received = 0;
  ASSERT_TRUE(
      client_->DownloadInto(info_.handle(), 0, 0, {whole.data(), whole.size()}, &received).ok());
  EXPECT_EQ(received, data_.size());
  EXPECT_TRUE(whole.compare(0, data_.size(), data_) == 0);
  EXPECT_EQ(whole.substr(data_.size()), std::string(64, kGuard));

  const uint64_t offset = 1'000'001, length = 1'500'003;  // across chunk boundaries
  std::string range(length, kGuard);
  ASSERT_TRUE(
      client_->DownloadInto(info_.handle(), offset, length, {range.data(), length}, &received)
          .ok());
  EXPECT_EQ(received, length);
  EXPECT_TRUE(range == data_.substr(offset, length));
}

TEST_F(DownloadIntoTest, ABufferTooSmallIsAnErrorAndNothingIsWrittenPastIt) {
  const size_t capacity = data_.size() - 1000;
  std::string small(data_.size(), kGuard);
  uint64_t received = 0;
  const grpc::Status s =
      client_->DownloadInto(info_.handle(), 0, 0, {small.data(), capacity}, &received);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("the download buffer holds"), std::string::npos)
      << s.error_message();
  EXPECT_LE(received, capacity);
  EXPECT_EQ(small.substr(capacity), std::string(data_.size() - capacity, kGuard));
  EXPECT_TRUE(small.compare(0, received, data_, 0, received) == 0);
}

// Answers every DownloadMatrix with the chunks it was given, whatever was asked.
class LyingDownloads final : public v1::GemmService::Service {
 public:
  explicit LyingDownloads(std::vector<std::pair<uint64_t, std::string>> chunks)
      : chunks_(std::move(chunks)) {}
  grpc::Status DownloadMatrix(grpc::ServerContext*, const v1::DownloadMatrixRequest*,
                              grpc::ServerWriter<v1::ResultChunk>* writer) override {
    for (const auto& [offset, data] : chunks_) {
      v1::ResultChunk chunk;
      chunk.set_offset(offset);
      chunk.set_data(data);
      writer->Write(chunk);
    }
    return grpc::Status::OK;
  }

 private:
  const std::vector<std::pair<uint64_t, std::string>> chunks_;
};

// DownloadInto of bytes [100, 132) into a 64-byte buffer from a server that sends `chunks`:
// the call's status, with the buffer checked to hold nothing but the guard past what the
// call says it received.
grpc::Status DownloadFromLiar(std::vector<std::pair<uint64_t, std::string>> chunks,
                              std::string* buffer, uint64_t* received) {
  LyingDownloads service(std::move(chunks));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_NE(server, nullptr);
  GemmClient client("127.0.0.1:" + std::to_string(port));
  buffer->assign(64, kGuard);
  const grpc::Status s = client.DownloadInto("m", 100, 32, {buffer->data(), 64}, received);
  server->Shutdown();
  EXPECT_LE(*received, 32u);
  EXPECT_EQ(buffer->substr(*received), std::string(64 - *received, kGuard));
  return s;
}

TEST(DownloadFromALyingServer, ChunksOutsideTheRangeAskedForAreRefused) {
  const std::string x16(16, 'x');
  struct Case {
    const char* what;
    std::vector<std::pair<uint64_t, std::string>> chunks;
  };
  const std::vector<Case> cases = {
      {"before the range", {{0, x16}}},
      {"a gap", {{100, x16}, {120, x16}}},
      {"past the length", {{100, x16}, {116, x16}, {132, "y"}}},
      {"one chunk past the length", {{100, std::string(40, 'z')}}},
      {"far past the buffer", {{uint64_t{1} << 62, x16}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::string buffer;
    uint64_t received = 0;
    const grpc::Status s = DownloadFromLiar(c.chunks, &buffer, &received);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
    EXPECT_NE(s.error_message().find("outside the range asked for"), std::string::npos)
        << s.error_message();
  }
}

TEST(DownloadFromALyingServer, ARangeAnsweredShortIsAnError) {
  std::string buffer;
  uint64_t received = 0;
  const grpc::Status s = DownloadFromLiar({{100, std::string(16, 'a')}}, &buffer, &received);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
  EXPECT_NE(s.error_message().find("sent 16 of the 32 bytes asked for"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(received, 16u);
}

TEST(DownloadFromALyingServer, ChunksInTheRangeLandAtTheBuffersStart) {
  std::string buffer;
  uint64_t received = 0;
  const grpc::Status s = DownloadFromLiar(
      {{100, std::string(16, 'a')}, {116, std::string(16, 'b')}}, &buffer, &received);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(received, 32u);
  EXPECT_EQ(buffer.substr(0, 32), std::string(16, 'a') + std::string(16, 'b'));
}

}  // namespace
}  // namespace hgemm
