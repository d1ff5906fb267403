// The server binary's logging: the core's log format (server/core/logging.h) and, in JSON,
// gRPC's own messages (gpr_log) routed through spdlog's default logger too, so that no line on
// the output is not JSON.
// Thread safety: call once at start, before other threads log.
#ifndef HGEMM_SERVER_TRANSPORT_GRPC_LOGGING_H_
#define HGEMM_SERVER_TRANSPORT_GRPC_LOGGING_H_

#include "server/core/logging.h"

namespace hgemm {

void InstallServerLogging(logging::Format format);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_GRPC_LOGGING_H_
