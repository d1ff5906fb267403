// Alignment: sizes rounded up to an alignment (sub-buffers carved out of one device allocation
// start on kDeviceAlignment bytes, as cudaMalloc's own allocations do: what 16-byte vector loads
// and TMA need, with room to spare), and whether a pointer is 16-byte aligned.
// Thread safety: pure functions.
#ifndef HGEMM_KERNELS_ALIGN_H_
#define HGEMM_KERNELS_ALIGN_H_

#include <cstddef>
#include <cstdint>

namespace hgemm::kernels {

inline constexpr size_t kDeviceAlignment = 256;

// `bytes` rounded up to a multiple of `alignment`. REQUIRES: alignment a power of two, and
// bytes + alignment - 1 representable.
constexpr size_t AlignUp(size_t bytes, size_t alignment = kDeviceAlignment) {
  return (bytes + alignment - 1) & ~(alignment - 1);
}

// True if `p` is 16-byte aligned (what 16-byte vector loads and TMA need of an operand).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace hgemm::kernels

#endif  // HGEMM_KERNELS_ALIGN_H_
