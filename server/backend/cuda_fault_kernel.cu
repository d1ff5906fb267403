#include "server/backend/cuda_fault_kernel.h"

#include <cstdint>

namespace hgemm {
namespace {

// `target` comes from the host at run time, so the compiler cannot drop the store.
__global__ void WriteToUnmappedAddress(volatile int* target) { *target = 0x0BAD; }

}  // namespace

cudaError_t LaunchIllegalAddressWrite(cudaStream_t stream) {
  // The top of the 64-bit address space: never mapped by the CUDA allocator.
  auto* target = reinterpret_cast<volatile int*>(~uintptr_t{0} & ~uintptr_t{0xFFF});
  WriteToUnmappedAddress<<<1, 1, 0, stream>>>(target);
  return cudaGetLastError();
}

}  // namespace hgemm
