#include "server/backend/cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cuda.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/align.h"
#include "kernels/registry.h"
#include "kernels/scale_epilogue.h"
#include "server/backend/cuda_device.h"
#include "server/backend/cuda_errors.h"
#include "server/backend/cuda_slot.h"
#include "server/backend/cuda_verify.h"
#include "server/backend/pinned_staging_ring.h"
#include "server/core/status.h"
#include "server/verify/freivalds.h"

// Test builds (cuda_backend_fault_injection) consult the fault injector at each call site;
// release builds make the plain call.
#ifdef HGEMM_FAULT_INJECTION
#include "server/backend/fault_injector.h"
#define HGEMM_CUDA(site, expr)                                                                   \
  [&]() -> cudaError_t {                                                                         \
    if (cudaError_t injected_ = ::hgemm::FaultInjector::Global().Take(::hgemm::FaultSite::site); \
        injected_ != cudaSuccess) {                                                              \
      return injected_;                                                                          \
    }                                                                                            \
    return (expr);                                                                               \
  }()
#else
#define HGEMM_CUDA(site, expr) (expr)
#endif

namespace hgemm {
namespace {

namespace k = ::hgemm::kernels;

double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The compute capability (major*10+minor) a device needs for every variant of the registry.
int RequiredSm() {
  int sm = 0;
  for (const k::VariantInfo& v : k::Variants()) sm = std::max(sm, v.min_sm);
  return sm;
}

// The core's layout and type bits are the registry's (KernelDescription passes them through).
static_assert(k::kLayoutNN == LayoutBit(false, false) && k::kLayoutNT == LayoutBit(false, true) &&
              k::kLayoutTN == LayoutBit(true, false) && k::kLayoutTT == LayoutBit(true, true));
static_assert(k::kTypesFp16 == TypesBit(ElementType::kFp16, ElementType::kFp16) &&
              k::kTypesFp16F32 == TypesBit(ElementType::kFp16, ElementType::kFp32) &&
              k::kTypesBf16 == TypesBit(ElementType::kBf16, ElementType::kBf16) &&
              k::kTypesBf16F32 == TypesBit(ElementType::kBf16, ElementType::kFp32));

k::DataType KernelType(ElementType type) {
  switch (type) {
    case ElementType::kFp16:
      return k::DataType::kFp16;
    case ElementType::kBf16:
      return k::DataType::kBf16;
    case ElementType::kFp32:
      return k::DataType::kFp32;
  }
  return k::DataType::kFp16;
}

// alpha/beta: a variant with fused_scale applies them itself; the others run into an fp32 T and
// then the epilogue (kernels/scale_epilogue.h). Either way a variant takes them for the input
// types whose fp32 C it takes, for either C type.
unsigned ScaledTypes(const k::VariantInfo& v) {
  unsigned bits = 0;
  for (ElementType ab : {ElementType::kFp16, ElementType::kBf16}) {
    if (v.fp32_acc && (v.types & TypesBit(ab, ElementType::kFp32)) != 0) {
      bits |= TypesBit(ab, ab) | TypesBit(ab, ElementType::kFp32);
    }
  }
  return bits;
}

using Device = CudaDevice;
using Slot = CudaSlot;

// The B side of the check kept per resident B (verify::ResidentBCache): op(B)·r followed by
// the squares of op(B)'s rows (2k floats on B's device) for the vector `seed`, written once
// `ready` has completed (the stream that computed them may still be running when another
// slot finds them).
struct DeviceBSide {
  uint64_t seed = 0;
  float* x = nullptr;
  cudaEvent_t ready = nullptr;
  ~DeviceBSide() {
    if (ready != nullptr) cudaEventDestroy(ready);
    cudaFree(x);
  }
};

// One repetition of the check of one problem: its form, operands on the device, and its floats
// in the slot's verify space: r (n) | x = op(B)·r (k) | op(B)'s row squares (k) | then m each
// of op(A)·x, op(A)'s row squares, C_in·r, C_in's row squares, C·r, C's row squares.
struct CheckItem {
  verify::Form form;
  const char* a;
  const char* b;
  const char* c_in;
  const char* c;
  float* floats;
  const float* x;  // in `floats`, or the cached B side's
  int repetition;
  size_t problem;

  static size_t Floats(const ProblemDims& p) { return size_t(p.n + 2 * p.k + 6 * p.m); }
  float* r() const { return floats; }
  float* own_x() const { return floats + form.n; }
  float* b_sq() const { return floats + form.n + form.k; }
  float* row(int i) const { return floats + form.n + 2 * form.k + i * form.m; }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}

  // Sets up every device and slot; returns the first failure.
  std::string Init(const std::vector<int>& ordinals) {
    const int required_sm = RequiredSm();
    for (int ordinal : ordinals) {
      std::unique_ptr<Device> device;
      if (std::string error = Device::Open(ordinal, int(devices_.size()),
                                           options_.device_memory_fraction, required_sm, &device);
          !error.empty()) {
        return error;
      }
      // Kept before its slots are made: a slot that fails to start is torn down with the rest.
      devices_.push_back(std::move(device));
      stagers_made_.push_back(0);
      idle_stagers_.emplace_back();
      for (int s = 0; s < options_.streams_per_device; ++s) {
        auto slot = std::make_unique<Slot>(devices_.back().get(), s);
        if (std::string error = slot->Init(options_.staging_buffers, options_.staging_piece_bytes,
                                           options_.preallocate_bytes_per_stream);
            !error.empty()) {
          return error;
        }
        slot_device_index_.push_back(int(devices_.size()) - 1);
        slots_.push_back(std::move(slot));
      }
    }
    EnablePeerAccess();
    return "";
  }

  std::string Name() const override { return "cuda"; }

  std::vector<DeviceDescription> Devices() const override {
    std::vector<DeviceDescription> out;
    for (const auto& d : devices_) {
      out.push_back({.id = d->ordinal,
                     .name = d->props.name,
                     .memory_bytes = d->props.totalGlobalMem,
                     .slots = options_.streams_per_device,
                     .compute_capability = fmt::format("{}.{}", d->props.major, d->props.minor)});
    }
    return out;
  }

  std::vector<KernelDescription> Kernels() const override {
    std::vector<KernelDescription> out;
    for (const k::VariantInfo& v : k::Variants()) {
      if (v.kind == k::VariantKind::kAuto) continue;  // the service lists "auto" itself
      out.push_back({.name = v.name,
                     .description = v.description,
                     .fp16_accumulation = v.fp16_acc,
                     .fp32_accumulation = v.fp32_acc,
                     .layouts = v.layouts,  // the same bits (checked above)
                     .types = v.types,
                     .scaled_types = ScaledTypes(v),
                     // A group runs as one launch per problem (RunOnSlot).
                     .grouped = true,
                     .fused_scale = v.fused_scale && options_.fused_scale});
    }
    return out;
  }

  int NumSlots() const override { return int(slots_.size()); }
  int SlotDevice(int slot) const override { return slot_device_index_[slot]; }

  int64_t MaxJobBytes() const override {
    int64_t smallest = INT64_MAX;
    for (const auto& d : devices_) {
      // One slot may grow to the budget less what the other slots hold at least.
      smallest =
          std::min(smallest, d->memory->budget_bytes() - (options_.streams_per_device - 1) *
                                                             options_.preallocate_bytes_per_stream);
    }
    // Room for aligning B, C, T and C_in.
    return smallest - 4 * int64_t(k::kDeviceAlignment);
  }

  absl::Status AllocateResident(int device_index, int64_t bytes,
                                std::shared_ptr<ResidentBuffer>* buffer) override;
  absl::Status WriteResident(ResidentBuffer& buffer, int64_t offset, const void* host,
                             int64_t bytes) override;
  absl::Status WriteResidentPieces(ResidentBuffer& buffer, int64_t offset,
                                   const std::vector<std::string_view>& pieces) override;
  absl::Status ReadResident(const ResidentBuffer& buffer, void* host) override;
  absl::Status ReadResidentRange(const ResidentBuffer& buffer, int64_t offset, int64_t bytes,
                                 void* host) override;

  absl::Status PinHostMemory(void* data, int64_t bytes, std::function<void()>* unpin) override;
  absl::Status OpenIpcMemory(const std::string& ipc_handle, const std::string& device,
                             int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer) override;

  bool DeviceHealthy(int device_index) const override {
    return devices_[device_index]->healthy.load();
  }
  void TakeOutOfService(int device_index, const std::string& why) override {
    MarkFailed(*devices_[device_index], why);
  }

  absl::Status Run(int slot_index, const GemmJob& job, GemmReport* report) override;
  // The stacked GEMM with no gather or scatter pass through host memory: each member's rows of
  // A (and C_in) are copied straight into their rows of the slot's device buffer, and its rows
  // of C straight out to its sink (RunOnSlot with a BatchIo). A batch with a transposed A
  // resident on another device (2-D copies stay within a device) takes the default's way.
  std::vector<absl::Status> RunBatch(int slot_index, const std::vector<const GemmJob*>& members,
                                     std::vector<GemmReport>* reports) override;

 private:
  // A batch as RunOnSlot runs it (RunBatch): whose rows make up the stacked job's A and C_in,
  // and where each member's rows of C go. RunOnSlot sets a member's status when its own sink
  // fails (its kept C cannot be allocated, say) and allocates the kept Cs.
  struct BatchIo {
    const std::vector<const GemmJob*>* members;
    std::vector<absl::Status>* statuses;                   // by member; OK on entry
    std::vector<std::shared_ptr<ResidentBuffer>>* kept_c;  // by member; for keep_c members
  };
  // Host bytes that go to the device.
  struct HostSource {
    const char* host;
    size_t bytes;
  };
  // One contiguous copy from the device to host memory.
  struct HostSpan {
    char* host;
    const char* device;
    size_t bytes;
  };
  // The index of the device whose UUID ("GPU-...") or PCI bus id is `name` (any case), or -1.
  int FindDeviceByName(const std::string& name) const;
  // Direct device-to-device copies where the hardware allows them (NVLink, PCIe P2P); resident
  // operands copied to an idle device otherwise go through the host.
  void EnablePeerAccess();
  // The status of a GEMM whose CUDA call `what` returned `e`: waits for what the slot's stream
  // still has in flight (the failed GEMM's copies read its staging pieces and write its
  // buffers; the next GEMM, or the cache a kept C goes back to, must not see them), then
  // RESOURCE_EXHAUSTED (out of memory), UNAVAILABLE (a sticky error: the device is marked
  // failed, MarkFailed) or INTERNAL.
  absl::Status Fail(Slot& slot, cudaError_t e, const std::string& what);
  // Marks `device` failed for good (DeviceHealthy turns false) and logs it once.
  void MarkFailed(Device& device, const std::string& why);
  // UNAVAILABLE naming `device` (failed).
  static absl::Status Refused(const Device& device);
  absl::Status EnsureCapacity(Slot& slot, size_t bytes);
  // Run on a healthy device; with `batch`, the stacked GEMM of its members (RunBatch), whose
  // rows of A, C_in and C are copied from and to the members' own memory instead of job.a,
  // job.c_in and job.c, and whose C reaches no sink when it fails its check.
  absl::Status RunOnSlot(int slot_index, const GemmJob& job, GemmReport* report,
                         const BatchIo* batch = nullptr);
  // The check's vectors (`floats` floats from `d_verify`) to the host, each item's rows checked
  // (verify::CheckRows), and report's verify fields filled: verify_ms is the time the check
  // added after the GEMM, and before it unless `prepared_beside` (its first passes ran beside
  // the GEMM, whose kernel_ms then holds what they cost it). REQUIRES: the check's kernels done.
  absl::Status CheckOnHost(Slot& slot, const std::vector<CheckItem>& checks, const float* d_verify,
                           size_t floats, bool prepared_beside, GemmReport* report);
  // Waits for slot.kernel_done of a kernel of `flops` (see CudaBackendOptions::completion_spin).
  cudaError_t WaitForKernel(const Slot& slot, double flops) const;
  // A stream and a pinned staging ring through which one thread at a time copies between
  // pageable host memory and resident matrices: the driver's own staging of pageable memory
  // moved 8192³'s operands over the bulk channel at 5 GB/s where this moved them at 9
  // (docs/data_plane.md, "Staging resident copies").
  struct ResidentStager {
    ResidentStager() = default;
    ResidentStager(const ResidentStager&) = delete;
    ResidentStager& operator=(const ResidentStager&) = delete;
    ~ResidentStager();
    cudaStream_t stream = nullptr;
    PinnedStagingRing staging;  // after `stream`: freed once the stream has finished
  };
  // Copies of fewer bytes go straight to the driver: staging gains them nothing, and they would
  // hold stagers that large copies need.
  static constexpr int64_t kMinStagedBytes = int64_t{1} << 20;
  // Stagers a device lends at most (each pins kStagerPieces × kStagerPieceBytes of host
  // memory); a copy that finds none idle goes straight to the driver rather than wait.
  static constexpr int kStagersPerDevice = 8;
  static constexpr int kStagerPieces = 2;
  static constexpr int64_t kStagerPieceBytes = int64_t{4} << 20;  // a bulk chunk
  // A copy of a resident matrix's bytes on `stream`: through `ring`'s pinned pieces, or (ring
  // null) by the driver from pageable memory. Returns the first failed CUDA call's error (and
  // the call in *call) or cudaSuccess; its copies may still be in flight either way.
  using ResidentCopy =
      std::function<cudaError_t(cudaStream_t stream, PinnedStagingRing* ring, const char** call)>;
  // Runs `copy` (an "upload" or "download" of `bytes` of a resident matrix on device
  // `device_index`) and waits for it: on a stager of that device, lent from its idle list (made
  // while it has fewer than kStagersPerDevice), or on the calling thread's default stream
  // (cudaStreamPerThread: copies of several threads do not wait for each other).
  absl::Status CopyResident(int device_index, const char* direction, int64_t bytes,
                            const ResidentCopy& copy);
  // The sources' bytes, back to back from `dst` on `stream`, through `ring`'s pinned pieces of
  // `piece_bytes` (several sources to a piece): copying piece i+1 on the host overlaps the DMA
  // of piece i; a piece is reused once the event recorded after its copy has fired. Returns the
  // first failed call's error (and the call in *call) or cudaSuccess.
  static cudaError_t StageToDevice(PinnedStagingRing& ring, cudaStream_t stream, size_t piece_bytes,
                                   char* dst, const std::vector<HostSource>& sources,
                                   const char** call);
  // `bytes` from `src` on the device to `dst` in host memory through `ring`'s pieces: all of
  // them in flight, the host copying out the oldest while later ones are on the wire. Returns
  // as StageToDevice, with every copy done on success. REQUIRES: every piece free.
  static cudaError_t StageToHost(PinnedStagingRing& ring, cudaStream_t stream, size_t piece_bytes,
                                 char* dst, const char* src, size_t bytes, const char** call);
  absl::Status CopyToDevice(Slot& slot, char* dst, const char* src, size_t bytes);
  // The sources' bytes, back to back from `dst`, staged as one (several to a piece).
  absl::Status CopyToDevice(Slot& slot, char* dst, const std::vector<HostSource>& sources);
  // `rows` rows of `width` bytes, back to back at `src` in host memory, to rows `dst_pitch`
  // apart at `dst`, staged as CopyToDevice (whole rows per piece).
  absl::Status CopyRowsToDevice(Slot& slot, char* dst, size_t dst_pitch, const char* src,
                                size_t width, size_t rows);
  absl::Status CopyToHost(Slot& slot, char* dst, const char* src, size_t bytes,
                          const std::function<void(int64_t)>& progress, double* d2h_ms);
  // The spans' bytes staged through the slot's pinned ring, in order, overlapping the DMA of
  // later pieces with host copies of earlier ones; then waits for everything on the slot's
  // stream. `progress` (may be empty) gets the bytes of a lone span that are final. *d2h_ms:
  // from the event `from` to the last byte on the host.
  absl::Status CopySpansToHost(Slot& slot, const std::vector<HostSpan>& spans,
                               const std::function<void(int64_t)>& progress, cudaEvent_t from,
                               double* d2h_ms);
  // Each member's A (`c_in`: its C_in) into its rows of the stacked operand at `dst` on the
  // slot's device (stacked_rows rows in all; a transposed A's are columns): device to device
  // from a resident buffer, by DMA from pinned memory, else staged through the pinned ring.
  absl::Status CopyRowsIn(Slot& slot, const std::vector<const GemmJob*>& members, bool c_in,
                          int64_t stacked_rows, char* dst);
  // Each member's rows of the stacked C at `d_c` to its own sink (a kept C or a client's
  // device buffer device to device, pinned memory by DMA, other host memory staged), skipping
  // members whose status is not OK; then waits for all of them.
  absl::Status CopyRowsOut(Slot& slot, const BatchIo& batch, const char* d_c, double* d2h_ms);
  // Device → pinned host memory (GemmJob::pinned.c) in one DMA, then waits for it.
  absl::Status CopyToPinnedHost(Slot& slot, char* dst, const char* src, size_t bytes,
                                const std::function<void(int64_t)>& progress, double* d2h_ms);

  const CudaBackendOptions options_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<int> slot_device_index_;
  verify::ResidentBCache<DeviceBSide> b_sides_;
  std::mutex stagers_mu_;
  // By device index: the stagers made, and those of them idle.
  std::vector<int> stagers_made_;
  std::vector<std::vector<std::unique_ptr<ResidentStager>>> idle_stagers_;
};

// `expr` (a CUDA call of class `site`, FaultSite) or return its failure (Fail).
#define CUDA_TRY(slot, site, expr)                                    \
  do {                                                                \
    if (cudaError_t e_ = HGEMM_CUDA(site, expr); e_ != cudaSuccess) { \
      return Fail(slot, e_, #expr);                                   \
    }                                                                 \
  } while (0)

void CudaBackend::EnablePeerAccess() {
  for (const auto& from : devices_) {
    for (const auto& to : devices_) {
      int can = 0;
      if (from->ordinal == to->ordinal ||
          cudaDeviceCanAccessPeer(&can, from->ordinal, to->ordinal) != cudaSuccess || !can) {
        continue;
      }
      cudaSetDevice(from->ordinal);
      if (cudaError_t e = cudaDeviceEnablePeerAccess(to->ordinal, 0);
          e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        spdlog::warn("device {} → {}: no peer access ({})", from->ordinal, to->ordinal,
                     cudaGetErrorString(e));
      }
      cudaGetLastError();
    }
  }
}

absl::Status CudaBackend::Fail(Slot& slot, cudaError_t e, const std::string& what) {
  // A device fault may surface first here, while waiting for the stream.
  if (cudaError_t drained = cudaStreamSynchronize(slot.stream);
      IsStickyError(drained) && !IsStickyError(e)) {
    e = drained;
  }
  cudaGetLastError();  // clear a non-sticky error so the slot stays usable
  std::string message = fmt::format("device {} stream {}: {}: {}", slot.device->ordinal,
                                    slot.stream_id, what, cudaGetErrorString(e));
  if (IsStickyError(e)) {
    MarkFailed(*slot.device, message);
    return status::DeviceFailed(message + " (the device has failed; the server must restart)");
  }
  spdlog::error("{}", message);
  if (e == cudaErrorMemoryAllocation) return status::OverLimit("device_memory", message);
  return status::BackendFailure(message);
}

void CudaBackend::MarkFailed(Device& device, const std::string& why) {
  if (device.healthy.exchange(false)) {
    spdlog::critical(
        "device {} FAILED: {}; its GEMMs and resident matrices are refused with "
        "UNAVAILABLE until the server restarts",
        device.ordinal, why);
  }
}

absl::Status CudaBackend::Refused(const Device& device) {
  return status::DeviceFailed(fmt::format(
      "device {} has failed (a sticky CUDA error); the server must restart", device.ordinal));
}

absl::Status CudaBackend::EnsureCapacity(Slot& slot, size_t bytes) {
  if (bytes <= slot.device_capacity) return absl::OkStatus();
  Device& device = *slot.device;
  if (!device.memory->Reserve(bytes - slot.device_capacity)) {
    return status::OverLimit(
        "device_memory",
        fmt::format(
            "the GEMM needs {} bytes on device {}; {} of its {}-byte budget are in use by streams "
            "and resident matrices",
            bytes, device.ordinal, device.memory->used_bytes(), device.memory->budget_bytes()));
  }
  // From here the slot's claim on the budget is `bytes`, whatever it holds.
  cudaError_t e = HGEMM_CUDA(kStream, cudaStreamSynchronize(slot.stream));
  if (e == cudaSuccess) e = cudaFree(slot.device_buffer);
  slot.device_buffer = nullptr;
  void* buffer = nullptr;
  if (e == cudaSuccess) e = HGEMM_CUDA(kDeviceAlloc, cudaMalloc(&buffer, bytes));
  if (e != cudaSuccess) {
    device.memory->Unreserve(bytes);
    slot.device_capacity = 0;
    return Fail(slot, e, fmt::format("growing the stream's buffers to {} bytes", bytes));
  }
  slot.device_buffer = static_cast<char*>(buffer);
  slot.device_capacity = bytes;
  spdlog::debug("device {} stream {}: buffers grown to {} bytes", device.ordinal, slot.stream_id,
                bytes);
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateResident(int device_index, int64_t bytes,
                                           std::shared_ptr<ResidentBuffer>* buffer) {
  Device& device = *devices_[device_index];
  if (!device.healthy) return Refused(device);
  if (cudaError_t e = HGEMM_CUDA(kDeviceAlloc, cudaSuccess); e != cudaSuccess) {
    // Injected (test builds): what DeviceMemory answers when the driver has no memory.
    return status::OverLimit("device_memory",
                             fmt::format("device {}: cudaMalloc({}) for a resident matrix: {}",
                                         device.ordinal, bytes, cudaGetErrorString(e)));
  }
  return device.memory->AllocateResident(bytes, buffer);
}

absl::Status CudaBackend::WriteResident(ResidentBuffer& buffer, int64_t offset, const void* host,
                                        int64_t bytes) {
  return WriteResidentPieces(buffer, offset,
                             {std::string_view(static_cast<const char*>(host), size_t(bytes))});
}

absl::Status CudaBackend::WriteResidentPieces(ResidentBuffer& buffer, int64_t offset,
                                              const std::vector<std::string_view>& pieces) {
  b_sides_.Forget(&buffer);
  std::vector<HostSource> sources;
  int64_t bytes = 0;
  for (std::string_view piece : pieces) {
    sources.push_back({piece.data(), piece.size()});
    bytes += int64_t(piece.size());
  }
  char* dst = static_cast<char*>(buffer.data) + offset;
  return CopyResident(
      buffer.device_index, "upload", bytes,
      [&](cudaStream_t stream, PinnedStagingRing* ring, const char** call) {
        if (ring != nullptr) {
          return StageToDevice(*ring, stream, size_t(kStagerPieceBytes), dst, sources, call);
        }
        // One device copy for the chunk, not one per slice: each pageable copy is a call and a
        // wait. The thread's buffer is reused: no allocation once it has grown to a chunk.
        if (bytes == 0) return cudaSuccess;
        thread_local std::string gathered;
        const char* host = sources.front().host;
        if (sources.size() > 1) {
          gathered.clear();
          for (const HostSource& source : sources) gathered.append(source.host, source.bytes);
          host = gathered.data();
        }
        *call = "cudaMemcpyAsync (host to device)";
        return HGEMM_CUDA(kCopyToDevice, cudaMemcpyAsync(dst, host, size_t(bytes),
                                                         cudaMemcpyHostToDevice, stream));
      });
}

absl::Status CudaBackend::ReadResident(const ResidentBuffer& buffer, void* host) {
  return ReadResidentRange(buffer, 0, buffer.bytes, host);
}

absl::Status CudaBackend::ReadResidentRange(const ResidentBuffer& buffer, int64_t offset,
                                            int64_t bytes, void* host) {
  const char* src = static_cast<const char*>(buffer.data) + offset;
  char* dst = static_cast<char*>(host);
  return CopyResident(
      buffer.device_index, "download", bytes,
      [&](cudaStream_t stream, PinnedStagingRing* ring, const char** call) {
        if (ring != nullptr) {
          return StageToHost(*ring, stream, size_t(kStagerPieceBytes), dst, src, size_t(bytes),
                             call);
        }
        *call = "cudaMemcpyAsync (device to host)";
        return HGEMM_CUDA(kCopyToHost,
                          cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost, stream));
      });
}

// Portable: the pages count as pinned for every device's context, so any slot may DMA them.
absl::Status CudaBackend::PinHostMemory(void* data, int64_t bytes, std::function<void()>* unpin) {
  // Registration needs a current context; that of any device serves all (portable).
  if (cudaError_t e = cudaSetDevice(devices_.front()->ordinal); e != cudaSuccess) {
    cudaGetLastError();
    return status::BackendFailure(
        fmt::format("cudaSetDevice({}): {}", devices_.front()->ordinal, cudaGetErrorString(e)));
  }
  if (cudaError_t e = cudaHostRegister(data, size_t(bytes), cudaHostRegisterPortable);
      e != cudaSuccess) {
    cudaGetLastError();
    const std::string message =
        fmt::format("cudaHostRegister of {} bytes: {}", bytes, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? status::OverLimit("host_memory", message)
                                          : status::BackendFailure(message);
  }
  *unpin = [data] {
    if (cudaError_t e = cudaHostUnregister(data); e != cudaSuccess) {
      cudaGetLastError();
      spdlog::error("cudaHostUnregister of a shared-memory region: {}", cudaGetErrorString(e));
    }
  };
  return absl::OkStatus();
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints a device's UUID.
std::string UuidName(const cudaUUID_t& uuid) {
  std::string hex;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex += '-';
    hex += fmt::format("{:02x}", static_cast<unsigned char>(uuid.bytes[i]));
  }
  return "GPU-" + hex;
}

std::string Lowercase(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int CudaBackend::FindDeviceByName(const std::string& name) const {
  const std::string wanted = Lowercase(name);
  for (size_t i = 0; i < devices_.size(); ++i) {
    char bus_id[32] = {};
    const bool has_bus_id =
        cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), devices_[i]->ordinal) == cudaSuccess;
    cudaGetLastError();
    if (wanted == Lowercase(UuidName(devices_[i]->props.uuid)) ||
        (has_bus_id && wanted == Lowercase(bus_id))) {
      return int(i);
    }
  }
  return -1;
}

// The size of the allocation starting at `base` (cuMemGetAddressRange, reached through the
// runtime so that nothing links the driver library), or an error.
absl::Status AllocationSize(void* base, size_t* size) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000,
                                                       cudaEnableDefault, &found);
      e != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr) {
    cudaGetLastError();
    return status::BackendFailure("cuMemGetAddressRange is not available from the driver");
  }
  CUdeviceptr range_base = 0;
  if (CUresult r = reinterpret_cast<GetAddressRange>(entry)(&range_base, size,
                                                            reinterpret_cast<CUdeviceptr>(base));
      r != CUDA_SUCCESS) {
    return status::BackendFailure(fmt::format("cuMemGetAddressRange: error {}", int(r)));
  }
  if (range_base != reinterpret_cast<CUdeviceptr>(base)) {
    return status::BackendFailure("the opened memory is not the start of its allocation");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::OpenIpcMemory(const std::string& ipc_handle, const std::string& device,
                                        int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer) {
  cudaIpcMemHandle_t handle{};
  if (ipc_handle.size() != sizeof(handle)) {
    return status::InvalidArgument(
        "cuda_ipc.handle",
        fmt::format("{} bytes; a cudaIpcMemHandle_t has {}", ipc_handle.size(), sizeof(handle)));
  }
  std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
  const int index = FindDeviceByName(device);
  if (index < 0) {
    std::string mine;
    for (const auto& d : devices_) {
      char bus_id[32] = {};
      if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), d->ordinal) != cudaSuccess) {
        cudaGetLastError();
      }
      mine += fmt::format("{}{} {} ({})", mine.empty() ? "" : ", ", d->ordinal,
                          UuidName(d->props.uuid), bus_id);
    }
    return status::FailedPrecondition(fmt::format(
        "device {} is not one of this server's devices ({}); CUDA IPC memory is used only on "
        "its own device, never copied to another",
        status::Quote(device), mine));
  }
  Device& d = *devices_[index];
  if (!d.healthy) return Refused(d);
  if (cudaError_t e = cudaSetDevice(d.ordinal); e != cudaSuccess) {
    cudaGetLastError();
    return status::BackendFailure(
        fmt::format("cudaSetDevice({}): {}", d.ordinal, cudaGetErrorString(e)));
  }
  void* data = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&data, handle, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    cudaGetLastError();
    return status::InvalidArgument(
        "cuda_ipc.handle",
        fmt::format("cudaIpcOpenMemHandle on device {}: {}", d.ordinal, cudaGetErrorString(e)));
  }
  const int ordinal = d.ordinal;
  auto close = [ordinal](void* p) {
    cudaSetDevice(ordinal);
    if (cudaError_t e = cudaIpcCloseMemHandle(p); e != cudaSuccess) {
      cudaGetLastError();
      spdlog::error("cudaIpcCloseMemHandle on device {}: {}", ordinal, cudaGetErrorString(e));
    }
  };
  // Peer access would open another device's memory here too: refused, as it would make every
  // copy of it a cross-device one.
  cudaPointerAttributes attributes{};
  if (cudaError_t e = cudaPointerGetAttributes(&attributes, data); e != cudaSuccess) {
    cudaGetLastError();
    close(data);
    return status::BackendFailure(
        fmt::format("cudaPointerGetAttributes of CUDA IPC memory: {}", cudaGetErrorString(e)));
  }
  if (attributes.device != ordinal) {
    close(data);
    return status::FailedPrecondition(
        fmt::format("the CUDA IPC handle's memory is on device {}, not on {} (device {}) as named",
                    attributes.device, status::Quote(device), ordinal));
  }
  size_t size = 0;
  if (absl::Status s = AllocationSize(data, &size); !s.ok()) {
    close(data);
    return s;
  }
  if (uint64_t(bytes) > size) {
    close(data);
    return status::InvalidArgument(
        "byte_size", fmt::format("{} bytes, but the shared allocation has {}", bytes, size));
  }
  *buffer = std::make_shared<ResidentBuffer>(index, bytes, data, close);
  return absl::OkStatus();
}

CudaBackend::ResidentStager::~ResidentStager() {
  if (stream != nullptr) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

absl::Status CudaBackend::CopyResident(int device_index, const char* direction, int64_t bytes,
                                       const ResidentCopy& copy) {
  Device& device = *devices_[device_index];
  if (!device.healthy) return Refused(device);
  cudaSetDevice(device.ordinal);
  std::unique_ptr<ResidentStager> stager;
  bool make_stager = false;
  if (bytes >= kMinStagedBytes) {
    std::lock_guard<std::mutex> lock(stagers_mu_);
    auto& idle = idle_stagers_[size_t(device_index)];
    if (!idle.empty()) {
      stager = std::move(idle.back());
      idle.pop_back();
    } else if (stagers_made_[size_t(device_index)] < kStagersPerDevice) {
      ++stagers_made_[size_t(device_index)];
      make_stager = true;
    }
  }
  if (make_stager) {
    stager = std::make_unique<ResidentStager>();
    std::string error = CheckCuda(cudaStreamCreateWithFlags(&stager->stream, cudaStreamNonBlocking),
                                  device.ordinal, "cudaStreamCreate");
    if (error.empty()) {
      error =
          stager->staging.Init(kStagerPieces, kStagerPieceBytes, stager->stream, device.ordinal);
    }
    if (!error.empty()) {
      // This copy goes straight to the driver; a later one may make the stager.
      spdlog::warn("device {}: a staging stream for resident copies: {}", device.ordinal, error);
      cudaGetLastError();
      stager.reset();
      std::lock_guard<std::mutex> lock(stagers_mu_);
      --stagers_made_[size_t(device_index)];
    }
  }
  const cudaStream_t stream = stager != nullptr ? stager->stream : cudaStreamPerThread;
  const char* call = "";
  cudaError_t e = copy(stream, stager != nullptr ? &stager->staging : nullptr, &call);
  // Synchronized even after a failed call: nothing of this copy may be in flight on return.
  if (cudaError_t synced = cudaStreamSynchronize(stream);
      e == cudaSuccess && synced != cudaSuccess) {
    e = synced;
    call = "cudaStreamSynchronize";
  }
  if (stager != nullptr) {
    std::lock_guard<std::mutex> lock(stagers_mu_);
    idle_stagers_[size_t(device_index)].push_back(std::move(stager));
  }
  // A download that completed after the device failed (another thread's fault) is not
  // trusted either.
  if (e == cudaSuccess && !device.healthy) return Refused(device);
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  std::string message = fmt::format("device {}: {} of a resident matrix: {}: {}", device.ordinal,
                                    direction, call, cudaGetErrorString(e));
  if (IsStickyError(e)) {
    MarkFailed(device, message);
    return status::DeviceFailed(message + " (the device has failed; the server must restart)");
  }
  spdlog::error("{}", message);
  return status::BackendFailure(message);
}

cudaError_t CudaBackend::StageToDevice(PinnedStagingRing& ring, cudaStream_t stream,
                                       size_t piece_bytes, char* dst,
                                       const std::vector<HostSource>& sources, const char** call) {
  size_t source = 0, taken = 0;  // the next bytes to stage: sources[source] from `taken`
  size_t offset = 0;             // where the next piece lands, from dst
  while (true) {
    while (source < sources.size() && taken == sources[source].bytes) {
      ++source;
      taken = 0;
    }
    if (source == sources.size()) return cudaSuccess;
    const size_t r = ring.next++ % ring.size();
    if (cudaError_t e = HGEMM_CUDA(kEvent, cudaEventSynchronize(ring.free_event(r)));
        e != cudaSuccess) {
      *call = "cudaEventSynchronize (a staging piece)";
      return e;
    }
    size_t filled = 0;
    while (filled < piece_bytes && source < sources.size()) {
      const size_t n = std::min(piece_bytes - filled, sources[source].bytes - taken);
      std::memcpy(ring.piece(r) + filled, sources[source].host + taken, n);
      filled += n;
      taken += n;
      if (taken == sources[source].bytes) {
        ++source;
        taken = 0;
      }
    }
    if (cudaError_t e = HGEMM_CUDA(
            kCopyToDevice,
            cudaMemcpyAsync(dst + offset, ring.piece(r), filled, cudaMemcpyHostToDevice, stream));
        e != cudaSuccess) {
      *call = "cudaMemcpyAsync (host to device)";
      return e;
    }
    if (cudaError_t e = HGEMM_CUDA(kEvent, cudaEventRecord(ring.free_event(r), stream));
        e != cudaSuccess) {
      *call = "cudaEventRecord (a staging piece)";
      return e;
    }
    offset += filled;
  }
}

cudaError_t CudaBackend::StageToHost(PinnedStagingRing& ring, cudaStream_t stream,
                                     size_t piece_bytes, char* dst, const char* src, size_t bytes,
                                     const char** call) {
  const size_t pieces = (bytes + piece_bytes - 1) / piece_bytes;
  size_t issued = 0;
  for (size_t landed = 0; landed < pieces; ++landed) {
    for (; issued < pieces && issued < landed + ring.size(); ++issued) {
      const size_t at = issued * piece_bytes, r = issued % ring.size();
      if (cudaError_t e = HGEMM_CUDA(kCopyToHost, cudaMemcpyAsync(ring.piece(r), src + at,
                                                                  std::min(piece_bytes, bytes - at),
                                                                  cudaMemcpyDeviceToHost, stream));
          e != cudaSuccess) {
        *call = "cudaMemcpyAsync (device to host)";
        return e;
      }
      if (cudaError_t e = HGEMM_CUDA(kEvent, cudaEventRecord(ring.free_event(r), stream));
          e != cudaSuccess) {
        *call = "cudaEventRecord (a staging piece)";
        return e;
      }
    }
    const size_t at = landed * piece_bytes, r = landed % ring.size();
    if (cudaError_t e = HGEMM_CUDA(kEvent, cudaEventSynchronize(ring.free_event(r)));
        e != cudaSuccess) {
      *call = "cudaEventSynchronize (a staging piece)";
      return e;
    }
    std::memcpy(dst + at, ring.piece(r), std::min(piece_bytes, bytes - at));
  }
  return cudaSuccess;
}

absl::Status CudaBackend::CopyToDevice(Slot& slot, char* dst, const char* src, size_t bytes) {
  return CopyToDevice(slot, dst, {HostSource{src, bytes}});
}

absl::Status CudaBackend::CopyToDevice(Slot& slot, char* dst,
                                       const std::vector<HostSource>& sources) {
  const char* call = "";
  if (cudaError_t e = StageToDevice(slot.staging, slot.stream, size_t(options_.staging_piece_bytes),
                                    dst, sources, &call);
      e != cudaSuccess) {
    return Fail(slot, e, call);
  }
  return absl::OkStatus();
}

// Host → pinned piece → device for rows that are `dst_pitch` apart on the device (a member's
// share of a transposed stacked A): as CopyToDevice, whole rows per piece, each piece one 2-D
// copy. A row longer than a piece goes through the driver's own staging of pageable memory.
absl::Status CudaBackend::CopyRowsToDevice(Slot& slot, char* dst, size_t dst_pitch, const char* src,
                                           size_t width, size_t rows) {
  const size_t per_piece = size_t(options_.staging_piece_bytes) / width;
  if (per_piece == 0) {
    CUDA_TRY(slot, kCopyToDevice,
             cudaMemcpy2DAsync(dst, dst_pitch, src, width, width, rows, cudaMemcpyHostToDevice,
                               slot.stream));
    return absl::OkStatus();
  }
  for (size_t row = 0; row < rows; row += per_piece) {
    const size_t n = std::min(per_piece, rows - row);
    const size_t r = slot.staging.next++ % slot.staging.size();
    CUDA_TRY(slot, kEvent, cudaEventSynchronize(slot.staging.free_event(r)));
    std::memcpy(slot.staging.piece(r), src + row * width, n * width);
    CUDA_TRY(slot, kCopyToDevice,
             cudaMemcpy2DAsync(dst + row * dst_pitch, dst_pitch, slot.staging.piece(r), width,
                               width, n, cudaMemcpyHostToDevice, slot.stream));
    CUDA_TRY(slot, kEvent, cudaEventRecord(slot.staging.free_event(r), slot.stream));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(Slot& slot, char* dst, const char* src, size_t bytes,
                                     const std::function<void(int64_t)>& progress, double* d2h_ms) {
  return CopySpansToHost(slot, {HostSpan{dst, src, bytes}}, progress, slot.kernel_done, d2h_ms);
}

// Device → pinned piece → host: up to staging_buffers pieces in flight; the host copies out
// the oldest while later ones are still on the wire, and reports each landed piece. A piece
// never straddles two spans.
absl::Status CudaBackend::CopySpansToHost(Slot& slot, const std::vector<HostSpan>& spans,
                                          const std::function<void(int64_t)>& progress,
                                          cudaEvent_t from, double* d2h_ms) {
  const size_t piece = options_.staging_piece_bytes;
  const size_t ring = slot.staging.size();
  struct Piece {
    char* host;
    const char* device;
    size_t bytes;
    size_t final_bytes;  // of its span, once it has landed
  };
  std::vector<Piece> pieces;
  for (const HostSpan& span : spans) {
    for (size_t offset = 0; offset < span.bytes; offset += piece) {
      const size_t n = std::min(piece, span.bytes - offset);
      pieces.push_back({span.host + offset, span.device + offset, n, offset + n});
    }
  }
  auto drain = [&](size_t i) -> absl::Status {
    const size_t r = (slot.staging.next + i) % ring;
    CUDA_TRY(slot, kEvent, cudaEventSynchronize(slot.staging.free_event(r)));
    std::memcpy(pieces[i].host, slot.staging.piece(r), pieces[i].bytes);
    if (progress) progress(int64_t(pieces[i].final_bytes));
    return absl::OkStatus();
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i >= ring) {
      if (absl::Status s = drain(i - ring); !s.ok()) return s;
    }
    const size_t r = (slot.staging.next + i) % ring;
    CUDA_TRY(slot, kEvent, cudaEventSynchronize(slot.staging.free_event(r)));  // H2D use done
    CUDA_TRY(slot, kCopyToHost,
             cudaMemcpyAsync(slot.staging.piece(r), pieces[i].device, pieces[i].bytes,
                             cudaMemcpyDeviceToHost, slot.stream));
    CUDA_TRY(slot, kEvent, cudaEventRecord(slot.staging.free_event(r), slot.stream));
  }
  CUDA_TRY(slot, kEvent, cudaEventRecord(slot.d2h_done, slot.stream));
  CUDA_TRY(slot, kEvent, cudaEventSynchronize(slot.d2h_done));
  const auto tail_start = Clock::now();
  for (size_t i = pieces.size() > ring ? pieces.size() - ring : 0; i < pieces.size(); ++i) {
    if (absl::Status s = drain(i); !s.ok()) return s;
  }
  float device_ms = 0;
  CUDA_TRY(slot, kEvent, cudaEventElapsedTime(&device_ms, from, slot.d2h_done));
  *d2h_ms = device_ms + Milliseconds(Clock::now() - tail_start);
  slot.staging.next += pieces.size();
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyRowsIn(Slot& slot, const std::vector<const GemmJob*>& members,
                                     bool c_in, int64_t stacked_rows, char* dst) {
  const GemmJob& first = *members.front();
  const GemmShape& shape = first.shape;
  const int here = slot.device->ordinal;
  const size_t element = size_t(ElementBytes(c_in ? shape.c_type : shape.ab_type));
  const size_t cols = size_t(c_in ? shape.n : shape.k);
  // Stored k×m, a transposed A's rows are columns [row, row + m) of the k×stacked_rows A.
  const bool as_columns = !c_in && first.transpose_a;
  // Staged members next to each other fill a run of rows, staged as one.
  char* run_dst = nullptr;
  std::vector<HostSource> run;
  auto flush = [&]() -> absl::Status {
    absl::Status s = run.empty() ? absl::OkStatus() : CopyToDevice(slot, run_dst, run);
    run.clear();
    return s;
  };
  size_t row = 0;
  for (const GemmJob* member : members) {
    const size_t m = size_t(member->shape.m);
    const ResidentBuffer* resident = c_in ? member->c_in_resident.get() : member->a_resident.get();
    const void* host = c_in ? member->c_in : static_cast<const void*>(member->a);
    const bool pinned = c_in ? member->pinned.c_in : member->pinned.a;
    const char* src = static_cast<const char*>(resident != nullptr ? resident->data : host);
    const int from = resident != nullptr ? devices_[resident->device_index]->ordinal : here;
    if (as_columns) {
      char* to = dst + row * element;
      const size_t width = m * element, pitch = size_t(stacked_rows) * element;
      if (resident != nullptr && from != here) {  // RunBatch sends these the default's way
        return status::BackendFailure(
            fmt::format("device {} stream {}: a transposed A resident on device {} in a batch",
                        here, slot.stream_id, from));
      }
      if (resident != nullptr || pinned) {
        CUDA_TRY(slot, kCopyToDevice,
                 cudaMemcpy2DAsync(
                     to, pitch, src, width, width, cols,
                     resident != nullptr ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                     slot.stream));
      } else if (absl::Status s = CopyRowsToDevice(slot, to, pitch, src, width, cols); !s.ok()) {
        return s;
      }
    } else {
      char* to = dst + row * cols * element;
      const size_t bytes = m * cols * element;
      if (resident == nullptr && !pinned) {
        if (run.empty()) run_dst = to;
        run.push_back({src, bytes});
      } else if (absl::Status s = flush(); !s.ok()) {
        return s;
      } else if (resident != nullptr && from != here) {
        CUDA_TRY(slot, kCopyToDevice, cudaMemcpyPeerAsync(to, here, src, from, bytes, slot.stream));
      } else {
        CUDA_TRY(
            slot, kCopyToDevice,
            cudaMemcpyAsync(to, src, bytes,
                            resident != nullptr ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                            slot.stream));
      }
    }
    row += m;
  }
  return flush();
}

absl::Status CudaBackend::CopyRowsOut(Slot& slot, const BatchIo& batch, const char* d_c,
                                      double* d2h_ms) {
  CUDA_TRY(slot, kEvent, cudaEventRecord(slot.rows_out_start, slot.stream));
  std::vector<HostSpan> staged;
  size_t offset = 0;
  for (size_t i = 0; i < batch.members->size(); ++i) {
    const GemmJob& member = *(*batch.members)[i];
    const size_t bytes = size_t(member.shape.CBytes());
    const char* src = d_c + offset;
    offset += bytes;
    if (!(*batch.statuses)[i].ok()) continue;  // its sink could not be had
    if (member.keep_c || member.c_device) {
      void* to = member.keep_c ? (*batch.kept_c)[i]->data : member.c_device->data;
      CUDA_TRY(slot, kCopyToHost,
               cudaMemcpyAsync(to, src, bytes, cudaMemcpyDeviceToDevice, slot.stream));
    } else if (member.pinned.c) {
      CUDA_TRY(slot, kCopyToHost,
               cudaMemcpyAsync(member.c, src, bytes, cudaMemcpyDeviceToHost, slot.stream));
    } else {
      staged.push_back({static_cast<char*>(member.c), src, bytes});
    }
  }
  return CopySpansToHost(slot, staged, nullptr, slot.rows_out_start, d2h_ms);
}

absl::Status CudaBackend::CopyToPinnedHost(Slot& slot, char* dst, const char* src, size_t bytes,
                                           const std::function<void(int64_t)>& progress,
                                           double* d2h_ms) {
  CUDA_TRY(slot, kCopyToHost,
           cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, slot.stream));
  CUDA_TRY(slot, kEvent, cudaEventRecord(slot.d2h_done, slot.stream));
  CUDA_TRY(slot, kEvent, cudaEventSynchronize(slot.d2h_done));
  float device_ms = 0;
  CUDA_TRY(slot, kEvent, cudaEventElapsedTime(&device_ms, slot.kernel_done, slot.d2h_done));
  *d2h_ms = device_ms;
  if (progress) progress(int64_t(bytes));
  return absl::OkStatus();
}

absl::Status CudaBackend::CheckOnHost(Slot& slot, const std::vector<CheckItem>& checks,
                                      const float* d_verify, size_t floats, bool prepared_beside,
                                      GemmReport* report) {
  std::vector<float> host(floats);
  CUDA_TRY(slot, kCopyToHost,
           cudaMemcpyAsync(host.data(), d_verify, floats * sizeof(float), cudaMemcpyDeviceToHost,
                           slot.stream));
  CUDA_TRY(slot, kStream, cudaStreamSynchronize(slot.stream));
  int repetitions = 0;
  for (const CheckItem& item : checks) {
    const verify::Form& f = item.form;
    const float* base = host.data() + (item.floats - d_verify);
    auto row = [&](int i) {
      return std::vector<float>(base + f.n + 2 * f.k + i * f.m,
                                base + f.n + 2 * f.k + (i + 1) * f.m);
    };
    verify::RowSums sums{.cr = row(4), .a_sq = row(1), .c_sq = row(5)};
    const std::vector<float> ax = row(0), c_in_r = row(2);
    if (f.beta != 0) sums.c_in_sq = row(3);
    sums.expected.resize(f.m);
    for (int64_t i = 0; i < f.m; ++i) {
      sums.expected[i] = f.alpha * ax[i] + (f.beta != 0 ? f.beta * c_in_r[i] : 0.0f);
    }
    for (int64_t l = 0; l < f.k; ++l) sums.b_sq += base[f.n + f.k + l];
    if (std::string failed = verify::CheckRows(f, sums); !failed.empty()) {
      report->verify_failure =
          fmt::format("problem {}, repetition {} of {}: {}", item.problem, item.repetition + 1,
                      checks.back().repetition + 1, failed);
      break;
    }
    repetitions = item.repetition + 1;
  }
  report->verified_repetitions = report->verify_failure.empty() ? repetitions : 0;
  float prepare_ms = 0, check_ms = 0;
  if (!prepared_beside) {
    CUDA_TRY(slot, kEvent, cudaEventElapsedTime(&prepare_ms, slot.h2d_done, slot.verify_prepared));
  }
  CUDA_TRY(slot, kEvent, cudaEventElapsedTime(&check_ms, slot.kernel_done, slot.verify_done));
  report->verify_ms = prepare_ms + check_ms;
  return absl::OkStatus();
}

cudaError_t CudaBackend::WaitForKernel(const Slot& slot, double flops) const {
  if (options_.completion_spin.count() > 0) {
    // sleep_for overshoots by up to the timer slack (50 us by default on Linux).
    constexpr auto kWakeMargin = std::chrono::microseconds(200);
    const auto floor = std::chrono::duration<double>(flops / slot.device->peak_flops);
    if (floor > kWakeMargin) std::this_thread::sleep_for(floor - kWakeMargin);
    const auto until = Clock::now() + options_.completion_spin;
    do {
      if (cudaError_t e = HGEMM_CUDA(kEvent, cudaEventQuery(slot.kernel_done));
          e != cudaErrorNotReady) {
        return e;
      }
      std::this_thread::yield();
    } while (Clock::now() < until);
  }
  return HGEMM_CUDA(kEvent, cudaEventSynchronize(slot.kernel_done));
}

absl::Status CudaBackend::Run(int slot_index, const GemmJob& job, GemmReport* report) {
  Device& device = *slots_[slot_index]->device;
  for (const ResidentBuffer* r :
       {job.a_resident.get(), job.b_resident.get(), job.c_in_resident.get(), job.c_device.get()}) {
    if (r != nullptr && !devices_[r->device_index]->healthy)
      return Refused(*devices_[r->device_index]);
  }
  if (!device.healthy) return Refused(device);
  absl::Status s = RunOnSlot(slot_index, job, report);
  // No C computed on a device that has failed meanwhile (another slot's fault) is returned:
  // its copies may have raced the fault.
  if (s.ok() && !device.healthy) s = Refused(device);
  if (!s.ok()) report->c_resident.reset();  // the stream is idle (Fail): back to the cache
  return s;
}

std::vector<absl::Status> CudaBackend::RunBatch(int slot_index,
                                                const std::vector<const GemmJob*>& members,
                                                std::vector<GemmReport>* reports) {
  const int here = SlotDevice(slot_index);
  for (const GemmJob* member : members) {
    if (member->transpose_a && member->a_resident && member->a_resident->device_index != here) {
      return Backend::RunBatch(slot_index, members, reports);
    }
  }
  Device& device = *slots_[slot_index]->device;
  auto everyone = [&](const absl::Status& s) {
    return std::vector<absl::Status>(members.size(), s);
  };
  for (const GemmJob* member : members) {
    for (const ResidentBuffer* r : {member->a_resident.get(), member->b_resident.get(),
                                    member->c_in_resident.get(), member->c_device.get()}) {
      if (r != nullptr && !devices_[r->device_index]->healthy) {
        return everyone(Refused(*devices_[r->device_index]));
      }
    }
  }
  if (!device.healthy) return everyone(Refused(device));
  const GemmJob stacked = StackedJob(members);
  std::vector<absl::Status> statuses(members.size());
  std::vector<std::shared_ptr<ResidentBuffer>> kept_c(members.size());
  const BatchIo batch{.members = &members, .statuses = &statuses, .kept_c = &kept_c};
  GemmReport launch;
  absl::Status s = RunOnSlot(slot_index, stacked, &launch, &batch);
  // As Run: no C computed on a device that has failed meanwhile is delivered. The stream is
  // idle (Fail), so the kept Cs go back to the cache as `kept_c` goes.
  if (s.ok() && !device.healthy) s = Refused(device);
  if (!s.ok()) return everyone(s);
  launch.batch_size = int(members.size());
  launch.batch_rows = stacked.shape.m;
  for (size_t i = 0; i < members.size(); ++i) {
    (*reports)[i] = launch;
    // A C that failed its check went to no sink, kept ones included.
    if (launch.verify_failure.empty() && statuses[i].ok()) {
      (*reports)[i].c_resident = std::move(kept_c[i]);
    }
  }
  return statuses;
}

absl::Status CudaBackend::RunOnSlot(int slot_index, const GemmJob& job, GemmReport* report,
                                    const BatchIo* batch) {
  Slot& slot = *slots_[slot_index];
  Device& device = *slot.device;
  CUDA_TRY(slot, kStream, cudaSetDevice(device.ordinal));

  const GemmShape& shape = job.shape;
  const size_t a_bytes = shape.ABytes(), b_bytes = shape.BBytes(), c_bytes = shape.CBytes();
  // The slot's buffers hold what is not resident here: operands sent as bytes, and resident
  // operands of another device (the scheduler moved the job), copied over for this run.
  const int here = SlotDevice(slot_index);
  const bool a_here = job.a_resident && job.a_resident->device_index == here;
  const bool b_here = job.b_resident && job.b_resident->device_index == here;
  const size_t a_space = a_here ? 0 : k::AlignUp(a_bytes);
  const size_t b_space = b_here ? 0 : k::AlignUp(b_bytes);
  // C straight into a client's device memory (CUDA IPC): only on its own device.
  if (job.c_device && job.c_device->device_index != here) {
    return status::FailedPrecondition(
        fmt::format("C's CUDA IPC memory is on device {}, not on device {} that runs the GEMM",
                    devices_[job.c_device->device_index]->ordinal, device.ordinal));
  }
  const bool c_on_device = job.keep_c || job.c_device;
  const size_t c_space = c_on_device ? 0 : k::AlignUp(c_bytes);
  // Scaled (alpha/beta): a variant with fused_scale writes C = alpha·op(A)·op(B) + beta·C_in
  // itself; otherwise it writes T = op(A)·op(B) in fp32, into C itself when C is fp32, else
  // into its own space (reserved either way: the variant is chosen below, on device pointers),
  // and ScaleEpilogue follows. C_in (read with beta ≠ 0) comes over unless resident here.
  const bool scaled = job.Scaled();
  const size_t c_elements = size_t(c_bytes) / size_t(ElementBytes(shape.c_type));
  const size_t t_bytes = c_elements * sizeof(float);
  const size_t t_space = scaled && shape.c_type != ElementType::kFp32 ? k::AlignUp(t_bytes) : 0;
  const size_t c_in_bytes = shape.CInBytes();
  const bool c_in_here = job.c_in_resident && job.c_in_resident->device_index == here;
  const size_t c_in_space = c_in_bytes == 0 || c_in_here ? 0 : k::AlignUp(c_in_bytes);
  // The check's vectors (CheckItem), per repetition and problem.
  const int repetitions = job.verify_repetitions;
  const std::vector<ProblemDims> problems = shape.Problems();
  size_t verify_floats = 0;
  for (const ProblemDims& p : problems) verify_floats += CheckItem::Floats(p);
  const size_t verify_space =
      repetitions > 0 ? k::AlignUp(size_t(repetitions) * verify_floats * sizeof(float)) : 0;
  if (absl::Status s =
          EnsureCapacity(slot, a_space + b_space + c_space + t_space + c_in_space + verify_space);
      !s.ok()) {
    return s;
  }
  if (job.c_device) b_sides_.Forget(job.c_device.get());
  if (job.keep_c) {
    absl::Status s = AllocateResident(here, c_bytes, &report->c_resident);
    if (!s.ok()) return s;
  }
  // A batch's sinks on the device, each member's own: a failure is that member's alone.
  for (size_t i = 0; batch != nullptr && i < batch->members->size(); ++i) {
    const GemmJob& member = *(*batch->members)[i];
    if (member.c_device && member.c_device->device_index != here) {
      (*batch->statuses)[i] = status::FailedPrecondition(
          fmt::format("C's CUDA IPC memory is on device {}, not on device {} that runs the GEMM",
                      devices_[member.c_device->device_index]->ordinal, device.ordinal));
    } else if (member.c_device) {
      b_sides_.Forget(member.c_device.get());
    } else if (member.keep_c) {
      (*batch->statuses)[i] = AllocateResident(here, member.shape.CBytes(), &(*batch->kept_c)[i]);
    }
  }
  char* d_a = a_here ? static_cast<char*>(job.a_resident->data) : slot.device_buffer;
  char* d_b = b_here ? static_cast<char*>(job.b_resident->data) : slot.device_buffer + a_space;
  char* d_c = job.keep_c     ? static_cast<char*>(report->c_resident->data)
              : job.c_device ? static_cast<char*>(job.c_device->data)
                             : slot.device_buffer + a_space + b_space;
  char* d_t = t_space > 0 ? slot.device_buffer + a_space + b_space + c_space : d_c;
  char* d_c_in = c_in_bytes == 0 ? nullptr
                 : c_in_here     ? static_cast<char*>(job.c_in_resident->data)
                                 : slot.device_buffer + a_space + b_space + c_space + t_space;
  auto* d_verify = reinterpret_cast<float*>(slot.device_buffer + a_space + b_space + c_space +
                                            t_space + c_in_space);

  const Accumulation acc = job.accumulation;
  if (shape.batch > INT_MAX) {  // GemmProblem's int (validation allows up to 2^40 elements)
    return status::InvalidArgument(
        "batch", fmt::format("the CUDA backend takes up to {} GEMMs per batch, got {}", INT_MAX,
                             shape.batch));
  }
  // The job's problems: one (a batch is one problem: the registry checks its items, item 1 the
  // least aligned, and runs it as one launch where the kernel takes batches, the wgmma family,
  // else one per item), or one per problem of a group at its matrices' offsets. `t_form`: the
  // separate path's unscaled problems into T (fp32), else C = alpha·op(A)·op(B) + beta·C_in.
  std::vector<int64_t> item_flops;
  auto make_items = [&](bool t_form) {
    const k::GemmProblem problem{.a = d_a,
                                 .b = d_b,
                                 .c = t_form ? d_t : d_c,
                                 .accumulation = acc,
                                 .transpose_a = job.transpose_a,
                                 .transpose_b = job.transpose_b,
                                 .ab_type = KernelType(shape.ab_type),
                                 .c_type = t_form ? k::DataType::kFp32 : KernelType(shape.c_type),
                                 .batch = int(shape.batch),  // packed items (strides 0)
                                 .alpha = t_form ? 1.0f : job.alpha,
                                 .beta = t_form ? 0.0f : job.beta,
                                 .c_in = t_form ? nullptr : d_c_in};
    std::vector<k::GemmProblem> items;
    item_flops.clear();
    if (!shape.Grouped()) {
      k::GemmProblem item = problem;
      item.m = int(shape.m);
      item.n = int(shape.n);
      item.k = int(shape.k);
      items.push_back(item);
      item_flops.push_back(shape.Flops());
      return items;
    }
    const size_t c_element_bytes = t_form ? sizeof(float) : size_t(ElementBytes(shape.c_type));
    size_t a_offset = 0, b_offset = 0, c_elements_before = 0;
    for (const ProblemDims& p : shape.Problems()) {
      k::GemmProblem item = problem;
      item.a = d_a + a_offset;
      item.b = d_b + b_offset;
      item.c = static_cast<char*>(problem.c) + c_elements_before * c_element_bytes;
      if (item.c_in != nullptr)  // packed as C is
        item.c_in = d_c_in + c_elements_before * size_t(ElementBytes(shape.c_type));
      item.m = int(p.m);
      item.n = int(p.n);
      item.k = int(p.k);
      item.batch = 1;
      items.push_back(item);
      item_flops.push_back(2 * p.m * p.n * p.k);
      a_offset += size_t(MatrixBytes(p.m, p.k, shape.ab_type));
      b_offset += size_t(MatrixBytes(p.k, p.n, shape.ab_type));
      c_elements_before += size_t(p.m * p.n);
    }
    return items;
  };
  // The variant for `item`, chosen (ChooseAutoFor sends NN fp16 to ChooseAuto, as before; a
  // scaled item it tunes among the fused variants) and checked; `where` names a group's
  // problem in a refusal.
  auto choose = [&](const k::GemmProblem& item, const std::string& where,
                    const k::VariantInfo** out) -> absl::Status {
    const k::VariantInfo* variant = job.kernel == "auto"
                                        ? k::ChooseAutoFor(item, *slot.launch_context)
                                        : k::FindVariant(job.kernel);
    if (variant == nullptr && job.kernel == "auto") {
      return status::InvalidArgument(
          "options.kernel", fmt::format("{}no kernel for 'auto' takes {} {} on this device", where,
                                        k::LayoutName(job.transpose_a, job.transpose_b),
                                        k::TypesName(item.ab_type, item.c_type)));
    }
    if (variant == nullptr) {
      return status::InvalidArgument("options.kernel", "unknown: " + job.kernel);
    }
    if (std::string why = k::CheckProblem(*variant, item); !why.empty()) {
      return status::InvalidArgument("options.kernel", where + variant->name + ": " + why);
    }
    *out = variant;
    return absl::OkStatus();
  };
  std::vector<k::GemmProblem> items;
  std::vector<const k::VariantInfo*> variants;
  auto choose_all = [&](bool t_form) -> absl::Status {
    items = make_items(t_form);
    variants.assign(items.size(), nullptr);
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string where = shape.Grouped() ? fmt::format("group[{}]: ", i) : "";
      if (absl::Status s = choose(items[i], where, &variants[i]); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  // Fused where every problem's variant takes alpha/beta itself, else the separate path (whose
  // refusal, if any, is the one reported).
  const bool fused = (!scaled || options_.fused_scale) && choose_all(/*t_form=*/false).ok();
  const bool separate_epilogue = scaled && !fused;
  if (!fused) {
    if (absl::Status s = choose_all(/*t_form=*/scaled); !s.ok()) return s;
  }
  // What the report names: the variant of the problem with the most work.
  const k::VariantInfo* variant =
      variants[std::max_element(item_flops.begin(), item_flops.end()) - item_flops.begin()];

  CUDA_TRY(slot, kEvent, cudaEventRecord(slot.start, slot.stream));
  // A batch's A and C_in are its members' rows.
  enum class Source { kJob, kMembersA, kMembersCIn };
  const bool stacked = batch != nullptr;
  for (auto [resident, here_already, dst, host, bytes, pinned, source] :
       {std::tuple{job.a_resident.get(), a_here, d_a, static_cast<const void*>(job.a), a_bytes,
                   job.pinned.a, stacked ? Source::kMembersA : Source::kJob},
        std::tuple{job.b_resident.get(), b_here, d_b, static_cast<const void*>(job.b), b_bytes,
                   job.pinned.b, Source::kJob},
        std::tuple{job.c_in_resident.get(), c_in_here, d_c_in, job.c_in, c_in_bytes,
                   job.pinned.c_in, stacked ? Source::kMembersCIn : Source::kJob}}) {
    if (here_already || bytes == 0) continue;
    if (source != Source::kJob) {
      if (absl::Status s =
              CopyRowsIn(slot, *batch->members, source == Source::kMembersCIn, shape.m, dst);
          !s.ok()) {
        return s;
      }
    } else if (resident != nullptr) {
      CUDA_TRY(slot, kCopyToDevice,
               cudaMemcpyPeerAsync(dst, device.ordinal, resident->data,
                                   devices_[resident->device_index]->ordinal, bytes, slot.stream));
    } else if (pinned) {
      CUDA_TRY(slot, kCopyToDevice,
               cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, slot.stream));
    } else if (absl::Status s = CopyToDevice(slot, dst, reinterpret_cast<const char*>(host), bytes);
               !s.ok()) {
      return s;
    }
  }
  CUDA_TRY(slot, kEvent, cudaEventRecord(slot.h2d_done, slot.stream));
  // The check's side that reads A, B and C_in runs beside the GEMM (slot.check_stream), or
  // before it where it reads C_in, which may be C's memory.
  const bool check_beside = job.beta == 0;
  cudaStream_t check_stream = check_beside ? slot.check_stream : slot.stream;
  std::vector<CheckItem> checks;
  std::vector<std::shared_ptr<const DeviceBSide>> b_sides;  // held until the check is done
  if (repetitions > 0) {
    // One problem whose B is resident here: its B side is kept with B (not for client memory,
    // which its owner may rewrite between GEMMs).
    const bool cache_b = b_here && problems.size() == 1 && !job.stay_on_device;
    float* floats = d_verify;
    if (check_beside) CUDA_TRY(slot, kEvent, cudaStreamWaitEvent(check_stream, slot.h2d_done, 0));
    // First every vector r, then the passes over B, A and C_in: the C pass on the GEMM's stream
    // reads the r's and waits for them alone (r_ready), not for the passes. Per check: the B
    // side kept with B, or one drawn here to keep (cache_b), or neither.
    struct BSideOf {
      verify::ResidentBCache<DeviceBSide>::Key key;
      std::shared_ptr<const DeviceBSide> kept;
      std::shared_ptr<DeviceBSide> drawn;
    };
    std::vector<BSideOf> sides;
    for (int rep = 0; rep < repetitions; ++rep) {
      size_t a_offset = 0, b_offset = 0, c_offset = 0;  // bytes
      for (size_t i = 0; i < problems.size(); ++i) {
        const ProblemDims& p = problems[i];
        CheckItem item{.form = verify::FormOf(job, p),
                       .a = d_a + a_offset,
                       .b = d_b + b_offset,
                       .c_in = d_c_in == nullptr ? nullptr : d_c_in + c_offset,
                       .c = d_c + c_offset,
                       .floats = floats,
                       .x = floats + p.n,
                       .repetition = rep,
                       .problem = i};
        a_offset += size_t(MatrixBytes(p.m, p.k, shape.ab_type));
        b_offset += size_t(MatrixBytes(p.k, p.n, shape.ab_type));
        c_offset += size_t(MatrixBytes(p.m, p.n, shape.c_type));
        floats += CheckItem::Floats(p);
        const verify::Form& f = item.form;
        std::shared_ptr<const DeviceBSide> kept;
        const verify::ResidentBCache<DeviceBSide>::Key key{
            .k = f.k, .n = f.n, .type = f.ab_type, .transposed = f.transpose_b, .repetition = rep};
        if (cache_b) kept = b_sides_.Find(job.b_resident, key);
        const uint64_t seed = kept ? kept->seed : verify::FreshSeed();
        CUDA_TRY(slot, kLaunch, LaunchGaussianVector(seed, f.n, item.r(), check_stream));
        BSideOf side{.key = key, .kept = kept};
        if (!kept && cache_b) {
          side.drawn = std::make_shared<DeviceBSide>();
          side.drawn->seed = seed;
        }
        checks.push_back(item);
        sides.push_back(std::move(side));
      }
    }
    CUDA_TRY(slot, kEvent, cudaEventRecord(slot.r_ready, check_stream));
    for (size_t c = 0; c < checks.size(); ++c) {
      CheckItem& item = checks[c];
      const verify::Form& f = item.form;
      std::shared_ptr<const DeviceBSide> kept = sides[c].kept;
      if (kept) {
        CUDA_TRY(slot, kEvent, cudaStreamWaitEvent(check_stream, kept->ready, 0));
      } else if (const std::shared_ptr<DeviceBSide>& side = sides[c].drawn) {
        CUDA_TRY(slot, kDeviceAlloc, cudaMalloc(&side->x, 2 * size_t(f.k) * sizeof(float)));
        CUDA_TRY(slot, kEvent, cudaEventCreateWithFlags(&side->ready, cudaEventDisableTiming));
        CUDA_TRY(slot, kLaunch,
                 LaunchVerifyMatVec(item.b, f.ab_type, f.k, f.n, f.transpose_b, item.r(), side->x,
                                    side->x + f.k, check_stream));
        CUDA_TRY(slot, kEvent, cudaEventRecord(side->ready, check_stream));
        b_sides_.Put(job.b_resident, sides[c].key, side);
        kept = side;
      } else {
        CUDA_TRY(slot, kLaunch,
                 LaunchVerifyMatVec(item.b, f.ab_type, f.k, f.n, f.transpose_b, item.r(),
                                    item.own_x(), item.b_sq(), check_stream));
      }
      if (kept) {  // its squares come back with the rest
        item.x = kept->x;
        CUDA_TRY(slot, kCopyToDevice,
                 cudaMemcpyAsync(item.b_sq(), kept->x + f.k, size_t(f.k) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, check_stream));
        b_sides.push_back(kept);
      }
      CUDA_TRY(slot, kLaunch,
               LaunchVerifyMatVec(item.a, f.ab_type, f.m, f.k, f.transpose_a, item.x, item.row(0),
                                  item.row(1), check_stream));
      if (f.beta != 0) {
        CUDA_TRY(slot, kLaunch,
                 LaunchVerifyMatVec(item.c_in, f.c_type, f.m, f.n, false, item.r(), item.row(2),
                                    item.row(3), check_stream));
      }
    }
    CUDA_TRY(slot, kEvent, cudaEventRecord(slot.verify_prepared, check_stream));
  }
  // A group runs as one launch (LaunchGrouped) when the variant of its largest problem takes
  // every problem, else one launch per problem with its own variant.
  const bool one_grouped_launch =
      shape.Grouped() && std::all_of(items.begin(), items.end(), [&](const k::GemmProblem& item) {
        return k::CheckProblem(*variant, item).empty();
      });
  for (size_t i = 0; i < (one_grouped_launch ? 1 : items.size()); ++i) {
    const k::VariantInfo& launched = one_grouped_launch ? *variant : *variants[i];
    const cudaError_t injected = HGEMM_CUDA(kLaunch, cudaSuccess);  // cudaSuccess in release
    if (std::string error = injected != cudaSuccess ? std::string("launch refused")
                            : one_grouped_launch
                                ? k::LaunchGrouped(launched, items, *slot.launch_context)
                                : k::Launch(launched, items[i], *slot.launch_context);
        !error.empty()) {
      cudaError_t e = injected != cudaSuccess ? injected : cudaPeekAtLastError();
      return Fail(slot, e == cudaSuccess ? cudaErrorUnknown : e,
                  fmt::format("kernel {}: {}", launched.name, error));
    }
  }
  if (separate_epilogue) {  // one epilogue over every problem's T: they are packed as C's are
    CUDA_TRY(slot, kLaunch,
             k::ScaleEpilogue(reinterpret_cast<const float*>(d_t), d_c_in, d_c, int64_t(c_elements),
                              job.alpha, job.beta, KernelType(shape.c_type), slot.stream));
  }
#ifdef HGEMM_FAULT_INJECTION
  if (auto after_launch = FaultInjector::Global().TakeAfterLaunch()) after_launch(slot.stream);
  if (auto corrupt = FaultInjector::Global().TakeCorruptOutput()) {
    corrupt(slot.stream, d_c, int64_t(c_bytes));
  }
#endif
  CUDA_TRY(slot, kEvent, cudaEventRecord(slot.kernel_done, slot.stream));
  // The check's C side, where the GEMM left C, before C leaves the device (once its r's are
  // drawn: a short GEMM can end before the side stream has run); then the side that ran beside
  // the GEMM is waited for.
  if (!checks.empty()) CUDA_TRY(slot, kEvent, cudaStreamWaitEvent(slot.stream, slot.r_ready, 0));
  for (const CheckItem& item : checks) {
    CUDA_TRY(slot, kLaunch,
             LaunchVerifyMatVec(item.c, item.form.c_type, item.form.m, item.form.n, false, item.r(),
                                item.row(4), item.row(5), slot.stream));
  }
  if (repetitions > 0) {
    CUDA_TRY(slot, kEvent, cudaStreamWaitEvent(slot.stream, slot.verify_prepared, 0));
    CUDA_TRY(slot, kEvent, cudaEventRecord(slot.verify_done, slot.stream));
  }
  double d2h_ms = 0;
  if (batch != nullptr) {
    // The check before any member's C leaves: a C that fails it reaches no sink.
    if (repetitions > 0) {
      CUDA_TRY(slot, kEvent, cudaEventSynchronize(slot.verify_done));
      if (absl::Status s = CheckOnHost(slot, checks, d_verify, verify_floats * repetitions,
                                       check_beside, report);
          !s.ok()) {
        return s;
      }
    }
    if (report->verify_failure.empty()) {
      if (absl::Status s = CopyRowsOut(slot, *batch, d_c, &d2h_ms); !s.ok()) return s;
    }
  } else if (c_on_device) {
    CUDA_TRY(slot, kEvent, WaitForKernel(slot, double(shape.Flops())));
  } else {
    absl::Status s = job.pinned.c ? CopyToPinnedHost(slot, reinterpret_cast<char*>(job.c), d_c,
                                                     c_bytes, job.c_progress, &d2h_ms)
                                  : CopyToHost(slot, reinterpret_cast<char*>(job.c), d_c, c_bytes,
                                               job.c_progress, &d2h_ms);
    if (!s.ok()) return s;
  }
  if (repetitions > 0 && batch == nullptr) {
    CUDA_TRY(slot, kEvent, cudaEventSynchronize(slot.verify_done));
    if (absl::Status s =
            CheckOnHost(slot, checks, d_verify, verify_floats * repetitions, check_beside, report);
        !s.ok()) {
      return s;
    }
  }
  float h2d_ms = 0, kernel_ms = 0;
  CUDA_TRY(slot, kEvent, cudaEventElapsedTime(&h2d_ms, slot.start, slot.h2d_done));
  // The GEMM starts after the check's first passes where they ran before it on this stream.
  const bool check_before = repetitions > 0 && !check_beside;
  CUDA_TRY(slot, kEvent,
           cudaEventElapsedTime(&kernel_ms, check_before ? slot.verify_prepared : slot.h2d_done,
                                slot.kernel_done));
  report->host_to_device_ms = h2d_ms;
  report->kernel_ms = kernel_ms;
  report->device_to_host_ms = d2h_ms;
  report->kernel = variant->name;
  report->accumulation = job.accumulation;
  report->device_id = device.ordinal;
  report->device_name = device.props.name;
  report->stream_id = slot.stream_id;
  return absl::OkStatus();
}

}  // namespace

#ifdef HGEMM_FAULT_INJECTION
std::unique_ptr<Backend> MakeFaultInjectingCudaBackend(const CudaBackendOptions& options,
                                                       std::string* error) {
#else
std::unique_ptr<Backend> MakeCudaBackend(const CudaBackendOptions& options, std::string* error) {
#endif
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    *error = e != cudaSuccess ? fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(e))
                              : "no CUDA device";
    return nullptr;
  }
  std::vector<int> ordinals = options.devices;
  if (ordinals.empty()) {
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  }
  for (int ordinal : ordinals) {
    if (ordinal < 0 || ordinal >= count) {
      *error = fmt::format("device {} does not exist ({} visible)", ordinal, count);
      return nullptr;
    }
  }
  auto backend = std::make_unique<CudaBackend>(options);
  if (std::string init_error = backend->Init(ordinals); !init_error.empty()) {
    *error = init_error;
    return nullptr;
  }
  return backend;
}

}  // namespace hgemm
