// Device helpers shared by the kernel families: predicated cp.async copies, the block-swizzle
// mapping and small integer helpers. Device code only; included by .cu files.
//
// Thread safety: stateless device functions.
#ifndef HGEMM_KERNELS_CP_ASYNC_CUH_
#define HGEMM_KERNELS_CP_ASYNC_CUH_

#include <cuda_fp16.h>
#include <cstdint>

namespace hgemm::kernels::detail {

constexpr int kWarpSize = 32;

__host__ __device__ constexpr int DivCeil(int a, int b) { return (a + b - 1) / b; }

// Copies 16 bytes from global `src` to shared `dst` asynchronously, bypassing L1 (.cg).
// When `valid` is false nothing is read (src-size 0) and the 16 destination bytes are zero-filled,
// so tiles that hang over the matrix edge contribute zeros to the dot products.
// REQUIRES: dst 16-byte aligned; src 16-byte aligned whenever valid (any address otherwise).
__device__ __forceinline__ void CpAsync16ZeroFill(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Block swizzle (as in the reference): the launcher splits the N tiles into gridDim.z bands of
// gridDim.x tiles each; blocks are issued x-fastest, so consecutive blocks sweep one band down
// all M tiles and share its B columns in L2. Returns the N-tile index of this block; it may be
// past the last tile in the final band (the caller skips such blocks as a whole).
template <bool BLOCK_SWIZZLE>
__device__ __forceinline__ int BlockTileN() {
  return BLOCK_SWIZZLE ? static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x)
                       : static_cast<int>(blockIdx.x);
}

// Grid for a BM x BN tiling of an M x N output; with swizzle, bands of `swizzle_stride` columns.
// REQUIRES: swizzle_stride is a positive multiple of BN when swizzle is on.
inline dim3 TileGrid(int m, int n, int bm, int bn, bool swizzle, int swizzle_stride) {
  const int tiles_n = DivCeil(n, bn);
  const int tiles_m = DivCeil(m, bm);
  if (!swizzle) return dim3(tiles_n, tiles_m, 1);
  const int bands = DivCeil(n, swizzle_stride);
  return dim3(DivCeil(tiles_n, bands), tiles_m, bands);
}

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_CP_ASYNC_CUH_
