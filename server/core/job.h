// A GEMM as the scheduler, the resident store and the backends see it: one job, the buffers
// it may keep on a device, the report of where its time went and the callback that answers it.
// No protobuf, no gRPC: the transport converts at its edge.
// Thread safety: plain values; a ResidentBuffer is shared (shared_ptr) and immutable.
#ifndef HGEMM_SERVER_CORE_JOB_H_
#define HGEMM_SERVER_CORE_JOB_H_

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kernels/accumulation.h"
#include "server/core/shape.h"

namespace hgemm {

using Clock = std::chrono::steady_clock;

// Milliseconds from `start` to now, for the reports' timings.
inline double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

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
  // Freivalds' check of C (GemmJob::verify_repetitions; server/verify/freivalds.h): its time
  // (over every run of the GEMM), the repetitions C passed (0: not checked), and what failed
  // ("" when it passed or was not checked).
  double verify_ms = 0;
  int verified_repetitions = 0;
  std::string verify_failure;
  // Set when C is a rerun's, on another slot: the first run's C failed its check on the
  // device with this id (DeviceDescription::id).
  std::optional<int> suspect_device_id;
  // The launch that computed C: batch_size GEMMs sharing one resident B, their rows stacked
  // into one GEMM of batch_rows rows (Backend::RunBatch); 1 and 0 when the GEMM ran alone.
  // The times and the check above are the launch's.
  int batch_size = 1;
  int64_t batch_rows = 0;

  // The launch's rate: a batch's kernel time covers every member's rows.
  double Tflops(const GemmShape& shape) const {
    if (kernel_ms <= 0) return 0;
    const double flops = batch_size > 1
                             ? 2.0 * double(batch_rows) * double(shape.n) * double(shape.k)
                             : double(shape.Flops());
    return flops / (kernel_ms * 1e9);
  }
};

// One GEMM to run. The buffers belong to the transport, which keeps them alive until the
// job's completion callback has run.
struct GemmJob {
  GemmShape shape;
  std::string kernel = "auto";  // a backend variant name, or "auto"
  Accumulation accumulation = Accumulation::kFp32;
  std::string request_id;
  // Whose share of the scheduler's queue the GEMM counts against: its principal's account
  // (RegionStore::Account: one uid's named clients share one), so that new names escape nothing.
  std::string owner;
  // The call's W3C traceparent, already checked (server/core/logging.h), for the log; "" if none.
  std::string traceparent;
  // C = op(A)·op(B) (BLAS semantics): A is stored k×m when transpose_a, B n×k when
  // transpose_b; A and B hold shape.ab_type elements, C shape.c_type.
  bool transpose_a = false;
  bool transpose_b = false;
  const uint16_t* a = nullptr;  // A as stored, row-major (unused when a_resident is set)
  const uint16_t* b = nullptr;  // B as stored, row-major (unused when b_resident is set)
  void* c = nullptr;            // m×n, row-major; written by the backend unless keep_c
  std::shared_ptr<ResidentBuffer> a_resident;
  std::shared_ptr<ResidentBuffer> b_resident;
  // C = alpha·op(A)·op(B) + beta·C_in, in fp32, rounded once to shape.c_type. C_in is read
  // only when beta ≠ 0 (then shape.c_input is set): m×n of shape.c_type, row-major, from
  // c_in_resident when set, else from c_in. It may be the same memory as c.
  float alpha = 1;
  float beta = 0;
  const void* c_in = nullptr;
  std::shared_ptr<ResidentBuffer> c_in_resident;
  // Which of a, b, c_in and c are host memory the backend pinned (Backend::PinHostMemory: a
  // shared-memory region): it copies them by DMA straight from or to that memory, unstaged.
  struct PinnedHost {
    bool a = false, b = false, c_in = false, c = false;
  };
  PinnedHost pinned;
  // Write C straight into this device buffer (a client's CUDA IPC memory, on the device the job
  // runs on) instead of to `c`. Not with keep_c.
  std::shared_ptr<ResidentBuffer> c_device;
  // Whether C is more than op(A)·op(B): the backend must apply alpha and beta.
  bool Scaled() const { return alpha != 1 || beta != 0; }
  // Leave C on the backend: Run allocates it and returns it in GemmReport::c_resident.
  bool keep_c = false;
  // The device holding the job's resident operands, where it runs (unless the scheduler moves
  // it to an idle device: SchedulerOptions::copy_resident_to_idle_device); -1: any.
  int device_index = -1;
  // Run on device_index and nowhere else (an operand or C is a client's device memory): never
  // moved to an idle device, whose copy would be a silent cross-device copy.
  bool stay_on_device = false;
  Clock::time_point deadline = Clock::time_point::max();
  // Called by the backend as C reaches `c`, from the thread running the job: bytes [0, ready)
  // are final. Lets the transport send C while the rest is still being copied. May be empty.
  std::function<void(int64_t ready)> c_progress;
  // True once the client has gone away; checked before the job runs. May be empty.
  std::function<bool()> is_cancelled;
  // Check C by Freivalds' method before answering (server/verify/freivalds.h), with
  // verify_repetitions fresh vectors (0: SchedulerOptions::verify_repetitions). The scheduler
  // also checks jobs that don't ask when SchedulerOptions::verify_all says so, sets the count a
  // backend sees (> 0: the backend checks C in Run) and reruns a GEMM that fails.
  bool verify = false;
  int verify_repetitions = 0;
};

// Called exactly once per admitted job, on a scheduler worker thread.
using GemmDone = std::function<void(const absl::Status&, const GemmReport&)>;

}  // namespace hgemm

#endif  // HGEMM_SERVER_CORE_JOB_H_
