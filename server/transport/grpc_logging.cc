#include "server/transport/grpc_logging.h"

#include <fmt/format.h>
#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

#include <string>

namespace hgemm {
namespace {

// gRPC's own messages, as lines of the default logger.
void GrpcToSpdlog(gpr_log_func_args* args) {
  if (spdlog::default_logger_raw() == nullptr) return;  // after spdlog::shutdown()
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::err
      : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                : spdlog::level::debug;
  const std::string source = fmt::format("grpc {}:{}", args->file, args->line);
  logging::Log(level, args->message, {{"source", source}});
}

}  // namespace

void InstallServerLogging(logging::Format format) {
  logging::Install(format);
  if (format == logging::Format::kJson) gpr_set_log_function(GrpcToSpdlog);
}

}  // namespace hgemm
