// Test-only kernels: one that damages C (LaunchXorWord, through
// FaultInjector::ArmCorruptOutput), and one that makes a real sticky device fault: one thread
// writes to an address no allocation maps, which ends the kernel with cudaErrorIllegalAddress
// and leaves the device's CUDA context unusable for the rest of the process (every later call
// on it fails; through FaultInjector::ArmAfterLaunch, fault_injector.h).
// Thread safety: none needed (one launch each).
#ifndef HGEMM_SERVER_BACKEND_CUDA_FAULT_KERNEL_H_
#define HGEMM_SERVER_BACKEND_CUDA_FAULT_KERNEL_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace hgemm {

// Queues the faulting kernel on `stream`; returns the launch's own error (cudaSuccess: the
// fault comes later, asynchronously, at the next synchronizing call).
cudaError_t LaunchIllegalAddressWrite(cudaStream_t stream);

// Queues a kernel that XORs `mask` into the `word_bytes`-byte word (2 or 4) at `word` (device
// memory): a flipped bit of one element of C, as a faulty device would make it. Returns the
// launch's error.
cudaError_t LaunchXorWord(cudaStream_t stream, void* word, int word_bytes, uint32_t mask);

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CUDA_FAULT_KERNEL_H_
