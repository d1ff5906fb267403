// GemmServiceImpl: the gRPC transport of hgemm.v1.GemmService (callback API) over a core
// (GemmCoreInterface) that the server builds and owns; the service keeps no state of the
// core's, and a test may hand it a fake core.
//
// Handlers only translate, in the shape of TF Serving's PredictionServiceImpl: identify the
// caller, validate the message into a GemmOrder, hand it to the core with a completion
// callback, convert, finish. No handler waits for a device; completion callbacks (on scheduler
// and upload threads) finish the RPC or queue the stream's next writes. The streaming calls
// have their reactors in stream_reactor.h (GemmStream, over a StreamSession) and
// matrix_reactors.h (UploadMatrix over an UploadSession, DownloadMatrix), which see the service
// only through CallServices (call_services.h); the conversions to and from the wire are in
// convert.h.
#ifndef HGEMM_SERVER_TRANSPORT_GEMM_SERVICE_H_
#define HGEMM_SERVER_TRANSPORT_GEMM_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "proto/hgemm.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/metrics/metrics.h"
#include "server/resident/matrix_store.h"
#include "server/resident/region_store.h"
#include "server/scheduler/scheduler.h"
#include "server/session/bulk_grants.h"
#include "server/session/gemm_core.h"
#include "server/session/ring_executor.h"
#include "server/session/stream_session.h"
#include "server/transport/call_services.h"

namespace hgemm {

inline constexpr char kVersion[] = "0.1.0";

struct ServiceOptions {
  // The rules that requests are validated against; the core is given the same.
  RequestRules rules;
  // Size of the ResultChunks a stream sends back.
  int64_t stream_chunk_bytes = int64_t{1} << 20;
  // Operand bytes one stream, and all streams of one client (the core's limit), may hold for
  // GEMMs whose chunks are still arriving; a GEMM that would pass either is refused
  // (RESOURCE_EXHAUSTED).
  int64_t max_stream_pending_bytes = int64_t{4} << 30;
  int64_t max_client_pending_bytes = int64_t{8} << 30;
  // A streamed GEMM or an upload whose next chunk doesn't come for this long is refused with
  // DEADLINE_EXCEEDED and its buffers freed.
  std::chrono::seconds idle_timeout{60};
  // Idle host buffers the core keeps for the next streamed C or download (HostBufferPool).
  int64_t result_buffer_pool_bytes = int64_t{1} << 30;
  // Reported in GetServerInfo.limits.
  int64_t max_message_bytes = 0;
  SchedulerOptions scheduler;
  MatrixStoreOptions resident;
  // Same-host shared-memory regions (off unless allow_shared_memory).
  RegionStoreOptions regions;
  // Submission rings (AttachRing; they need shared memory allowed).
  RingOptions rings;
  // What the server around the service has, for GetServerInfo.features (HgemmServer sets them).
  bool tls = false;          // TLS on its TCP listeners
  bool unix_socket = false;  // a unix: listener
};

// The options of the core a service over `options` expects (server.cc builds it from them).
GemmCoreOptions CoreOptions(const ServiceOptions& options);

class GemmServiceImpl final : public v1::GemmService::CallbackService {
 public:
  // Serves the calls through `core` (built from the same options: CoreOptions). `core`,
  // `metrics` (null: none kept) and `authenticator` (null: authentication off) are not owned
  // and must outlive the service. Every call is identified first: an unauthenticated one gets
  // UNAUTHENTICATED; resident matrices, regions and quotas belong to the caller it names.
  GemmServiceImpl(GemmCoreInterface* core, ServiceOptions options,
                  ServiceMetrics* metrics = nullptr, const Authenticator* authenticator = nullptr);
  ~GemmServiceImpl() override;  // REQUIRES: no call in progress (the server has shut down)

  // Shutdown has begun (call before grpc::Server::Shutdown, which lets calls in until then):
  // every new call is refused at once with UNAVAILABLE (retry elsewhere); open streams refuse
  // new GEMMs with UNAVAILABLE, and each ends with UNAVAILABLE as soon as its in-flight work
  // is answered — at once if it is idle — instead of holding the drain until its deadline.
  // Returns once the calls let in before have handed their GEMMs on (Scheduler::Stats counts
  // them as admitted). Idempotent.
  void Drain();
  // The submission rings attached (for the metrics).
  RingRegistry& rings() { return rings_; }
  // OpenBulk grants lanes from `grants`, for the bulk listener on `port` of `host` (empty: the
  // host a call reached). Without it OpenBulk is refused. REQUIRES: called before serving;
  // `grants` outlives the service.
  void ServeBulk(BulkGrants* grants, int port, std::string host);

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
  grpc::ServerUnaryReactor* ReleaseMatrix(grpc::CallbackServerContext* context,
                                          const v1::ReleaseMatrixRequest* request,
                                          v1::ReleaseMatrixResponse* response) override;
  grpc::ServerUnaryReactor* ListMatrices(grpc::CallbackServerContext* context,
                                         const v1::ListMatricesRequest* request,
                                         v1::ListMatricesResponse* response) override;
  grpc::ServerWriteReactor<v1::ResultChunk>* DownloadMatrix(
      grpc::CallbackServerContext* context, const v1::DownloadMatrixRequest* request) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegionInfo* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;
  grpc::ServerUnaryReactor* CreateUpload(grpc::CallbackServerContext* context,
                                         const v1::UploadCreateRequest* request,
                                         v1::MatrixInfo* response) override;
  grpc::ServerWriteReactor<v1::RingEvent>* AttachRing(
      grpc::CallbackServerContext* context, const v1::AttachRingRequest* request) override;
  grpc::ServerUnaryReactor* BindRingSlots(grpc::CallbackServerContext* context,
                                          const v1::BindRingSlotsRequest* request,
                                          v1::RingSlots* response) override;
  grpc::ServerUnaryReactor* OpenBulk(grpc::CallbackServerContext* context,
                                     const v1::BulkRequest* request,
                                     v1::BulkGrant* response) override;
  // UploadMatrix and UploadPart are registered raw (ByteBuffer in and out: their chunks skip
  // protobuf's copy, lone_chunk.h) in place of the generated typed handlers, which are never
  // called.
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadMatrixRaw(grpc::CallbackServerContext* context,
                                                             grpc::ByteBuffer* response);
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadPartRaw(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response);

 private:
  // Lets a new call in and says who it is from; else the status to finish it with (counted and
  // logged here): UNAVAILABLE once the drain has begun (nothing of the call started), or the
  // authenticator's refusal. A call that starts GEMMs passes `pass` and holds it until its
  // handler has handed them on (to the core, or to its reactor); the drain waits for that.
  absl::Status Identify(Rpc rpc, const grpc::CallbackServerContext* context, Principal* caller,
                        CallGate::Pass* pass = nullptr) const;
  // A unary call answered at once: let in, then `answer` fills the response and says how the
  // call ends.
  template <typename Answer>
  grpc::ServerUnaryReactor* Unary(Rpc rpc, grpc::CallbackServerContext* context, Answer answer);
  // Gemm up to the core: OK once the GEMM is admitted and running (its callback answers the
  // call), else the status to answer with.
  absl::Status AdmitGemm(grpc::CallbackServerContext* context, const std::string& owner,
                         const v1::GemmRequest& request, v1::GemmResponse* response,
                         grpc::ServerUnaryReactor* reactor);

  const ServiceOptions options_;
  GemmCoreInterface* const core_;
  BulkGrants* bulk_grants_ = nullptr;  // null: no bulk channel
  int bulk_port_ = 0;
  std::string bulk_host_;
  const CallLog log_;
  const Authenticator no_authentication_;
  const Authenticator* const authenticator_;  // never null
  const StreamOptions stream_options_;
  mutable CallGate gate_;  // closed by Drain()
  TrackedCalls calls_{options_.idle_timeout};
  // Destroyed with the service, before the core: it waits for the ring threads, which use it.
  RingRegistry rings_{options_.rings};
  const CallServices call_services_{
      .core = core_, .log = &log_, .calls = &calls_, .stream = &stream_options_, .rings = &rings_};
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_GEMM_SERVICE_H_
