#include "server/backend/cuda_device.h"

#include <fmt/format.h>

namespace hgemm {

void* CudaAllocator::Allocate(int64_t bytes, std::string* error) {
  cudaSetDevice(ordinal_);
  void* data = nullptr;
  if (cudaError_t e = cudaMalloc(&data, bytes); e != cudaSuccess) {
    cudaGetLastError();
    *error = fmt::format("cudaMalloc({}): {}", bytes, cudaGetErrorString(e));
    return nullptr;
  }
  return data;
}

void CudaAllocator::Free(void* data) {
  cudaSetDevice(ordinal_);
  cudaFree(data);
}

std::string CudaDevice::Open(int ordinal, int device_index, double memory_fraction, int required_sm,
                             std::unique_ptr<CudaDevice>* out) {
  auto device = std::make_unique<CudaDevice>(ordinal);
  if (cudaError_t e = cudaGetDeviceProperties(&device->props, ordinal); e != cudaSuccess) {
    return fmt::format("cudaGetDeviceProperties({}): {}", ordinal, cudaGetErrorString(e));
  }
  const cudaDeviceProp& p = device->props;
  // The kernels are built arch-specific (sm_90a: tools/cuda.bzl), which runs on that major only.
  if (p.major * 10 + p.minor < required_sm || p.major != required_sm / 10) {
    return fmt::format("device {} ({}) is sm_{}{}; the kernels are built for sm_{}a", ordinal,
                       p.name, p.major, p.minor, required_sm);
  }
  cudaSetDevice(ordinal);
  // Waiting threads sleep instead of spinning: completion costs no CPU.
  if (cudaError_t e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
      e != cudaSuccess && e != cudaErrorSetOnActiveProcess) {
    return fmt::format("cudaSetDeviceFlags({}): {}", ordinal, cudaGetErrorString(e));
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    return fmt::format("cudaMemGetInfo({}): {}", ordinal, cudaGetErrorString(e));
  }
  device->memory = std::make_unique<DeviceMemory>(
      device_index, ordinal, int64_t(free_bytes * memory_fraction), &device->allocator);
  int clock_khz = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal);
      e != cudaSuccess) {
    return fmt::format("cudaDeviceGetAttribute(clock rate, {}): {}", ordinal,
                       cudaGetErrorString(e));
  }
  if (cudaError_t e =
          cudaDeviceGetAttribute(&device->sm_count, cudaDevAttrMultiProcessorCount, ordinal);
      e != cudaSuccess) {
    return fmt::format("cudaDeviceGetAttribute(SM count, {}): {}", ordinal, cudaGetErrorString(e));
  }
  constexpr double kSm90FlopsPerClockPerSm = 4096;  // dense fp16 wgmma, either accumulation
  device->peak_flops = kSm90FlopsPerClockPerSm * device->sm_count * clock_khz * 1e3;
  *out = std::move(device);
  return "";
}

}  // namespace hgemm
