#include "server/backend/cuda_errors.h"

#include <fmt/format.h>

namespace hgemm {

bool IsStickyError(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
      return true;
    default:
      return false;
  }
}

std::string CheckCuda(cudaError_t e, int ordinal, const char* what) {
  return e == cudaSuccess ? std::string()
                          : fmt::format("device {}: {}: {}", ordinal, what, cudaGetErrorString(e));
}

}  // namespace hgemm
