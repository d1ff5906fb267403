#include "server/backend/cuda_fault_kernel.h"

#include <cstdint>

namespace hgemm {
namespace {

// `target` comes from the host at run time, so the compiler cannot drop the store.
__global__ void WriteToUnmappedAddress(volatile int* target) { *target = 0x0BAD; }

__global__ void XorWord(void* word, int word_bytes, uint32_t mask) {
  if (word_bytes == 2) {
    *static_cast<uint16_t*>(word) ^= uint16_t(mask);
  } else {
    *static_cast<uint32_t*>(word) ^= mask;
  }
}

}  // namespace

cudaError_t LaunchIllegalAddressWrite(cudaStream_t stream) {
  // The top of the 64-bit address space: never mapped by the CUDA allocator.
  auto* target = reinterpret_cast<volatile int*>(~uintptr_t{0} & ~uintptr_t{0xFFF});
  WriteToUnmappedAddress<<<1, 1, 0, stream>>>(target);
  return cudaGetLastError();
}

cudaError_t LaunchXorWord(cudaStream_t stream, void* word, int word_bytes, uint32_t mask) {
  XorWord<<<1, 1, 0, stream>>>(word, word_bytes, mask);
  return cudaGetLastError();
}

}  // namespace hgemm
