// A GEMM as the scheduler and the backends see it: no protobuf, no gRPC transport.
#ifndef HGEMM_SERVER_SCHEDULER_JOB_H_
#define HGEMM_SERVER_SCHEDULER_JOB_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/support/status.h>

namespace hgemm {

using Clock = std::chrono::steady_clock;

enum class Accumulation { kFp16, kFp32 };

// The one place for the arithmetic of matrix sizes. Dimensions are uint32 on the wire, so a
// product of two is exact in uint64; capping every matrix at kMaxElementsPerMatrix (whatever the
// flags say) keeps every size derived from them, 2·m·n·k included (m·n·k ≤ 2^60 since
// (m·k)(k·n)(m·n) = (m·n·k)²), inside int64.
inline constexpr int64_t kMaxElementsPerMatrix = int64_t{1} << 40;

// Elements of a rows×cols matrix: exact for any uint32 dimensions.
constexpr uint64_t MatrixElements(uint32_t rows, uint32_t cols) { return uint64_t{rows} * cols; }

// fp16 bytes of a rows×cols matrix. REQUIRES: MatrixElements(rows, cols) ≤ kMaxElementsPerMatrix.
constexpr int64_t MatrixBytes(uint32_t rows, uint32_t cols) {
  return 2 * int64_t(MatrixElements(rows, cols));
}

// A GEMM's m, n, k. Made by ValidateShape (server/validation.h), which guarantees each is in
// [1, 2^32) and each of A, B, C has at most kMaxElementsPerMatrix elements; the sizes below
// REQUIRE that.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;

  int64_t Flops() const { return 2 * m * n * k; }
  // fp16 bytes of A, B and C, and of all three.
  int64_t ABytes() const { return MatrixBytes(m, k); }
  int64_t BBytes() const { return MatrixBytes(k, n); }
  int64_t CBytes() const { return MatrixBytes(m, n); }
  int64_t Bytes() const { return ABytes() + BBytes() + CBytes(); }
};

// A matrix a backend keeps between calls (device memory on CUDA, host memory on the CPU).
// Freed when the last reference goes: a GEMM holding one keeps it alive past its release.
struct ResidentBuffer {
  ResidentBuffer(int device_index, int64_t bytes, void* data, std::function<void(void*)> free)
      : device_index(device_index), bytes(bytes), data(data), free_(std::move(free)) {}
  ~ResidentBuffer() { free_(data); }
  ResidentBuffer(const ResidentBuffer&) = delete;
  ResidentBuffer& operator=(const ResidentBuffer&) = delete;

  const int device_index;  // index into Backend::Devices()
  const int64_t bytes;
  void* const data;

 private:
  std::function<void(void*)> free_;
};

// Where the time of one GEMM went (milliseconds) and what ran it.
struct GemmReport {
  double queue_wait_ms = 0;
  double host_to_device_ms = 0;
  double kernel_ms = 0;
  double device_to_host_ms = 0;
  double server_total_ms = 0;
  std::string kernel;
  Accumulation accumulation = Accumulation::kFp32;
  int device_id = -1;
  std::string device_name;
  int stream_id = 0;
  std::shared_ptr<ResidentBuffer> c_resident;  // C, when the job asked to keep it

  double Tflops(const GemmShape& shape) const {
    return kernel_ms > 0 ? shape.Flops() / (kernel_ms * 1e9) : 0;
  }
};

// One GEMM to run. The buffers belong to the transport, which keeps them alive until the
// job's completion callback has run.
struct GemmJob {
  GemmShape shape;
  std::string kernel = "auto";  // a backend variant name, or "auto"
  Accumulation accumulation = Accumulation::kFp32;
  std::string request_id;
  // The call's W3C traceparent, already checked (server/logging.h), for the log; "" if none.
  std::string traceparent;
  const uint16_t* a = nullptr;  // m×k fp16, row-major (unused when a_resident is set)
  const uint16_t* b = nullptr;  // k×n fp16, row-major (unused when b_resident is set)
  uint16_t* c = nullptr;        // m×n fp16, row-major; written by the backend unless keep_c
  std::shared_ptr<ResidentBuffer> a_resident;
  std::shared_ptr<ResidentBuffer> b_resident;
  // Leave C on the backend: Run allocates it and returns it in GemmReport::c_resident.
  bool keep_c = false;
  // The device holding the job's resident operands, where it runs (unless the scheduler moves
  // it to an idle device: SchedulerOptions::copy_resident_to_idle_device); -1: any.
  int device_index = -1;
  Clock::time_point deadline = Clock::time_point::max();
  // Called by the backend as C reaches `c`, from the thread running the job: bytes [0, ready)
  // are final. Lets the transport send C while the rest is still being copied. May be empty.
  std::function<void(int64_t ready)> c_progress;
  // True once the client has gone away; checked before the job runs. May be empty.
  std::function<bool()> is_cancelled;
};

// Called exactly once per admitted job, on a scheduler worker thread.
using GemmDone = std::function<void(const grpc::Status&, const GemmReport&)>;

}  // namespace hgemm

#endif  // HGEMM_SERVER_SCHEDULER_JOB_H_
