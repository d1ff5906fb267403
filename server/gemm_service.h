// GemmServiceImpl: the gRPC transport of hgemm.v1.GemmService (callback API).
//
// Handlers only translate: validate a message into a GemmJob, hand it to the Scheduler with a
// completion callback (and streamed bytes, allocations and downloads to the UploadQueue), and
// return. No handler waits for a device; completion callbacks (on scheduler and upload
// threads) finish the RPC or queue the stream's next writes.
// The unary handlers are here (gemm_service.cc); the streaming calls have their reactors in
// stream_reactor.h (GemmStream, over its StreamSession: stream_session.h) and matrix_reactors.h (UploadMatrix, DownloadMatrix); the
// conversions to and from the wire are in convert.h.
#ifndef HGEMM_SERVER_GEMM_SERVICE_H_
#define HGEMM_SERVER_GEMM_SERVICE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "proto/hgemm.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/backend/backend.h"
#include "server/host_buffer_pool.h"
#include "server/metrics.h"
#include "server/resident/matrix_store.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/upload_queue.h"
#include "server/session/resident_resolver.h"
#include "server/stream_session.h"
#include "server/validation.h"

namespace hgemm {

inline constexpr char kVersion[] = "0.1.0";

struct ServiceOptions {
  RequestRules rules;
  // Size of the ResultChunks a stream sends back.
  int64_t stream_chunk_bytes = int64_t{1} << 20;
  // Operand bytes one stream, and all streams of one client, may hold for GEMMs whose chunks
  // are still arriving; a GEMM that would pass either is refused (RESOURCE_EXHAUSTED).
  int64_t max_stream_pending_bytes = int64_t{4} << 30;
  int64_t max_client_pending_bytes = int64_t{8} << 30;
  // A streamed GEMM or an upload whose next chunk doesn't come for this long is refused with
  // DEADLINE_EXCEEDED and its buffers freed.
  std::chrono::seconds idle_timeout{60};
  // Idle host buffers kept for the next streamed C or download (see HostBufferPool).
  int64_t result_buffer_pool_bytes = int64_t{1} << 30;
  // Reported in GetServerInfo.limits.
  int64_t max_message_bytes = 0;
  SchedulerOptions scheduler;
  MatrixStoreOptions resident;
};

class GemmServiceImpl final : public v1::GemmService::CallbackService {
 public:
  // `scheduler`, `backend`, `store`, `uploads`, `metrics` (null: none kept) and
  // `authenticator` (null: authentication off) must outlive the service. Every call is
  // identified first: an unauthenticated one gets UNAUTHENTICATED; resident matrices and
  // quotas belong to the caller it names.
  GemmServiceImpl(Scheduler* scheduler, Backend* backend, MatrixStore* store,
                  UploadQueue* uploads, ServiceOptions options, ServiceMetrics* metrics = nullptr,
                  const Authenticator* authenticator = nullptr);
  ~GemmServiceImpl() override;  // REQUIRES: no call in progress (the server has shut down)

  // Shutdown has begun (call before grpc::Server::Shutdown): open streams refuse new GEMMs
  // with UNAVAILABLE, and each ends with UNAVAILABLE as soon as its in-flight work is
  // answered — at once if it is idle — instead of holding the drain until its deadline.
  void Drain();

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
  grpc::ServerReadReactor<v1::UploadMatrixRequest>* UploadMatrix(
      grpc::CallbackServerContext* context, v1::MatrixInfo* response) override;
  grpc::ServerUnaryReactor* ReleaseMatrix(grpc::CallbackServerContext* context,
                                          const v1::ReleaseMatrixRequest* request,
                                          v1::ReleaseMatrixResponse* response) override;
  grpc::ServerUnaryReactor* ListMatrices(grpc::CallbackServerContext* context,
                                         const v1::ListMatricesRequest* request,
                                         v1::ListMatricesResponse* response) override;
  grpc::ServerWriteReactor<v1::ResultChunk>* DownloadMatrix(
      grpc::CallbackServerContext* context, const v1::DownloadMatrixRequest* request) override;

 private:
  friend class GemmStreamReactor;
  friend class UploadMatrixReactor;
  friend class DownloadMatrixReactor;

  // A streaming call the service keeps track of, for Drain() and the idle timeout.
  class TrackedCall {
   public:
    virtual ~TrackedCall() = default;
    virtual void Drain() = 0;
    // Refuses what has waited for a chunk since before `cutoff`.
    virtual void ExpireIdle(Clock::time_point cutoff) = 0;
  };
  // Calls register when created and unregister in OnDone, before they are deleted. A call
  // registered after Drain() is drained at once.
  void Track(TrackedCall* call);
  void Untrack(TrackedCall* call);
  void ExpireIdleCalls();  // the janitor thread

  // Every call, and every GEMM of a stream (`gemm_id` set), is answered through here just
  // before its Finish (or GemmDone write): counted in the metrics and, unless OK, logged at
  // info with the status name, message, request id, caller ("" before it is known) and peer.
  // REQUIRES: `context` is alive.
  void Answered(Rpc rpc, const absl::Status& s, const grpc::CallbackServerContext* context,
                std::string_view caller, std::string_view request_id = {},
                std::optional<uint64_t> gemm_id = std::nullopt) const;
  // A GemmStream call ends with `s` (its GEMMs were counted by Answered).
  void StreamEnded(const absl::Status& s, const grpc::CallbackServerContext* context,
                   std::string_view caller) const;
  // Who `context`'s call is from; if nobody authenticated, the status to finish it with (the
  // refusal is counted and logged here).
  absl::Status Identify(Rpc rpc, const grpc::CallbackServerContext* context,
                        Principal* caller) const;

  // Gemm's work up to the scheduler: OK once the job is admitted (its callback answers the
  // call), else the status to answer with.
  absl::Status AdmitGemm(grpc::CallbackServerContext* context, const std::string& owner,
                         const v1::GemmRequest& request,
                         v1::GemmResponse* response, grpc::ServerUnaryReactor* reactor);

  // Registers a kept C under its quota reservation and describes it.
  void KeepResult(QuotaReservation c_quota, const GemmShape& shape, const GemmReport& report,
                  uint32_t ttl_seconds, v1::MatrixInfo* info) const;
  void Describe(const ResidentMatrix& matrix, v1::MatrixInfo* info) const;

  Scheduler* const scheduler_;
  Backend* const backend_;
  MatrixStore* const store_;
  UploadQueue* const uploads_;
  const ResidentResolver resolver_;
  const ServiceOptions options_;
  ServiceMetrics* const metrics_;  // may be null
  const Authenticator no_authentication_;
  const Authenticator* const authenticator_;  // never null
  mutable HostBufferPool result_buffers_{options_.result_buffer_pool_bytes};
  ClientPendingBudget client_pending_{options_.max_client_pending_bytes};
  const StreamServices stream_services_;  // what every GemmStream's session works with

  std::mutex calls_mu_;  // before any call's own mutex
  std::set<TrackedCall*> calls_;  // guarded by calls_mu_
  bool draining_ = false;         // guarded by calls_mu_
  bool stopping_ = false;         // guarded by calls_mu_; ends the janitor
  std::condition_variable janitor_wake_;

  std::thread janitor_;  // last: it starts once everything above is constructed
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_GEMM_SERVICE_H_
