// GemmServiceImpl: the gRPC transport of hgemm.v1.GemmService (callback API).
//
// Handlers only translate: validate a message into a GemmJob, hand it to the Scheduler with a
// completion callback, and return. No handler blocks or touches a device; completion
// callbacks (on scheduler workers) finish the RPC or queue the stream's next writes.
#ifndef HGEMM_SERVER_GEMM_SERVICE_H_
#define HGEMM_SERVER_GEMM_SERVICE_H_

#include <cstdint>
#include <string>

#include "proto/hgemm.grpc.pb.h"
#include "server/backend/backend.h"
#include "server/scheduler/scheduler.h"
#include "server/validation.h"

namespace hgemm {

inline constexpr char kVersion[] = "0.1.0";

struct ServiceOptions {
  RequestRules rules;
  // Size of the ResultChunks a stream sends back.
  int64_t stream_chunk_bytes = int64_t{1} << 20;
  // Operand bytes one stream may hold for GEMMs whose chunks are still arriving.
  int64_t max_stream_pending_bytes = int64_t{8} << 30;
  // Reported in GetServerInfo.limits.
  int64_t max_message_bytes = 0;
  SchedulerOptions scheduler;
};

class GemmServiceImpl final : public v1::GemmService::CallbackService {
 public:
  // `scheduler` and `backend` must outlive the service.
  GemmServiceImpl(Scheduler* scheduler, const Backend* backend, ServiceOptions options);

  grpc::ServerUnaryReactor* Gemm(grpc::CallbackServerContext* context,
                                 const v1::GemmRequest* request,
                                 v1::GemmResponse* response) override;
  grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>* GemmStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListKernels(grpc::CallbackServerContext* context,
                                        const v1::ListKernelsRequest* request,
                                        v1::ListKernelsResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;

 private:
  friend class GemmStreamReactor;

  Scheduler* const scheduler_;
  const Backend* const backend_;
  const ServiceOptions options_;
};

// Fills the proto's timing and execution from a backend's report.
void ToProto(const GemmShape& shape, const GemmReport& report, v1::Timing* timing,
             v1::Execution* execution);

}  // namespace hgemm

#endif  // HGEMM_SERVER_GEMM_SERVICE_H_
