// Rounding sizes up to an alignment: sub-buffers carved out of one device allocation start on
// kDeviceAlignment bytes, as cudaMalloc's own allocations do (what 16-byte vector loads and TMA
// need, with room to spare).
// Thread safety: constexpr functions.
#ifndef HGEMM_KERNELS_ALIGN_H_
#define HGEMM_KERNELS_ALIGN_H_

#include <cstddef>

namespace hgemm::kernels {

inline constexpr size_t kDeviceAlignment = 256;

// `bytes` rounded up to a multiple of `alignment`. REQUIRES: alignment a power of two, and
// bytes + alignment - 1 representable.
constexpr size_t AlignUp(size_t bytes, size_t alignment = kDeviceAlignment) {
  return (bytes + alignment - 1) & ~(alignment - 1);
}

}  // namespace hgemm::kernels

#endif  // HGEMM_KERNELS_ALIGN_H_
