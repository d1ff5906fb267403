#include "server/backend/backend_factory.h"

#include <spdlog/spdlog.h>

namespace hgemm {

std::unique_ptr<Backend> CreateBackend(const BackendOptions& options, std::string* error) {
  if (options.kind == "cpu") return MakeCpuBackend(options.cpu);
  if (options.kind != "cuda" && options.kind != "auto") {
    *error = "--backend must be auto, cuda or cpu, not '" + options.kind + "'";
    return nullptr;
  }
  std::unique_ptr<Backend> cuda = MakeCudaBackend(options.cuda, error);
  if (cuda || options.kind == "cuda") return cuda;
  spdlog::info("no usable GPU ({}); using the CPU backend", *error);
  error->clear();
  return MakeCpuBackend(options.cpu);
}

}  // namespace hgemm
