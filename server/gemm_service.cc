#include "server/gemm_service.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>

#include "server/convert.h"
#include "server/core/logging.h"
#include "server/core/status.h"
#include "server/matrix_reactors.h"
#include "server/status_util.h"
#include "server/stream_reactor.h"

namespace hgemm {

GemmServiceImpl::GemmServiceImpl(Scheduler* scheduler, Backend* backend, MatrixStore* store,
                                 UploadQueue* uploads, ServiceOptions options,
                                 ServiceMetrics* metrics, const Authenticator* authenticator)
    : scheduler_(scheduler),
      backend_(backend),
      store_(store),
      uploads_(uploads),
      resolver_(store, scheduler),
      options_(std::move(options)),
      metrics_(metrics),
      authenticator_(authenticator != nullptr ? authenticator : &no_authentication_),
      stream_services_{.rules = &options_.rules,
                       .scheduler = scheduler,
                       .backend = backend,
                       .uploads = uploads,
                       .resolver = &resolver_,
                       .client_pending = &client_pending_,
                       .result_buffers = &result_buffers_,
                       .metrics = metrics,
                       .stream_chunk_bytes = options_.stream_chunk_bytes,
                       .max_stream_pending_bytes = options_.max_stream_pending_bytes,
                       .idle_timeout = options_.idle_timeout},
      janitor_([this] { ExpireIdleCalls(); }) {}

GemmServiceImpl::~GemmServiceImpl() {
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    stopping_ = true;
  }
  janitor_wake_.notify_all();
  janitor_.join();
}

void GemmServiceImpl::Answered(Rpc rpc, const absl::Status& s,
                               const grpc::CallbackServerContext* context,
                               std::string_view caller, std::string_view request_id,
                               std::optional<uint64_t> gemm_id) const {
  if (metrics_ != nullptr) metrics_->CountCall(rpc, s.code());
  if (s.ok()) return;
  const std::string gemm = gemm_id ? std::to_string(*gemm_id) : "";
  const std::string code = status::CodeName(s.code());
  logging::Log(spdlog::level::info, fmt::format("{} {}", RpcName(rpc), code),
               {{"rpc", RpcName(rpc), false},
                {"code", code, false},
                {"gemm_id", gemm},
                {"reason", status::Message(s)},
                {"request_id", request_id},
                {"peer", context->peer()},
                {"principal", caller},
                {"traceparent", CallTraceparent(*context)}});
}

void GemmServiceImpl::StreamEnded(const absl::Status& s, const grpc::CallbackServerContext* context,
                                  std::string_view caller) const {
  if (metrics_ != nullptr) metrics_->CountStreamCall(s.code());
  if (s.ok()) return;
  const std::string code = status::CodeName(s.code());
  logging::Log(spdlog::level::info, fmt::format("GemmStream call {}", code),
               {{"rpc", "GemmStream", false},
                {"code", code, false},
                {"reason", status::Message(s)},
                {"peer", context->peer()},
                {"principal", caller},
                {"traceparent", CallTraceparent(*context)}});
}

absl::Status GemmServiceImpl::Identify(Rpc rpc, const grpc::CallbackServerContext* context,
                                       Principal* caller) const {
  absl::Status s = authenticator_->Identify(*context, caller);
  if (s.ok()) return s;
  if (rpc == Rpc::kGemmStream) {
    StreamEnded(s, context, "");
  } else {
    Answered(rpc, s, context, "");
  }
  return s;
}

namespace {

// A call refused before it started (its caller is not authenticated): finished at once.
template <typename Reactor>
class RefusedCall final : public Reactor {
 public:
  explicit RefusedCall(const absl::Status& s) { this->Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

void GemmServiceImpl::Drain() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  draining_ = true;
  for (TrackedCall* call : calls_) call->Drain();
}

void GemmServiceImpl::Track(TrackedCall* call) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  calls_.insert(call);
  if (draining_) call->Drain();
}

void GemmServiceImpl::Untrack(TrackedCall* call) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  calls_.erase(call);
}

void GemmServiceImpl::ExpireIdleCalls() {
  // A few looks per timeout: a call expires at most a quarter of it late.
  const auto period = std::clamp<Clock::duration>(options_.idle_timeout / 4,
                                                  std::chrono::milliseconds(10),
                                                  std::chrono::seconds(1));
  std::unique_lock<std::mutex> lock(calls_mu_);
  while (!stopping_) {
    janitor_wake_.wait_for(lock, period);
    const Clock::time_point cutoff = Clock::now() - options_.idle_timeout;
    for (TrackedCall* call : calls_) call->ExpireIdle(cutoff);
  }
}

void GemmServiceImpl::Describe(const ResidentMatrix& m, v1::MatrixInfo* info) const {
  ToProto(m, backend_->Devices()[m.buffer->device_index].id, options_.resident.replica, info);
}

void GemmServiceImpl::KeepResult(QuotaReservation c_quota, const GemmShape& shape,
                                 const GemmReport& report, uint32_t ttl_seconds,
                                 v1::MatrixInfo* info) const {
  Describe(resolver_.KeepC(std::move(c_quota), shape, report, ttl_seconds), info);
}

grpc::ServerUnaryReactor* GemmServiceImpl::Gemm(grpc::CallbackServerContext* context,
                                                const v1::GemmRequest* request,
                                                v1::GemmResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (metrics_ != nullptr) {
    metrics_->AddReceivedBytes(Rpc::kGemm, int64_t(request->a().size() + request->b().size()));
  }
  Principal caller;
  if (absl::Status s = Identify(Rpc::kGemm, context, &caller); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  absl::Status s;
  try {
    s = AdmitGemm(context, caller.name, *request, response, reactor);
  } catch (...) {  // before the scheduler took the job: nobody else will answer the call
    s = status::FromCurrentException("Gemm");
  }
  if (!s.ok()) {
    Answered(Rpc::kGemm, s, context, caller.name, request->options().request_id());
    reactor->Finish(ToGrpcStatus(s));
  }
  return reactor;
}

absl::Status GemmServiceImpl::AdmitGemm(grpc::CallbackServerContext* context,
                                        const std::string& owner, const v1::GemmRequest& request,
                                        v1::GemmResponse* response,
                                        grpc::ServerUnaryReactor* reactor) {
  GemmJob job;
  if (absl::Status s = ValidateGemmRequest(request, options_.rules, &job); !s.ok()) return s;
  // Before C's buffer is made: the size limits say whether it may be.
  if (absl::Status s = scheduler_->CheckSize(job.shape); !s.ok()) return s;
  auto c_quota = std::make_shared<QuotaReservation>();  // shared: GemmDone must be copyable
  if (absl::Status s = resolver_.Resolve(owner,
                                         {.a_handle = request.a_handle(),
                                          .b_handle = request.b_handle(),
                                          .keep_c = request.keep_c_resident()},
                                         &job, c_quota.get());
      !s.ok()) {
    return s;
  }
  const GemmShape shape = job.shape;
  response->set_m(shape.m);
  response->set_n(shape.n);
  response->set_request_id(job.request_id);
  if (!job.keep_c) {
    response->mutable_c()->resize(shape.CBytes());
    job.c = reinterpret_cast<uint16_t*>(response->mutable_c()->data());
  }
  job.a = HalfData(request.a());
  job.b = HalfData(request.b());
  job.deadline = SteadyDeadline(*context);
  job.is_cancelled = [context] { return context->IsCancelled(); };
  job.traceparent = CallTraceparent(*context);
  const uint32_t c_ttl = request.c_ttl_seconds();
  return scheduler_->Enqueue(
      std::move(job), [this, context, owner, reactor, response, shape, c_quota, c_ttl](
                          const absl::Status& status, const GemmReport& report) {
        absl::Status answer = status;
        try {
          if (status.ok()) {
            ToProto(shape, report, response->mutable_timing(), response->mutable_execution());
            response->mutable_execution()->set_backend(backend_->Name());
            if (report.c_resident) {
              KeepResult(std::move(*c_quota), shape, report, c_ttl, response->mutable_c_matrix());
            }
          }
        } catch (...) {
          answer = status::FromCurrentException("Gemm result");
        }
        if (metrics_ != nullptr && answer.ok()) {
          metrics_->ObserveGemm(report, report.Tflops(shape));
          metrics_->AddSentBytes(Rpc::kGemm, int64_t(response->c().size()));
        }
        Answered(Rpc::kGemm, answer, context, owner, response->request_id());
        reactor->Finish(ToGrpcStatus(answer));
      });
}

grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>*
GemmServiceImpl::GemmStream(grpc::CallbackServerContext* context) {
  Principal caller;
  if (absl::Status s = Identify(Rpc::kGemmStream, context, &caller); !s.ok()) {
    return new RefusedCall<grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>>(s);
  }
  return NewGemmStreamReactor(*this, context, std::move(caller.name));
}

grpc::ServerUnaryReactor* GemmServiceImpl::ListKernels(grpc::CallbackServerContext* context,
                                                       const v1::ListKernelsRequest*,
                                                       v1::ListKernelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal caller;
  if (absl::Status s = Identify(Rpc::kListKernels, context, &caller); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  v1::KernelInfo* auto_kernel = response->add_kernels();
  auto_kernel->set_name("auto");
  auto_kernel->set_description("the server picks a kernel per shape (by measurement on CUDA)");
  for (const KernelDescription& k : options_.rules.kernels) {
    v1::KernelInfo* info = response->add_kernels();
    info->set_name(k.name);
    info->set_description(k.description);
    if (k.fp16_accumulation) info->add_accumulations(v1::ACCUMULATION_FP16);
    if (k.fp32_accumulation) info->add_accumulations(v1::ACCUMULATION_FP32);
  }
  if (AutoSupports(options_.rules, Accumulation::kFp16)) {
    auto_kernel->add_accumulations(v1::ACCUMULATION_FP16);
  }
  if (AutoSupports(options_.rules, Accumulation::kFp32)) {
    auto_kernel->add_accumulations(v1::ACCUMULATION_FP32);
  }
  Answered(Rpc::kListKernels, absl::OkStatus(), context, caller.name);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GemmServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetServerInfoRequest*,
                                                         v1::ServerInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal caller;
  if (absl::Status s = Identify(Rpc::kGetServerInfo, context, &caller); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  response->set_version(kVersion);
  response->set_backend(backend_->Name());
  for (const DeviceDescription& d : backend_->Devices()) {
    v1::Device* device = response->add_devices();
    device->set_id(d.id);
    device->set_name(d.name);
    device->set_memory_bytes(d.memory_bytes);
    device->set_streams(d.slots);
    device->set_compute_capability(d.compute_capability);
  }
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_elements_per_matrix(options_.rules.max_elements_per_matrix);
  limits->set_max_queued_requests(options_.scheduler.max_queued_requests);
  limits->set_max_queued_bytes(options_.scheduler.max_queued_bytes);
  limits->set_max_message_bytes(options_.max_message_bytes);
  limits->set_stream_chunk_bytes(options_.stream_chunk_bytes);
  limits->set_resident_quota_bytes(options_.resident.quota_bytes_per_client);
  limits->set_resident_default_ttl_seconds(options_.resident.default_ttl.count());
  limits->set_resident_lru_eviction(options_.resident.lru_eviction);
  const Scheduler::Stats stats = scheduler_->GetStats();
  v1::Load* load = response->mutable_load();
  load->set_queued(stats.queued);
  load->set_running(stats.running);
  load->set_admitted_bytes(stats.admitted_bytes);
  load->set_admitted_total(stats.admitted_total);
  load->set_completed_total(stats.completed_total);
  response->set_replica(options_.resident.replica);
  Answered(Rpc::kGetServerInfo, absl::OkStatus(), context, caller.name);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerReadReactor<v1::UploadMatrixRequest>* GemmServiceImpl::UploadMatrix(
    grpc::CallbackServerContext* context, v1::MatrixInfo* response) {
  Principal caller;
  if (absl::Status s = Identify(Rpc::kUploadMatrix, context, &caller); !s.ok()) {
    return new RefusedCall<grpc::ServerReadReactor<v1::UploadMatrixRequest>>(s);
  }
  return NewUploadMatrixReactor(*this, context, std::move(caller.name), response);
}

grpc::ServerUnaryReactor* GemmServiceImpl::ReleaseMatrix(grpc::CallbackServerContext* context,
                                                         const v1::ReleaseMatrixRequest* request,
                                                         v1::ReleaseMatrixResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal caller;
  if (absl::Status s = Identify(Rpc::kReleaseMatrix, context, &caller); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  int64_t freed = 0;
  absl::Status s = store_->Release(caller.name, request->handle(), &freed, caller.admin);
  response->set_freed_bytes(freed);
  Answered(Rpc::kReleaseMatrix, s, context, caller.name);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* GemmServiceImpl::ListMatrices(grpc::CallbackServerContext* context,
                                                        const v1::ListMatricesRequest*,
                                                        v1::ListMatricesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal caller;
  if (absl::Status s = Identify(Rpc::kListMatrices, context, &caller); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  // An administrator sees every principal's matrices, each with its owner.
  for (const ResidentMatrix& m : caller.admin ? store_->ListAll() : store_->List(caller.name)) {
    v1::MatrixInfo* info = response->add_matrices();
    Describe(m, info);
    if (caller.admin) info->set_owner(m.owner);
  }
  response->set_client_bytes(store_->ClientBytes(caller.name));
  response->set_quota_bytes(options_.resident.quota_bytes_per_client);
  Answered(Rpc::kListMatrices, absl::OkStatus(), context, caller.name);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::ResultChunk>* GemmServiceImpl::DownloadMatrix(
    grpc::CallbackServerContext* context, const v1::DownloadMatrixRequest* request) {
  Principal caller;
  if (absl::Status s = Identify(Rpc::kDownloadMatrix, context, &caller); !s.ok()) {
    return new RefusedCall<grpc::ServerWriteReactor<v1::ResultChunk>>(s);
  }
  return NewDownloadMatrixReactor(*this, context, std::move(caller.name), *request);
}

}  // namespace hgemm
