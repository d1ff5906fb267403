// ASSERT_CUDA(expr): a GoogleTest fatal assertion that a CUDA runtime call returned cudaSuccess,
// naming the call and CUDA's error text otherwise. For the kernel tests.
#ifndef HGEMM_KERNELS_ASSERT_CUDA_H_
#define HGEMM_KERNELS_ASSERT_CUDA_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#define ASSERT_CUDA(expr)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

#endif  // HGEMM_KERNELS_ASSERT_CUDA_H_
