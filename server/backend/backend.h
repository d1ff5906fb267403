// Backend: where GEMMs run (the CPU through OpenBLAS, or CUDA devices).
//
// A backend exposes a fixed set of execution slots (a CUDA stream with its buffers, or a CPU
// worker). The scheduler runs one thread per slot and never calls Run for one slot from two
// threads at once; different slots run concurrently. All other methods are thread-safe.
#ifndef HGEMM_SERVER_BACKEND_BACKEND_H_
#define HGEMM_SERVER_BACKEND_BACKEND_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <absl/status/status.h>

#include "server/core/job.h"

namespace hgemm {

struct DeviceDescription {
  int id = -1;
  std::string name;
  uint64_t memory_bytes = 0;
  int slots = 0;
  std::string compute_capability;
};

struct KernelDescription {
  std::string name;
  std::string description;
  bool fp16_accumulation = false;
  bool fp32_accumulation = false;
  unsigned layouts = kLayoutNNBit;  // LayoutBit()s it takes (server/core/shape.h)
  unsigned types = kTypesFp16Bit;   // TypesBit()s it takes
  unsigned scaled_types = 0;        // the TypesBit()s for which it takes alpha and beta
  bool grouped = false;             // it takes grouped GEMMs (GemmShape::group)
  bool fused_scale = false;         // applies alpha/beta itself (no second pass over an fp32 T)
};

// The one GEMM that runs `members` (a scheduler's batch, Backend::RunBatch) along M: the first
// member's form, B, kernel, scales, check and device, with m the members' m summed; a, c_in
// and c unset (the caller points them at the stacked rows), no resident A or C_in, C neither
// kept nor on a device. REQUIRES: !members.empty().
GemmJob StackedJob(const std::vector<const GemmJob*>& members);

class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string Name() const = 0;  // "cpu" or "cuda"
  virtual std::vector<DeviceDescription> Devices() const = 0;
  virtual std::vector<KernelDescription> Kernels() const = 0;

  // Execution slots; slot s belongs to device SlotDevice(s) (an index into Devices()).
  virtual int NumSlots() const = 0;
  virtual int SlotDevice(int slot) const = 0;

  // Largest GEMM (operand + result bytes) one slot can take; larger → RESOURCE_EXHAUSTED.
  virtual int64_t MaxJobBytes() const = 0;

  // Runs `job` to completion on `slot`: job.c holds C when it returns OK (or, with job.keep_c,
  // report->c_resident does). `job.kernel` is a name from Kernels() or "auto" (validated
  // before). Fills everything in `report` but queue_wait_ms, server_total_ms and
  // suspect_device_id. With job.verify_repetitions > 0 it also checks C by Freivalds' method
  // (server/verify/freivalds.h) before returning, and says how in report's verify fields: a
  // C that fails its check still returns OK (with report->verify_failure set); the caller
  // decides what to do with it.
  // Resident operands on another device than SlotDevice(slot) are copied over for this run.
  // REQUIRES: one caller per slot at a time.
  virtual absl::Status Run(int slot, const GemmJob& job, GemmReport* report) = 0;

  // Runs `members` on `slot` as one GEMM along M: their op(A) rows stacked in order, times
  // their shared B, with C split back into each member's own sink (c, c_device, or a kept C in
  // its report's c_resident). The members are the scheduler's batch
  // (server/scheduler/scheduler.h): one problem each (batch 1, no group), the same B (one
  // b_resident) and the same n, k, types, c_input, transposes, kernel, accumulation, alpha,
  // beta and verify_repetitions; their m, A, C_in and C sinks are their own.
  // Returns one status per member and fills (*reports)[i], members[i]'s, with the launch's
  // times, kernel and check (one check of the stacked C), and batch_size and batch_rows. A
  // status that is not OK says the member's C is not in its sink: the launch's failure for
  // every member, or that member's own (its kept C could not be allocated, say). A check
  // that fails leaves every sink unwritten and every status OK, with each report's
  // verify_failure set: the caller reruns the members alone. Never looks at is_cancelled,
  // deadline or c_progress: the caller drops cancelled and expired members first.
  // This default gathers A and C_in into host memory, runs the stacked GEMM through Run and
  // copies C out, through this backend's own resident-memory calls; a backend that can gather
  // on its device overrides it.
  // REQUIRES: !members.empty(); reports->size() == members.size(); one caller per slot at a
  // time (as Run).
  virtual std::vector<absl::Status> RunBatch(int slot, const std::vector<const GemmJob*>& members,
                                             std::vector<GemmReport>* reports);

  // A buffer of `bytes` on device `device_index` (Devices() index) for a resident matrix.
  // RESOURCE_EXHAUSTED when the device's memory budget (shared with the slots' buffers) would
  // be passed. Thread-safe.
  virtual absl::Status AllocateResident(int device_index, int64_t bytes,
                                        std::shared_ptr<ResidentBuffer>* buffer) = 0;
  // Copies `bytes` host bytes to `offset` in a resident buffer; blocks until done. Calls for
  // disjoint ranges may run concurrently (streamed operands are written chunk by chunk).
  // REQUIRES: offset + bytes <= buffer.bytes.
  virtual absl::Status WriteResident(ResidentBuffer& buffer, int64_t offset, const void* host,
                                     int64_t bytes) = 0;
  // Copies `pieces`, one after the other, to `offset` in a resident buffer (a chunk as it
  // arrived: gRPC's receive slices); blocks until done. This default writes piece by piece
  // (WriteResident's rules); a backend whose copies cost a call each gathers them first.
  // REQUIRES: offset + the pieces' bytes <= buffer.bytes.
  virtual absl::Status WriteResidentPieces(ResidentBuffer& buffer, int64_t offset,
                                           const std::vector<std::string_view>& pieces) {
    for (std::string_view piece : pieces) {
      absl::Status s = WriteResident(buffer, offset, piece.data(), int64_t(piece.size()));
      if (!s.ok()) return s;
      offset += int64_t(piece.size());
    }
    return absl::OkStatus();
  }
  // Copies the whole buffer to `host` (buffer.bytes bytes); blocks until done. Thread-safe.
  virtual absl::Status ReadResident(const ResidentBuffer& buffer, void* host) = 0;
  // Copies bytes [offset, offset + bytes) of the buffer to `host`; blocks until done.
  // Thread-safe. This default reads the whole buffer into a temporary first: backends
  // override it to copy the range alone. REQUIRES: offset + bytes <= buffer.bytes.
  virtual absl::Status ReadResidentRange(const ResidentBuffer& buffer, int64_t offset,
                                         int64_t bytes, void* host) {
    std::vector<char> whole(buffer.bytes);
    if (absl::Status s = ReadResident(buffer, whole.data()); !s.ok()) return s;
    std::memcpy(host, whole.data() + offset, bytes);
    return absl::OkStatus();
  }

  // Page-locks the host memory [data, data + bytes) for direct DMA (CUDA: cudaHostRegister),
  // so that Run copies the operands and C of a job whose GemmJob::pinned says so straight
  // between that memory and the device, without staging. On OK, *unpin is what undoes it: to
  // be called once, after the last Run using the memory has returned and before the memory is
  // unmapped. UNIMPLEMENTED when the backend has nothing to gain (the CPU: its "device" is host
  // memory); another error when it could not (e.g. RLIMIT_MEMLOCK): the memory then serves as
  // any host memory (staged copies). Thread-safe.
  virtual absl::Status PinHostMemory(void* data, int64_t bytes, std::function<void()>* unpin) {
    return absl::UnimplementedError(Name() + " backend: host memory needs no pinning");
  }

  // Opens device memory another process shares by CUDA IPC: `ipc_handle` (the 64 bytes of a
  // cudaIpcMemHandle_t) on the device named `device` (its UUID "GPU-..." or PCI bus id), as a
  // buffer of its first `bytes` bytes on that device, which closes the mapping when its last
  // reference goes. FAILED_PRECONDITION: a backend without CUDA, a device that is not one of
  // this backend's (the message names it), or memory on another device than the one named;
  // INVALID_ARGUMENT naming "cuda_ipc.handle" (does not open) or "byte_size" (past the end of
  // the shared allocation). Thread-safe.
  virtual absl::Status OpenIpcMemory(const std::string& ipc_handle, const std::string& device,
                                     int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer) {
    return absl::FailedPreconditionError("CUDA IPC needs the CUDA backend (this server runs the " +
                                         Name() + " backend)");
  }

  // False once device `device_index` (a Devices() index) has failed for good (a sticky CUDA
  // error: the context is unusable). Its GEMMs and resident operations are refused with
  // UNAVAILABLE from then on (status::DeviceFailed); the scheduler sends it no more work.
  // Never turns true again. Thread-safe.
  virtual bool DeviceHealthy(int device_index) const { return true; }

  // Takes device `device_index` out of service for good, as a sticky error does: DeviceHealthy
  // turns false and `why` is logged. The scheduler's answer to a device whose results keep
  // failing their checks. A backend whose devices never fail (a test's fake) ignores it.
  // Thread-safe.
  virtual void TakeOutOfService(int device_index, const std::string& why) {}

  // False once no device is usable: every device has failed (health turns NOT_SERVING and the
  // server drains and exits non-zero). Thread-safe.
  bool Healthy() const {
    for (int d = 0; d < int(Devices().size()); ++d) {
      if (DeviceHealthy(d)) return true;
    }
    return false;
  }
  // How many devices have failed (0 while all are healthy). Thread-safe.
  int FailedDevices() const {
    int failed = 0;
    for (int d = 0; d < int(Devices().size()); ++d) failed += DeviceHealthy(d) ? 0 : 1;
    return failed;
  }

 protected:
  Backend() = default;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_BACKEND_H_
