// Checks of CUDA runtime results, shared by the kernels' host code, the benchmarks and tests:
// one text for an error, one exit-on-error check for tools, one early return for functions that
// pass cudaError_t on.
//
// Plain C++17 over cuda_runtime.h (host compilers and nvcc include it alike).
// Thread safety: stateless.
#ifndef HGEMM_KERNELS_CUDA_CHECK_H_
#define HGEMM_KERNELS_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace hgemm::kernels {

// "what: cudaErrorMemoryAllocation (out of memory)": for error messages.
inline std::string CudaErrorText(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace hgemm::kernels

// For tools (benchmarks, diagnostics) where a CUDA failure ends the run: evaluates `expr` once;
// on an error prints file:line, the expression and the error to stderr and exits with status 1.
#define HGEMM_CHECK_CUDA(expr)                                          \
  do {                                                                  \
    if (const cudaError_t hgemm_e_ = (expr); hgemm_e_ != cudaSuccess) { \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(hgemm_e_));                       \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

// In a function returning cudaError_t: evaluates `expr` once and returns its error, if any.
#define HGEMM_RETURN_IF_CUDA_ERROR(expr)                                               \
  do {                                                                                 \
    if (const cudaError_t hgemm_e_ = (expr); hgemm_e_ != cudaSuccess) return hgemm_e_; \
  } while (0)

#endif  // HGEMM_KERNELS_CUDA_CHECK_H_
