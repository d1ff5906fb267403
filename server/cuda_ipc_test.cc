// CUDA IPC regions end to end: this process is the client holding device memory
// (cudaMalloc, cudaIpcGetMemHandle) and hgemm_server --backend=cuda runs as a child process (a
// handle cannot be opened by the process that made it), reached over its Unix socket. GEMMs read
// A, B and C_in from the client's device memory and write C into it in place; bad handles,
// devices that are not the server's and sizes past the allocation get clear statuses and the
// server keeps serving. Skips when no usable GPU is present.
// HGEMM_SERVER_BINARY names the server binary outside Bazel (tools/gpu_e2e.sh).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"
#include "server/testing/child_process.h"
#include "server/testing/region_test.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string Uuid(int ordinal) {
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, ordinal) != cudaSuccess) return "";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(props.uuid.bytes[i]));
    out += hex;
  }
  return out;
}

class CudaIpcTest : public RegionTest {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "no GPU";
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    MakeSocketDir();
    server_ = std::make_unique<subprocess::ServerProcess>(std::vector<std::string>{
        "--backend=cuda", "--streams_per_device=2", "--allow_shared_memory", "--allow_cuda_ipc",
        "--listen=" + socket_address()});
    auto channel = Connect(socket_address());
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(60))) {
      GTEST_SKIP() << "hgemm_server --backend=cuda did not start (no usable GPU?): "
                   << server_->process().Output();
    }
    stub_ = v1::GemmService::NewStub(channel);
  }
  void TearDown() override {
    stub_.reset();
    server_.reset();
    RegionTest::TearDown();
  }

  // Device memory of `bytes` on device 0 and its IPC handle.
  struct SharedMemory {
    void* data = nullptr;
    std::string handle;
    ~SharedMemory() {
      if (data != nullptr) cudaFree(data);
    }
  };
  static void Share(int64_t bytes, SharedMemory* memory) {
    ASSERT_EQ(cudaMalloc(&memory->data, size_t(bytes)), cudaSuccess);
    cudaIpcMemHandle_t handle;
    ASSERT_EQ(cudaIpcGetMemHandle(&handle, memory->data), cudaSuccess);
    memory->handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }
  static void ToDevice(void* device, int64_t offset, const std::string& bytes) {
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(device) + offset, bytes.data(), bytes.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  static std::string FromDevice(const void* device, int64_t offset, int64_t bytes) {
    std::string out(bytes, '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), static_cast<const char*>(device) + offset, bytes,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

  // `r` with A, B and C_in in the client's device memory (registered by `device_name`) and C
  // written over C_in in place; returns C as the device memory holds it afterwards.
  std::string GemmInPlace(const v1::GemmRequest& r, const std::string& device_name) {
    const int64_t c_bytes = int64_t(r.m()) * r.n() * 2;
    const int64_t b_offset = Pad(r.a().size());
    const int64_t c_offset = b_offset + Pad(r.b().size());
    const int64_t bytes = c_offset + c_bytes;
    SharedMemory memory;
    Share(bytes, &memory);
    ToDevice(memory.data, 0, r.a());
    ToDevice(memory.data, b_offset, r.b());
    if (r.beta() != 0) {
      ToDevice(memory.data, c_offset, r.c_in());
    } else {
      EXPECT_EQ(cudaMemset(static_cast<char*>(memory.data) + c_offset, 0xFF, c_bytes), cudaSuccess);
    }
    v1::RegionInfo info;
    grpc::Status s = RegisterIpc(memory.handle, device_name, bytes, &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return "";
    EXPECT_TRUE(info.cuda_ipc());
    v1::GemmRequest ipc = r;
    SetRegion(ipc.mutable_a_region(), info.region(), 0);
    SetRegion(ipc.mutable_b_region(), info.region(), b_offset);
    if (r.beta() != 0) SetRegion(ipc.mutable_c_in_region(), info.region(), c_offset);
    SetRegion(ipc.mutable_c_region(), info.region(), c_offset);
    v1::GemmResponse response;
    s = Gemm(ipc, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(response.c().empty());
    EXPECT_TRUE(Unregister(info.region()).ok());
    return FromDevice(memory.data, c_offset, c_bytes);
  }

  std::mt19937_64 rng_{20261205};
  std::unique_ptr<subprocess::ServerProcess> server_;
};

TEST_F(CudaIpcTest, GemmInPlaceOnTheClientsDeviceMemory) {
  char bus_id[32] = {};
  ASSERT_EQ(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), 0), cudaSuccess);
  v1::GemmRequest scaled = RandomRequest(257, 129, 95, rng_);
  scaled.set_alpha(0.75f);
  scaled.set_beta(-1.5f);
  SetRandomCIn(&scaled, rng_);
  EXPECT_LT(RelativeErrorOfC(scaled, GemmInPlace(scaled, bus_id)), kServiceTolerance.fp32_acc);
  const v1::GemmRequest plain = RandomRequest(512, 384, 640, rng_);
  EXPECT_LT(RelativeErrorOfC(plain, GemmInPlace(plain, Uuid(0))), kServiceTolerance.fp32_acc);
}

TEST_F(CudaIpcTest, BadHandlesDevicesAndSizesAreRefusedAndTheServerKeepsServing) {
  SharedMemory memory;
  Share(1 << 20, &memory);
  v1::RegionInfo info;
  grpc::Status s =
      RegisterIpc(memory.handle, "GPU-00000000-0000-0000-0000-000000000000", 1 << 20, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("GPU-00000000"), std::string::npos) << s.error_message();
  s = RegisterIpc(std::string(64, '\x5a'), Uuid(0), 1 << 20, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("cuda_ipc.handle"), std::string::npos) << s.error_message();
  s = RegisterIpc(memory.handle.substr(0, 10), Uuid(0), 1 << 20, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = RegisterIpc(memory.handle, Uuid(0), (1 << 20) + (64 << 20), &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("byte_size"), std::string::npos) << s.error_message();

  const v1::GemmRequest r = RandomRequest(64, 48, 80, rng_);
  v1::GemmResponse response;
  ASSERT_TRUE(Gemm(r, &response).ok());
  EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc);
}

// Every operand off the 16-byte alignment, for fp16 and fp32 C with a scaling epilogue: each
// refused INVALID_ARGUMENT before any kernel sees it (an fp32 C at 2 mod 4 with alpha != 1 used
// to make the epilogue fault: a sticky error that takes the GPU from everyone). Afterwards the
// device is healthy and an aligned GEMM in the same memory is right.
TEST_F(CudaIpcTest, MisalignedOffsetsNeverReachTheDevice) {
  const uint32_t m = 96, n = 64, k = 80;
  SharedMemory memory;
  constexpr int64_t kBytes = 1 << 20;
  Share(kBytes, &memory);
  v1::RegionInfo info;
  ASSERT_TRUE(RegisterIpc(memory.handle, Uuid(0), kBytes, &info).ok());
  for (v1::DataType c_dtype : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_FP32}) {
    v1::GemmRequest r = RandomRequest(m, n, k, rng_);
    r.set_c_dtype(c_dtype);
    r.set_alpha(0.5f);
    r.set_beta(1.0f);
    const int64_t c_bytes = int64_t(m) * n * (c_dtype == v1::DATA_TYPE_FP32 ? 4 : 2);
    const int64_t b_at = Pad(r.a().size()), c_at = b_at + Pad(r.b().size());
    ToDevice(memory.data, 0, r.a());
    ToDevice(memory.data, b_at, r.b());
    std::vector<float> c_in_fp32(size_t(m) * n, 0.25f);
    const std::string c_in =
        c_dtype == v1::DATA_TYPE_FP32
            ? std::string(reinterpret_cast<const char*>(c_in_fp32.data()), c_bytes)
            : HalfBytes(RandomHalfMatrix(int64_t(m) * n, rng_));
    ToDevice(memory.data, c_at, c_in);
    v1::GemmRequest ipc = r;
    ipc.clear_a();
    ipc.clear_b();
    auto place = [&](uint64_t a, uint64_t b, uint64_t c) {
      SetRegion(ipc.mutable_a_region(), info.region(), a);
      SetRegion(ipc.mutable_b_region(), info.region(), b);
      SetRegion(ipc.mutable_c_in_region(), info.region(), c);
      SetRegion(ipc.mutable_c_region(), info.region(), c);
    };
    for (uint64_t skew : {2, 4, 8}) {
      for (int operand = 0; operand < 3; ++operand) {
        SCOPED_TRACE("operand " + std::to_string(operand) + " skew " + std::to_string(skew));
        place(operand == 0 ? 64 + skew : 0, operand == 1 ? b_at + skew : b_at,
              operand == 2 ? c_at + skew : c_at);
        v1::GemmResponse response;
        grpc::Status s = Gemm(ipc, &response);
        EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
        EXPECT_NE(s.error_message().find(".offset"), std::string::npos) << s.error_message();
      }
    }
    place(0, b_at, c_at);
    v1::GemmResponse response;
    grpc::Status s = Gemm(ipc, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const std::string c = FromDevice(memory.data, c_at, c_bytes);
    std::vector<float> reference =
        ReferenceGemm(reinterpret_cast<const uint16_t*>(r.a().data()),
                      reinterpret_cast<const uint16_t*>(r.b().data()), m, n, k);
    for (size_t i = 0; i < reference.size(); ++i) {
      const float in = c_dtype == v1::DATA_TYPE_FP32
                           ? c_in_fp32[i]
                           : HalfToFloat(reinterpret_cast<const uint16_t*>(c_in.data())[i]);
      reference[i] = 0.5f * reference[i] + in;
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < reference.size(); ++i) {
      const float got = c_dtype == v1::DATA_TYPE_FP32
                            ? reinterpret_cast<const float*>(c.data())[i]
                            : HalfToFloat(reinterpret_cast<const uint16_t*>(c.data())[i]);
      diff += (double(got) - reference[i]) * (double(got) - reference[i]);
      norm += double(reference[i]) * reference[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), kServiceTolerance.fp32_acc);
  }
  EXPECT_TRUE(Unregister(info.region()).ok());
  grpc::ClientContext context;
  v1::ServerInfo server;
  ASSERT_TRUE(stub_->GetServerInfo(&context, {}, &server).ok());
  const v1::GemmRequest plain = RandomRequest(64, 48, 80, rng_);
  v1::GemmResponse response;
  ASSERT_TRUE(Gemm(plain, &response).ok());  // the device still serves
  EXPECT_LT(RelativeErrorOfC(plain, response.c()), kServiceTolerance.fp32_acc);
}

}  // namespace
}  // namespace hgemm
