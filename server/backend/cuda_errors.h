// What CUDA errors mean to the backend: which ones leave a device unusable, and their text in
// setup messages.
// Thread safety: pure functions.
#ifndef HGEMM_SERVER_BACKEND_CUDA_ERRORS_H_
#define HGEMM_SERVER_BACKEND_CUDA_ERRORS_H_

#include <cuda_runtime.h>

#include <string>

namespace hgemm {

// Errors after which the CUDA context is unusable: every later call on the device fails.
bool IsStickyError(cudaError_t e);

// "" on cudaSuccess, else "device <ordinal>: <what>: <error text>".
std::string CheckCuda(cudaError_t e, int ordinal, const char* what);

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CUDA_ERRORS_H_
