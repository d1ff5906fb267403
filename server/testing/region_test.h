// A GoogleTest fixture base for the same-host tests (shared-memory and CUDA IPC regions): a
// temporary directory for the server's Unix socket, a stub over that socket, and the region
// calls as a client names itself (x-client-id metadata). Test-only; used from the test's thread.
#ifndef HGEMM_SERVER_TESTING_REGION_TEST_H_
#define HGEMM_SERVER_TESTING_REGION_TEST_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "proto/hgemm.grpc.pb.h"
#include "server/testing/memfd.h"

namespace hgemm {

class RegionTest : public ::testing::Test {
 protected:
  // Makes the socket's directory (/tmp/hgemm_region_test_XXXXXX). A subclass that skips before
  // calling it leaves dir_ empty.
  void MakeSocketDir() {
    char dir[] = "/tmp/hgemm_region_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  // Drops the stub and removes the directory. REQUIRES: the server has stopped (a subclass's
  // TearDown stops it first).
  void TearDown() override {
    stub_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // <dir>/hgemm.sock, and as an address ("unix:" + it): where the server listens and stub_
  // connects.
  std::string socket_path() const { return dir_ + "/hgemm.sock"; }
  std::string socket_address() const { return "unix:" + socket_path(); }

  // Registers `bytes` of the memfd `file` as client `client_id` (over `stub`, else stub_).
  grpc::Status Register(const TestMemfd& file, int64_t bytes, v1::RegionInfo* info,
                        const std::string& client_id = kClient,
                        v1::GemmService::Stub* stub = nullptr) {
    v1::RegisterRegionRequest request;
    request.set_path(file.path());
    request.set_byte_size(bytes);
    return RegisterRegion(request, info, client_id, stub);
  }
  // Registers `bytes` of device memory by its CUDA IPC handle and device UUID.
  grpc::Status RegisterIpc(const std::string& handle, const std::string& device, int64_t bytes,
                           v1::RegionInfo* info) {
    v1::RegisterRegionRequest request;
    request.set_byte_size(bytes);
    request.mutable_cuda_ipc()->set_handle(handle);
    request.mutable_cuda_ipc()->set_device(device);
    return RegisterRegion(request, info, kClient, nullptr);
  }
  grpc::Status Unregister(const std::string& region, const std::string& client_id = kClient) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", client_id);
    v1::UnregisterRegionRequest request;
    request.set_region(region);
    v1::UnregisterRegionResponse response;
    return stub_->UnregisterRegion(&context, request, &response);
  }
  grpc::Status Gemm(const v1::GemmRequest& request, v1::GemmResponse* response,
                    const std::string& client_id = kClient, v1::GemmService::Stub* stub = nullptr) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", client_id);
    return (stub ? stub : stub_.get())->Gemm(&context, request, response);
  }

  // `bytes` rounded up to where the next part of a region may start (the server takes offsets
  // that are multiples of 16; 64 keeps parts on cache lines as clients do).
  static int64_t Pad(int64_t bytes) { return (bytes + 63) / 64 * 64; }

  // `bytes` written at `offset` of `file`, and read back.
  static void Write(const TestMemfd& file, int64_t offset, const std::string& bytes) {
    ASSERT_EQ(pwrite(file.fd(), bytes.data(), bytes.size(), offset), ssize_t(bytes.size()));
  }
  static std::string Read(const TestMemfd& file, int64_t offset, int64_t bytes) {
    std::string out(bytes, '\0');
    EXPECT_EQ(pread(file.fd(), out.data(), bytes, offset), ssize_t(bytes));
    return out;
  }
  static void SetRegion(v1::RegionRef* ref, const std::string& region, uint64_t offset) {
    ref->set_region(region);
    ref->set_offset(offset);
  }

  static constexpr char kClient[] = "alice";  // the client the calls name unless told otherwise

  std::string dir_;
  std::unique_ptr<v1::GemmService::Stub> stub_;  // over socket_address()

  // Sends `request` as client `client_id` (over `stub`, else stub_).
  grpc::Status RegisterRegion(const v1::RegisterRegionRequest& request, v1::RegionInfo* info,
                              const std::string& client_id, v1::GemmService::Stub* stub) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", client_id);
    return (stub ? stub : stub_.get())->RegisterRegion(&context, request, info);
  }
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_REGION_TEST_H_
