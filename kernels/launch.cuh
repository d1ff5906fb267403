// Host helpers shared by the kernel families' launchers (wmma_stage.cuh, mma_stage.cuh,
// wgmma_variants.cu) and the auto choice (auto_tune.cu): the opt-in to more than 48 KB of
// dynamic shared memory, once per device, the device's SM count, and the launch of a kernel
// with one block per BM x BN tile of C.
//
// Thread safety: may be called from any thread.
#ifndef HGEMM_KERNELS_LAUNCH_CUH_
#define HGEMM_KERNELS_LAUNCH_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/cuda_check.h"

namespace hgemm::kernels::detail {

// Lets `kKernel` launch with `smem_bytes` of dynamic shared memory on `device` (the current
// one). A kernel must opt in per device to use more than 48 KB; the first launch on each device
// sets the attribute and later ones skip it (devices past 63 set it on every launch). Two
// threads racing on a first launch both set it, which is harmless. Returns the CUDA error of
// cudaFuncSetAttribute.
template <auto kKernel>
cudaError_t OptInDynamicSmem(int device, size_t smem_bytes) {
  static std::atomic<uint64_t> opted_in{0};  // devices with the opt-in done
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (opted_in.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  HGEMM_RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(
      kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
  opted_in.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

// The multiprocessor count of `device` in *count (persistent grids, wave-size heuristics),
// cached per device (devices past 63 are asked every time). Returns the CUDA error of asking.
inline cudaError_t SmCount(int device, int* count) {
  static std::atomic<int> cached[64] = {};
  if (device < 64 && (*count = cached[device].load(std::memory_order_relaxed)) > 0)
    return cudaSuccess;
  HGEMM_RETURN_IF_CUDA_ERROR(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device));
  if (device < 64) cached[device].store(*count, std::memory_order_relaxed);
  return cudaSuccess;
}

// Enqueues `kKernel`(A, B, C, M, N, K) on `stream` with one block of `threads` per BM x BN tile
// of C (TileGrid; with `swizzle`, in bands of `swizzle_stride` columns) and `dynamic_smem_bytes`
// of dynamic shared memory (opted in already if over 48 KB). Returns cudaErrorInvalidValue for
// a swizzle_stride that is not a positive multiple of BN, else the launch's error.
template <auto kKernel>
cudaError_t LaunchTiled(int bm, int bn, int threads, size_t dynamic_smem_bytes, bool swizzle,
                        int swizzle_stride, const half* A, const half* B, half* C, int M, int N,
                        int K, cudaStream_t stream) {
  if (swizzle && (swizzle_stride <= 0 || swizzle_stride % bn != 0)) return cudaErrorInvalidValue;
  const dim3 grid = TileGrid(M, N, bm, bn, swizzle, swizzle_stride);
  kKernel<<<grid, threads, dynamic_smem_bytes, stream>>>(A, B, C, M, N, K);
  return cudaGetLastError();
}

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_LAUNCH_CUH_
