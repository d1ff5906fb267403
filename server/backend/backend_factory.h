// Picks and creates the backend named by --backend: "cuda", "cpu", or "auto" (CUDA when a
// usable GPU is present, the CPU otherwise).
#ifndef HGEMM_SERVER_BACKEND_BACKEND_FACTORY_H_
#define HGEMM_SERVER_BACKEND_BACKEND_FACTORY_H_

#include <memory>
#include <string>

#include "server/backend/backend.h"
#include "server/backend/cpu_backend.h"
#include "server/backend/cuda_backend.h"

namespace hgemm {

struct BackendOptions {
  std::string kind = "auto";  // auto | cuda | cpu
  CpuBackendOptions cpu;
  CudaBackendOptions cuda;
};

// Returns nullptr and sets *error when the requested backend can't be created (e.g. "cuda"
// without a GPU).
std::unique_ptr<Backend> CreateBackend(const BackendOptions& options, std::string* error);

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_BACKEND_FACTORY_H_
