// CudaDevice: one CUDA device as the backend uses it: what it is (properties, SM count, peak
// rate), whether it is still usable, and its memory (budget and resident-buffer cache, through
// cudaMalloc / cudaFree). Opened once at backend start.
// Thread safety: the fields are set by Open and then read-only, but for `healthy` (atomic) and
// `memory` (thread-safe).
#ifndef HGEMM_SERVER_BACKEND_CUDA_DEVICE_H_
#define HGEMM_SERVER_BACKEND_CUDA_DEVICE_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "server/backend/device_memory.h"

namespace hgemm {

// cudaMalloc / cudaFree on one device. Thread-safe.
class CudaAllocator final : public DeviceAllocator {
 public:
  explicit CudaAllocator(int ordinal) : ordinal_(ordinal) {}
  void* Allocate(int64_t bytes, std::string* error) override;
  void Free(void* data) override;

 private:
  const int ordinal_;
};

struct CudaDevice {
  // Opens device `ordinal` as Devices() index `device_index`: checks that the kernels run on it
  // (its compute capability against `required_sm`, major*10+minor), makes waiting threads sleep
  // instead of spin, and gives `memory_fraction` of its free memory to the budget. Returns ""
  // and sets *device, or why not.
  static std::string Open(int ordinal, int device_index, double memory_fraction, int required_sm,
                          std::unique_ptr<CudaDevice>* device);

  explicit CudaDevice(int ordinal) : ordinal(ordinal), allocator(ordinal) {}
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const int ordinal;
  cudaDeviceProp props{};
  int sm_count = 0;  // streaming multiprocessors, read from the device
  // Dense fp16 tensor-core FLOP/s at the maximum clock: no GEMM finishes sooner than this says.
  double peak_flops = 0;
  std::atomic<bool> healthy{true};
  CudaAllocator allocator;
  // The slots' buffers and resident matrices, together. After `allocator`: it frees through it.
  std::unique_ptr<DeviceMemory> memory;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CUDA_DEVICE_H_
