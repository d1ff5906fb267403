#include "server/backend/cuda_slot.h"

#include <fmt/format.h>

#include "server/backend/cuda_errors.h"

namespace hgemm {

std::string CudaSlot::Init(int staging_buffers, int64_t staging_piece_bytes,
                           int64_t preallocate_bytes) {
  const int ordinal = device->ordinal;
  std::string error = CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), ordinal,
                                "cudaStreamCreate");
  if (error.empty()) {
    error = CheckCuda(cudaStreamCreateWithFlags(&check_stream, cudaStreamNonBlocking), ordinal,
                      "cudaStreamCreate");
  }
  for (cudaEvent_t* e : {&start, &h2d_done, &kernel_done, &d2h_done, &verify_prepared, &verify_done,
                         &r_ready, &rows_out_start}) {
    if (error.empty()) {
      error =
          CheckCuda(cudaEventCreateWithFlags(e, cudaEventBlockingSync), ordinal, "cudaEventCreate");
    }
  }
  if (error.empty()) error = staging.Init(staging_buffers, staging_piece_bytes, stream, ordinal);
  if (error.empty() && !device->memory->Reserve(preallocate_bytes)) {
    error =
        fmt::format("device {}: --preallocate_bytes_per_stream passes the memory budget", ordinal);
  }
  if (error.empty()) {
    error = CheckCuda(cudaMalloc(&device_buffer, preallocate_bytes), ordinal, "cudaMalloc");
    if (error.empty()) device_capacity = preallocate_bytes;
  }
  if (error.empty()) launch_context = std::make_unique<kernels::LaunchContext>(stream);
  return error;
}

CudaSlot::~CudaSlot() {
  cudaSetDevice(device->ordinal);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  if (check_stream != nullptr) cudaStreamSynchronize(check_stream);
  launch_context.reset();  // before the stream it is bound to
  cudaFree(device_buffer);
  device->memory->Unreserve(device_capacity);
  for (cudaEvent_t e : {start, h2d_done, kernel_done, d2h_done, verify_prepared, verify_done,
                        r_ready, rows_out_start}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (check_stream != nullptr) cudaStreamDestroy(check_stream);
  // The staging ring frees itself after this: nothing is in flight once the stream has
  // synchronized.
}

}  // namespace hgemm
