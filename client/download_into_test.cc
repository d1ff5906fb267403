// GemmClient::DownloadInto against a real server (CPU backend) on 127.0.0.1: a resident
// matrix's bytes, whole or a range, land in the caller's buffer as they were uploaded, over
// several chunks; a buffer too small for them is INVALID_ARGUMENT with nothing written past it.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>

#include "client/gemm_client.h"
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

}  // namespace
}  // namespace hgemm
