// The CUDA backend: GEMMs on NVIDIA GPUs with the kernels of //kernels.
//
// Each device gets `streams_per_device` execution slots. A slot owns a CUDA stream, device
// buffers for A, B and C (grown on demand, never shrunk: a steady stream of shapes allocates
// nothing), a small ring of pinned host buffers through which operands and results are staged
// piece by piece (host copies overlap the DMA), and timing events (CudaSlot, cuda_slot.h, with
// its PinnedStagingRing). Resident matrices and kept results come from a per-device cache of
// freed buffers, within the device's memory budget (DeviceMemory, device_memory.h; the device
// itself: CudaDevice, cuda_device.h); their uploads and downloads are staged through pinned
// rings too, each lent with a stream of its own to one copy at a time (as many as copy at once).
// Slots of one device run concurrently, so one request's copies overlap another's kernel. A
// scheduler's batch (Backend::RunBatch) runs as one GEMM on a slot whose members' rows are
// copied straight between their own memory (host, pinned or device) and the slot's buffers,
// with no gather or scatter pass through host memory. A device is used if it has the compute
// capability every registry variant needs (VariantInfo::min_sm).
// Thread safety: see Backend.
#ifndef HGEMM_SERVER_BACKEND_CUDA_BACKEND_H_
#define HGEMM_SERVER_BACKEND_CUDA_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/backend/backend.h"

namespace hgemm {

struct CudaBackendOptions {
  // CUDA device ordinals to use; empty means every visible device.
  std::vector<int> devices;
  // Execution slots (CUDA streams) per device.
  int streams_per_device = 4;
  // Device bytes each stream allocates at start for A, B and C together (grown on demand).
  int64_t preallocate_bytes_per_stream = int64_t{96} << 20;
  // Share of each device's free memory (at start) that the streams' buffers may use; each
  // stream gets an equal part, which bounds the largest GEMM (RESOURCE_EXHAUSTED beyond).
  double device_memory_fraction = 0.8;
  // Size of each pinned staging buffer; `staging_buffers` of them per stream and direction.
  int64_t staging_piece_bytes = int64_t{8} << 20;
  int staging_buffers = 3;
  // Waiting for a kernel whose C stays resident: sleep through the time the kernel needs at
  // the device's peak rate, then poll for up to this long before the blocking wait, whose
  // wake-up comes ~0.08 ms late on the H200 (docs/results/h200/completion_latency.md).
  // 0 = always the blocking wait.
  std::chrono::microseconds completion_spin{1000};
  // alpha/beta applied inside the kernels that can (fused_scale variants) instead of a second
  // pass over an fp32 T: on an H100 the fused epilogue ran at 0.99-1.18x cuBLAS against
  // 0.80-0.87x for the separate pass at 2048³-8192³ (docs/kernels_notes.md).
  bool fused_scale = true;
};

// Returns nullptr and sets *error when no usable device is present (no driver, no GPU, or a
// GPU the kernels were not built for).
std::unique_ptr<Backend> MakeCudaBackend(const CudaBackendOptions& options, std::string* error);

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CUDA_BACKEND_H_
