// CudaSlot: one execution slot of the CUDA backend: a CUDA stream with its launch context,
// its device buffer for A | B | C (grown on demand, never shrunk; counted in the device's
// budget), its pinned staging ring and its timing events. Owns all of them and tears them down
// on destruction (after the stream has finished its work).
// Thread safety: none; used by one scheduler worker at a time.
#ifndef HGEMM_SERVER_BACKEND_CUDA_SLOT_H_
#define HGEMM_SERVER_BACKEND_CUDA_SLOT_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/registry.h"
#include "server/backend/cuda_device.h"
#include "server/backend/pinned_staging_ring.h"

namespace hgemm {

struct CudaSlot {
  // Slot `stream_id` of `device`. REQUIRES: `device` outlives the slot.
  CudaSlot(CudaDevice* device, int stream_id) : device(device), stream_id(stream_id) {}
  // Synchronizes the stream, then frees what the slot owns and gives its buffer's bytes back to
  // the device's budget.
  ~CudaSlot();
  CudaSlot(const CudaSlot&) = delete;
  CudaSlot& operator=(const CudaSlot&) = delete;

  // Creates the stream, events and staging ring and allocates `preallocate_bytes` of device
  // buffer. Returns "" or the first failure. REQUIRES: the device is current.
  std::string Init(int staging_buffers, int64_t staging_piece_bytes, int64_t preallocate_bytes);

  CudaDevice* const device;
  const int stream_id;
  cudaStream_t stream = nullptr;
  // Where the passes of a Freivalds check that read no C (r, op(B)·r, op(A)·x) run while the
  // GEMM runs on `stream`: memory-bound work beside a compute-bound kernel, off its critical
  // path. Waits for `h2d_done`; `stream` waits for its `verify_prepared` before the C side ends.
  cudaStream_t check_stream = nullptr;
  std::unique_ptr<kernels::LaunchContext> launch_context;  // bound to `stream`
  char* device_buffer = nullptr;                           // A | B | C, each 256-byte aligned
  size_t device_capacity = 0;  // bytes of device_buffer, claimed in the device's budget
  PinnedStagingRing staging;
  cudaEvent_t start = nullptr, h2d_done = nullptr, kernel_done = nullptr, d2h_done = nullptr;
  // Around the passes of a Freivalds check (GemmJob::verify_repetitions): after those that
  // read no C (on check_stream, or before the GEMM on `stream` where C_in is read: it may be
  // C's memory), after those that read C.
  cudaEvent_t verify_prepared = nullptr, verify_done = nullptr;
  // On check_stream once the check's vectors r are drawn: the C pass on `stream` reads them.
  cudaEvent_t r_ready = nullptr;
  // Recorded before a batch's rows of C leave for the members' sinks (after the batch's
  // check, which may come between its kernel and its copies): where its D2H time starts.
  cudaEvent_t rows_out_start = nullptr;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CUDA_SLOT_H_
