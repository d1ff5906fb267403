#include "server/backend/backend_factory.h"

#include <spdlog/spdlog.h>

#ifdef HGEMM_FAULT_INJECTION
#include "server/backend/fault_injector.h"
#endif

namespace hgemm {

std::unique_ptr<Backend> CreateBackend(const BackendOptions& options, std::string* error) {
  if (options.kind == "cpu") return MakeCpuBackend(options.cpu);
  if (options.kind != "cuda" && options.kind != "auto") {
    *error = "--backend must be auto, cuda or cpu, not '" + options.kind + "'";
    return nullptr;
  }
#ifdef HGEMM_FAULT_INJECTION
  // hgemm_server_fault_injection (testonly): the CUDA backend with its fault-injection sites.
  std::unique_ptr<Backend> cuda = MakeFaultInjectingCudaBackend(options.cuda, error);
  if (cuda) {
    if (std::string armed = FaultInjector::Global().ArmFromEnvironment(); !armed.empty()) {
      spdlog::warn("fault injection armed: {}", armed);
    }
  }
#elif defined(HGEMM_WITH_CUDA)
  std::unique_ptr<Backend> cuda = MakeCudaBackend(options.cuda, error);
#else
  *error = "this server was built without CUDA (no toolkit at build time)";
  std::unique_ptr<Backend> cuda;
#endif
  if (cuda || options.kind == "cuda") return cuda;
  spdlog::info("no usable GPU ({}); using the CPU backend", *error);
  error->clear();
  return MakeCpuBackend(options.cpu);
}

}  // namespace hgemm
