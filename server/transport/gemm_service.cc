#include "server/transport/gemm_service.h"

#include <fmt/format.h>
#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "server/core/status.h"
#include "server/transport/convert.h"
#include "server/transport/matrix_reactors.h"
#include "server/transport/ring_reactor.h"
#include "server/transport/status_util.h"
#include "server/transport/stream_reactor.h"

namespace hgemm {

GemmCoreOptions CoreOptions(const ServiceOptions& options) {
  return {.rules = options.rules,
          .max_client_pending_bytes = options.max_client_pending_bytes,
          .result_buffer_pool_bytes = options.result_buffer_pool_bytes,
          .replica = options.resident.replica,
          .regions = options.regions};
}

GemmServiceImpl::GemmServiceImpl(GemmCoreInterface* core, ServiceOptions options,
                                 ServiceMetrics* metrics, const Authenticator* authenticator)
    : options_(std::move(options)),
      core_(core),
      log_(metrics),
      authenticator_(authenticator != nullptr ? authenticator : &no_authentication_),
      stream_options_{.stream_chunk_bytes = options_.stream_chunk_bytes,
                      .max_stream_pending_bytes = options_.max_stream_pending_bytes,
                      .idle_timeout = options_.idle_timeout} {
  // What the generated WithRawCallbackMethod_UploadPart (and _UploadMatrix) does, without the
  // class wrapper that would hide the typed method it replaces; the index is looked up, not
  // hard-coded.
  auto mark_raw = [this](const char* method, auto handler) {
    const int index = google::protobuf::DescriptorPool::generated_pool()
                          ->FindServiceByName(v1::GemmService::service_full_name())
                          ->FindMethodByName(method)
                          ->index();
    MarkMethodRawCallback(
        index,
        new grpc::internal::CallbackClientStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [this, handler](grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
              return (this->*handler)(context, response);
            }));
  };
  mark_raw("UploadMatrix", &GemmServiceImpl::UploadMatrixRaw);
  mark_raw("UploadPart", &GemmServiceImpl::UploadPartRaw);
}

GemmServiceImpl::~GemmServiceImpl() = default;

void GemmServiceImpl::Drain() {
  gate_.Close();
  calls_.Drain();
}

absl::Status GemmServiceImpl::Identify(Rpc rpc, const grpc::CallbackServerContext* context,
                                       Principal* caller, CallGate::Pass* pass) const {
  // gRPC takes calls until grpc::Server::Shutdown, which comes only once the GEMMs admitted
  // before the drain are answered: a call let in meanwhile would be run, or wait out its
  // deadline, on a server going away.
  CallGate::Pass entered = gate_.Enter();
  absl::Status s = entered ? authenticator_->Identify(*context, caller) : status::ShuttingDown();
  if (pass != nullptr) *pass = std::move(entered);
  if (s.ok()) return s;
  if (rpc == Rpc::kGemmStream) {
    log_.StreamEnded(s, context, "");
  } else {
    log_.Answered(rpc, s, context, "");
  }
  return s;
}

template <typename Answer>
grpc::ServerUnaryReactor* GemmServiceImpl::Unary(Rpc rpc, grpc::CallbackServerContext* context,
                                                 Answer answer) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal caller;
  CallGate::Pass pass;
  absl::Status s = Identify(rpc, context, &caller, &pass);
  if (s.ok()) {
    s = answer(caller);
    log_.Answered(rpc, s, context, caller.name);
  }
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

namespace {

// A call refused before it started (the drain has begun, or its caller is not
// authenticated): finished at once.
template <typename Reactor>
class RefusedCall final : public Reactor {
 public:
  explicit RefusedCall(const absl::Status& s) { this->Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerUnaryReactor* GemmServiceImpl::Gemm(grpc::CallbackServerContext* context,
                                                const v1::GemmRequest* request,
                                                v1::GemmResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  log_.Received(Rpc::kGemm,
                int64_t(request->a().size() + request->b().size() + request->c_in().size()),
                *context);
  Principal caller;
  CallGate::Pass pass;
  if (absl::Status s = Identify(Rpc::kGemm, context, &caller, &pass); !s.ok()) {
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
    log_.Answered(Rpc::kGemm, s, context, caller.name, request->options().request_id());
    reactor->Finish(ToGrpcStatus(s));
  }
  return reactor;
}

absl::Status GemmServiceImpl::AdmitGemm(grpc::CallbackServerContext* context,
                                        const std::string& owner, const v1::GemmRequest& request,
                                        v1::GemmResponse* response,
                                        grpc::ServerUnaryReactor* reactor) {
  GemmOrder order;
  if (absl::Status s = ValidateGemm(ToSpec(request), options_.rules, &order); !s.ok()) return s;
  order.over_unix_socket = OverUnixSocket(*context);
  const bool c_to_host = order.c.kind == ResultSink::Kind::kHost;
  const bool a_shared = request.has_a_region(), b_shared = request.has_b_region();
  const bool c_shared = request.has_c_region();
  AdmittedGemm admitted;
  if (absl::Status s = core_->Admit(owner, std::move(order), &admitted); !s.ok()) return s;
  GemmJob& job = admitted.job();
  const GemmShape shape = job.shape;
  response->set_m(shape.m);
  response->set_n(shape.n);
  response->set_request_id(job.request_id);
  if (c_to_host) {
    response->mutable_c()->resize(shape.CBytes());
    job.c = response->mutable_c()->data();
  }
  job.deadline = SteadyDeadline(*context);
  job.is_cancelled = [context] { return context->IsCancelled(); };
  job.traceparent = CallTraceparent(*context);
  return core_->Run(
      std::move(admitted), [this, context, owner, reactor, response, shape, a_shared, b_shared,
                            c_shared](const absl::Status& status, GemmResult result) {
        absl::Status answer = status;
        try {
          if (status.ok()) {
            ToProto(shape, result, response->mutable_timing(), response->mutable_execution());
            if (result.kept_c.buffer) Describe(*core_, result.kept_c, response->mutable_c_matrix());
          }
        } catch (...) {
          answer = status::FromCurrentException("Gemm result");
        }
        if (answer.ok()) {
          log_.Ran(shape, result);
          log_.Sent(Rpc::kGemm, int64_t(response->c().size()), *context);
          log_.SharedMemory((a_shared ? shape.ABytes() : 0) + (b_shared ? shape.BBytes() : 0),
                            c_shared ? shape.CBytes() : 0);
        }
        log_.Answered(Rpc::kGemm, answer, context, owner, response->request_id());
        reactor->Finish(ToGrpcStatus(answer));
      });
}

grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>* GemmServiceImpl::GemmStream(
    grpc::CallbackServerContext* context) {
  Principal caller;
  CallGate::Pass pass;
  if (absl::Status s = Identify(Rpc::kGemmStream, context, &caller, &pass); !s.ok()) {
    return new RefusedCall<grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>>(
        s);
  }
  return NewGemmStreamReactor(call_services_, context, std::move(caller.name));
}

grpc::ServerUnaryReactor* GemmServiceImpl::ListKernels(grpc::CallbackServerContext* context,
                                                       const v1::ListKernelsRequest*,
                                                       v1::ListKernelsResponse* response) {
  return Unary(Rpc::kListKernels, context, [&](const Principal&) {
    v1::KernelInfo* auto_kernel = response->add_kernels();
    auto_kernel->set_name("auto");
    auto_kernel->set_description("the server picks a kernel per shape (by measurement on CUDA)");
    for (const KernelDescription& k : options_.rules.kernels) {
      v1::KernelInfo* info = response->add_kernels();
      info->set_name(k.name);
      info->set_description(k.description);
      if (k.fp16_accumulation) info->add_accumulations(v1::ACCUMULATION_FP16);
      if (k.fp32_accumulation) info->add_accumulations(v1::ACCUMULATION_FP32);
      DescribeForms(k.layouts, k.types, k.scaled_types, info);
      info->set_grouped(k.grouped);
      info->set_fused_scale(k.fused_scale);
    }
    auto_kernel->set_grouped(std::any_of(options_.rules.kernels.begin(),
                                         options_.rules.kernels.end(),
                                         [](const KernelDescription& k) { return k.grouped; }));
    auto_kernel->set_fused_scale(
        std::any_of(options_.rules.kernels.begin(), options_.rules.kernels.end(),
                    [](const KernelDescription& k) { return k.fused_scale; }));
    DescribeForms(AutoLayouts(options_.rules), AutoTypes(options_.rules),
                  AutoScaledTypes(options_.rules), auto_kernel);
    if (AutoSupports(options_.rules, Accumulation::kFp16)) {
      auto_kernel->add_accumulations(v1::ACCUMULATION_FP16);
    }
    if (AutoSupports(options_.rules, Accumulation::kFp32)) {
      auto_kernel->add_accumulations(v1::ACCUMULATION_FP32);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* GemmServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetServerInfoRequest*,
                                                         v1::ServerInfo* response) {
  return Unary(Rpc::kGetServerInfo, context, [&](const Principal&) {
    response->set_version(kVersion);
    const std::string backend = core_->BackendName();
    response->set_backend(backend);
    for (const DeviceDescription& d : core_->Devices()) {
      ToProto(d, response->add_devices());
    }
    v1::Limits* limits = response->mutable_limits();
    limits->set_max_elements_per_matrix(options_.rules.max_elements_per_matrix);
    limits->set_max_group_problems(uint32_t(options_.rules.max_group_problems));
    limits->set_max_queued_requests(options_.scheduler.max_queued_requests);
    limits->set_max_queued_per_client(uint64_t(options_.scheduler.max_queued_per_owner));
    limits->set_max_queued_bytes(options_.scheduler.max_queued_bytes);
    limits->set_max_message_bytes(options_.max_message_bytes);
    limits->set_stream_chunk_bytes(options_.stream_chunk_bytes);
    limits->set_resident_quota_bytes(options_.resident.quota_bytes_per_client);
    limits->set_resident_default_ttl_seconds(options_.resident.default_ttl.count());
    limits->set_resident_lru_eviction(options_.resident.lru_eviction);
    limits->set_max_parts_per_upload(options_.resident.max_parts_per_upload);
    limits->set_upload_idle_timeout_seconds(options_.resident.upload_idle_timeout.count());
    const Scheduler::Stats stats = core_->SchedulerStats();
    v1::Load* load = response->mutable_load();
    load->set_queued(stats.queued);
    load->set_running(stats.running);
    load->set_admitted_bytes(stats.admitted_bytes);
    load->set_admitted_total(stats.admitted_total);
    load->set_completed_total(stats.completed_total);
    response->set_replica(options_.resident.replica);
    v1::Features* features = response->mutable_features();
    features->set_shared_memory(options_.regions.allow_shared_memory);
    features->set_unix_socket(options_.unix_socket);
    features->set_cuda_ipc(options_.regions.allow_shared_memory &&
                           options_.regions.allow_cuda_ipc && backend == "cuda");
    features->set_submission_ring(options_.regions.allow_shared_memory);
    features->set_parallel_parts(true);
    features->set_tls(options_.tls);
    features->set_authentication(authenticator_->enabled());
    features->set_error_details(true);
    features->set_verification(true);
    features->set_verify_all(options_.scheduler.verify_all);
    features->set_bulk_channel(bulk_grants_ != nullptr);
    if (bulk_grants_ != nullptr) limits->set_max_bulk_lanes(bulk_grants_->options().max_lanes);
    return absl::OkStatus();
  });
}

void GemmServiceImpl::ServeBulk(BulkGrants* grants, int port, std::string host) {
  bulk_grants_ = grants;
  bulk_port_ = port;
  bulk_host_ = std::move(host);
}

grpc::ServerUnaryReactor* GemmServiceImpl::OpenBulk(grpc::CallbackServerContext* context,
                                                    const v1::BulkRequest* request,
                                                    v1::BulkGrant* response) {
  return Unary(Rpc::kOpenBulk, context, [&](const Principal& caller) {
    if (bulk_grants_ == nullptr) {
      return status::FailedPrecondition(
          "this server has no bulk channel (--bulk_listen); send the bytes by UploadPart and "
          "DownloadMatrix");
    }
    BulkDirection direction;
    switch (request->direction()) {
      case v1::BULK_PUT:
        direction = BulkDirection::kPut;
        break;
      case v1::BULK_GET:
        direction = BulkDirection::kGet;
        break;
      default:
        return status::InvalidArgument("direction", "must be BULK_PUT or BULK_GET");
    }
    if (request->offset() > uint64_t(INT64_MAX) || request->length() > uint64_t(INT64_MAX)) {
      return status::InvalidArgument("offset", "offset and length must be below 2^63");
    }
    if (direction == BulkDirection::kGet) {
      // A PUT's range is checked when its lanes claim their parts (MatrixStore::BeginPart).
      ResidentMatrix m;
      if (absl::Status s = core_->LookupMatrix(caller.name, request->handle(), "handle", &m);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckByteRange(m, request->offset(), request->length()); !s.ok()) {
        return s;
      }
    }
    std::vector<BulkLane> lanes;
    if (absl::Status s = bulk_grants_->Grant(caller.name, request->handle(), direction,
                                             int64_t(request->offset()), int64_t(request->length()),
                                             int(std::min<uint32_t>(request->lanes(), INT32_MAX)),
                                             Clock::now(), &lanes);
        !s.ok()) {
      return s;
    }
    response->set_host(bulk_host_);
    response->set_port(uint32_t(bulk_port_));
    response->set_expires_in_ms(uint32_t(bulk_grants_->options().lifetime.count()));
    for (BulkLane& lane : lanes) {
      v1::BulkLane* out = response->add_lanes();
      out->set_capability(std::move(lane.capability));
      out->set_offset(uint64_t(lane.offset));
      out->set_length(uint64_t(lane.length));
    }
    return absl::OkStatus();
  });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* GemmServiceImpl::UploadMatrixRaw(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  Principal caller;
  CallGate::Pass pass;
  if (absl::Status s = Identify(Rpc::kUploadMatrix, context, &caller, &pass); !s.ok()) {
    return new RefusedCall<grpc::ServerReadReactor<grpc::ByteBuffer>>(s);
  }
  return NewUploadMatrixReactor(call_services_, context, std::move(caller.name), response);
}

grpc::ServerUnaryReactor* GemmServiceImpl::ReleaseMatrix(grpc::CallbackServerContext* context,
                                                         const v1::ReleaseMatrixRequest* request,
                                                         v1::ReleaseMatrixResponse* response) {
  return Unary(Rpc::kReleaseMatrix, context, [&](const Principal& caller) {
    int64_t freed = 0;
    absl::Status s = core_->ReleaseMatrix(caller.name, request->handle(), caller.admin, &freed);
    response->set_freed_bytes(freed);
    return s;
  });
}

grpc::ServerUnaryReactor* GemmServiceImpl::ListMatrices(grpc::CallbackServerContext* context,
                                                        const v1::ListMatricesRequest*,
                                                        v1::ListMatricesResponse* response) {
  return Unary(Rpc::kListMatrices, context, [&](const Principal& caller) {
    // An administrator sees every principal's matrices, each with its owner.
    const MatrixList list = core_->ListMatrices(caller.name, caller.admin);
    for (const ResidentMatrix& m : list.matrices) {
      v1::MatrixInfo* info = response->add_matrices();
      Describe(*core_, m, info);
      if (caller.admin) info->set_owner(m.owner);
    }
    response->set_client_bytes(list.client_bytes);
    response->set_quota_bytes(list.quota_bytes);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::ResultChunk>* GemmServiceImpl::DownloadMatrix(
    grpc::CallbackServerContext* context, const v1::DownloadMatrixRequest* request) {
  Principal caller;
  CallGate::Pass pass;
  if (absl::Status s = Identify(Rpc::kDownloadMatrix, context, &caller, &pass); !s.ok()) {
    return new RefusedCall<grpc::ServerWriteReactor<v1::ResultChunk>>(s);
  }
  return NewDownloadMatrixReactor(call_services_, context, std::move(caller.name), *request);
}

grpc::ServerUnaryReactor* GemmServiceImpl::CreateUpload(grpc::CallbackServerContext* context,
                                                        const v1::UploadCreateRequest* request,
                                                        v1::MatrixInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal caller;
  CallGate::Pass pass;
  if (absl::Status s = Identify(Rpc::kCreateUpload, context, &caller, &pass); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  // Answered once the matrix is allocated (on an upload thread), or at once when refused.
  core_->CreateUpload(caller.name, ToSpec(request->header()), request->transient(),
                      [this, context, reactor, response, owner = caller.name](
                          const absl::Status& s, const ResidentMatrix& matrix) {
                        if (s.ok()) Describe(*core_, matrix, response);
                        log_.Answered(Rpc::kCreateUpload, s, context, owner);
                        reactor->Finish(ToGrpcStatus(s));
                      });
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* GemmServiceImpl::UploadPartRaw(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  Principal caller;
  CallGate::Pass pass;
  if (absl::Status s = Identify(Rpc::kUploadPart, context, &caller, &pass); !s.ok()) {
    return new RefusedCall<grpc::ServerReadReactor<grpc::ByteBuffer>>(s);
  }
  return NewUploadPartReactor(call_services_, context, std::move(caller.name), response);
}

grpc::ServerWriteReactor<v1::RingEvent>* GemmServiceImpl::AttachRing(
    grpc::CallbackServerContext* context, const v1::AttachRingRequest* request) {
  Principal caller;
  CallGate::Pass pass;
  if (absl::Status s = Identify(Rpc::kAttachRing, context, &caller, &pass); !s.ok()) {
    return new RefusedCall<grpc::ServerWriteReactor<v1::RingEvent>>(s);
  }
  return NewAttachRingReactor(call_services_, context, std::move(caller.name), *request);
}

grpc::ServerUnaryReactor* GemmServiceImpl::BindRingSlots(grpc::CallbackServerContext* context,
                                                         const v1::BindRingSlotsRequest* request,
                                                         v1::RingSlots* response) {
  return Unary(Rpc::kBindRingSlots, context, [&](const Principal& caller) {
    if (absl::Status s = core_->CheckRegionsAllowed(OverUnixSocket(*context)); !s.ok()) return s;
    std::shared_ptr<RingExecutor> ring;
    if (absl::Status s = call_services_.rings->Find(caller.name, request->ring_region(), &ring);
        !s.ok()) {
      return s;
    }
    uint32_t first_region = 0, first_matrix = 0;
    absl::Status s = ring->Bind({request->regions().begin(), request->regions().end()},
                                {request->matrices().begin(), request->matrices().end()},
                                &first_region, &first_matrix);
    response->set_first_region_slot(first_region);
    response->set_first_matrix_slot(first_matrix);
    return s;
  });
}

grpc::ServerUnaryReactor* GemmServiceImpl::RegisterRegion(grpc::CallbackServerContext* context,
                                                          const v1::RegisterRegionRequest* request,
                                                          v1::RegionInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal caller;
  if (absl::Status s = Identify(Rpc::kRegisterRegion, context, &caller); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));  // Identify logged the refusal
    return reactor;
  }
  // The process the kernel says is calling: only its own file descriptors may be registered.
  std::optional<RegisteringProcess> process;
  if (const std::optional<PeerCredentials> peer = authenticator_->UnixPeer(*context)) {
    process.emplace();
    process->pid = peer->pid;
    if (peer->process) process->alive = [handle = peer->process] { return handle->Alive(); };
  }
  // Answered once the region is mapped (on an upload thread), or at once when refused.
  core_->RegisterRegion(caller.name, OverUnixSocket(*context), ToSpec(*request), std::move(process),
                        [this, context, reactor, response, owner = caller.name](
                            const absl::Status& s, const RegionInfo& info) {
                          if (s.ok()) ToProto(info, response);
                          log_.Answered(Rpc::kRegisterRegion, s, context, owner);
                          reactor->Finish(ToGrpcStatus(s));
                        });
  return reactor;
}

grpc::ServerUnaryReactor* GemmServiceImpl::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse* response) {
  return Unary(Rpc::kUnregisterRegion, context, [&](const Principal& caller) {
    int64_t freed = 0;
    absl::Status s =
        core_->UnregisterRegion(caller.name, OverUnixSocket(*context), request->region(), &freed);
    response->set_freed_bytes(freed);
    return s;
  });
}

grpc::ServerUnaryReactor* GemmServiceImpl::ListRegions(grpc::CallbackServerContext* context,
                                                       const v1::ListRegionsRequest*,
                                                       v1::ListRegionsResponse* response) {
  return Unary(Rpc::kListRegions, context, [&](const Principal& caller) {
    RegionList list;
    if (absl::Status s = core_->ListRegions(caller.name, OverUnixSocket(*context), &list);
        !s.ok()) {
      return s;
    }
    for (const RegionInfo& region : list.regions) ToProto(region, response->add_regions());
    response->set_client_bytes(list.owner_bytes);
    response->set_quota_bytes(list.quota_bytes);
    response->set_quota_regions(list.quota_regions);
    return absl::OkStatus();
  });
}

}  // namespace hgemm
