#include "server/gemm_service.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "server/core/logging.h"
#include "server/core/status.h"
#include "server/status_util.h"
#include "server/stream_assembler.h"

namespace hgemm {
namespace {

// The call's deadline on the steady clock the scheduler uses.
Clock::time_point SteadyDeadline(const grpc::CallbackServerContext* context) {
  auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

const uint16_t* HalfData(const std::string& bytes) {
  return reinterpret_cast<const uint16_t*>(bytes.data());
}

v1::Accumulation ToProto(Accumulation a) {
  return a == Accumulation::kFp16 ? v1::ACCUMULATION_FP16 : v1::ACCUMULATION_FP32;
}

// The call's W3C trace context ("traceparent" metadata), or "" when absent or malformed.
std::string_view CallTraceparent(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("traceparent");
  if (it == metadata.end()) return {};
  return logging::ValidTraceparent(std::string_view(it->second.data(), it->second.size()));
}

}  // namespace

void ToProto(const GemmShape& shape, const GemmReport& report, v1::Timing* timing,
             v1::Execution* execution) {
  timing->set_queue_wait_ms(report.queue_wait_ms);
  timing->set_host_to_device_ms(report.host_to_device_ms);
  timing->set_kernel_ms(report.kernel_ms);
  timing->set_device_to_host_ms(report.device_to_host_ms);
  timing->set_server_total_ms(report.server_total_ms);
  timing->set_tflops(report.Tflops(shape));
  execution->set_kernel(report.kernel);
  execution->set_accumulation(ToProto(report.accumulation));
  execution->set_device_id(report.device_id);
  execution->set_device_name(report.device_name);
  execution->set_stream_id(report.stream_id);
}

GemmServiceImpl::GemmServiceImpl(Scheduler* scheduler, Backend* backend, MatrixStore* store,
                                 UploadQueue* uploads, ServiceOptions options,
                                 ServiceMetrics* metrics, const Authenticator* authenticator)
    : scheduler_(scheduler),
      backend_(backend),
      store_(store),
      uploads_(uploads),
      options_(std::move(options)),
      metrics_(metrics),
      authenticator_(authenticator != nullptr ? authenticator : &no_authentication_),
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
                {"traceparent", CallTraceparent(context)}});
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
                {"traceparent", CallTraceparent(context)}});
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

absl::Status GemmServiceImpl::ChargePending(const std::string& owner, int64_t bytes) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_bytes_.find(owner);
  const int64_t held = it == pending_bytes_.end() ? 0 : it->second;
  if (bytes > options_.max_client_pending_bytes - held) {
    return status::OverLimit(fmt::format(
        "its operands ({} bytes) would put this client's incomplete streamed GEMMs over {} "
        "bytes (--max_client_pending_bytes; {} pending now)",
        bytes, options_.max_client_pending_bytes, held));
  }
  pending_bytes_[owner] = held + bytes;
  return absl::OkStatus();
}

void GemmServiceImpl::ReleasePending(const std::string& owner, int64_t bytes) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_bytes_.find(owner);
  if (it != pending_bytes_.end() && (it->second -= bytes) <= 0) pending_bytes_.erase(it);
}

absl::Status GemmServiceImpl::ResolveResident(const std::string& owner,
                                              const std::string& a_handle,
                                              const std::string& b_handle, bool keep_c,
                                              GemmJob* job, QuotaReservation* c_quota) const {
  const GemmShape& shape = job->shape;
  struct Operand {
    const std::string& handle;
    const char* field;
    int64_t rows, cols;
    std::shared_ptr<ResidentBuffer>* slot;
  };
  for (const Operand& o : {Operand{a_handle, "a_handle", shape.m, shape.k, &job->a_resident},
                           Operand{b_handle, "b_handle", shape.k, shape.n, &job->b_resident}}) {
    if (o.handle.empty()) continue;
    ResidentMatrix m;
    if (absl::Status s = store_->Lookup(owner, o.handle, o.field, &m); !s.ok()) return s;
    if (m.rows != o.rows || m.cols != o.cols) {
      return status::InvalidArgument(
          o.field, fmt::format("matrix {} is {}x{}; this GEMM needs {}x{}",
                               status::Quote(o.handle), m.rows, m.cols, o.rows, o.cols));
    }
    // A and B on different devices: run where the larger one lives; the backend copies the
    // other one over for the run.
    if (job->device_index < 0 || m.buffer->bytes > job->a_resident->bytes) {
      job->device_index = m.buffer->device_index;
    }
    *o.slot = m.buffer;
  }
  if (keep_c) {
    if (absl::Status s = store_->Reserve(owner, shape.CBytes(), c_quota); !s.ok()) {
      return status::WithContext("keep_c_resident", s);
    }
    job->keep_c = true;
  }
  return absl::OkStatus();
}

void GemmServiceImpl::Describe(const ResidentMatrix& m, v1::MatrixInfo* info) const {
  const auto now = Clock::now();
  info->set_handle(m.handle);
  info->set_rows(m.rows);
  info->set_cols(m.cols);
  info->set_bytes(m.buffer->bytes);
  info->set_device_id(backend_->Devices()[m.buffer->device_index].id);
  info->set_age_seconds(std::chrono::duration<double>(now - m.created).count());
  info->set_idle_seconds(std::chrono::duration<double>(now - m.last_used).count());
  info->set_ttl_seconds(m.ttl.count());
  info->set_label(m.label);
  info->set_replica(options_.resident.replica);
}

void GemmServiceImpl::KeepResult(QuotaReservation c_quota, const GemmShape& shape,
                                 const GemmReport& report, uint32_t ttl_seconds,
                                 v1::MatrixInfo* info) const {
  ResidentMatrix m = store_->Add(std::move(c_quota), shape.m, shape.n, report.c_resident,
                                 std::chrono::seconds(ttl_seconds), "C of " + report.kernel);
  Describe(m, info);
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
  if (absl::Status s = ResolveResident(owner, request.a_handle(),
                                       request.b_handle(), request.keep_c_resident(), &job,
                                       c_quota.get());
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
  job.deadline = SteadyDeadline(context);
  job.is_cancelled = [context] { return context->IsCancelled(); };
  job.traceparent = CallTraceparent(context);
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

// Bytes of a client's pending-operand budget (ServiceOptions::max_client_pending_bytes) that a
// streamed GEMM holds until its chunks are all in.
class PendingCharge {
 public:
  PendingCharge() = default;
  PendingCharge(const PendingCharge&) = delete;
  PendingCharge& operator=(const PendingCharge&) = delete;
  ~PendingCharge() { Release(); }

  // Takes `bytes` for `owner`, or says why not.
  absl::Status Take(GemmServiceImpl* service, const std::string& owner, int64_t bytes) {
    Release();
    if (absl::Status s = service->ChargePending(owner, bytes); !s.ok()) return s;
    service_ = service, owner_ = owner, bytes_ = bytes;
    return absl::OkStatus();
  }
  void Release() {
    if (service_ != nullptr) std::exchange(service_, nullptr)->ReleasePending(owner_, bytes_);
  }

 private:
  GemmServiceImpl* service_ = nullptr;
  std::string owner_;
  int64_t bytes_ = 0;
};

// One GemmStream call. Reads are sequential; each chunk is handed to the upload queue as it
// arrives, so operands reach the device while the rest of the stream is still on the wire; a
// GEMM is enqueued when its last chunk has been copied. Completions arrive on scheduler threads;
// the write queue is drained one message at a time. A GEMM refused for any reason of its own is
// answered at once. Finish happens once the client has stopped sending (or broke a rule, or the
// server is draining and nothing is half-received), every copy and every admitted GEMM is done
// and every answer is written.
class GemmStreamReactor final
    : public grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>,
      public GemmServiceImpl::TrackedCall {
 public:
  GemmStreamReactor(GemmServiceImpl& service, grpc::CallbackServerContext* context,
                    std::string owner)
      : service_(service),
        context_(context),
        owner_(std::move(owner)),
        assembler_(service.options_.rules, service.options_.max_stream_pending_bytes) {
    StartRead(&request_);
    service_.Track(this);  // after StartRead: a drain may finish the call at once
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ok) {  // the client closed its side, or the call was cancelled
      if (std::vector<uint64_t> ids = assembler_.Incomplete(); !ids.empty() && error_.ok()) {
        error_ = status::InvalidArgument(
            "stream", fmt::format("closed by the client while gemm_id {} was incomplete",
                                  fmt::join(ids, ", ")));
      }
      reads_done_ = true;
      return MaybeFinishLocked();
    }
    if (finished_) return;  // drained meanwhile: nothing more is read
    StreamEvent event;
    absl::Status s = assembler_.Consume(request_, &event);
    if (s.ok()) {
      reading_ = true;  // the message is being acted on: the call can't finish under it
      lock.unlock();
      try {
        if (event.header) Start(std::move(*event.header));
        if (event.chunk) Place(std::move(*event.chunk));
      } catch (...) {
        s = status::FromCurrentException("GemmStream");
      }
      lock.lock();
      reading_ = false;
    }
    if (!s.ok()) {
      spdlog::debug("GemmStream broken: {}", status::Message(s));
      if (error_.ok()) error_ = s;
      reads_done_ = true;  // stop reading; answer what was admitted, then fail the call
    }
    MaybeFinishLocked();
    if (!reads_done_ && !finished_) StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      outgoing_.clear();  // the client is gone; nothing more can be delivered
      broken_ = true;
    }
    NextWriteLocked();
    MaybeFinishLocked();
  }

  void OnDone() override {
    service_.Untrack(this);
    { std::lock_guard<std::mutex> lock(mu_); }  // whoever called Finish has let go of mu_
    delete this;
  }

  void Drain() override {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    MaybeFinishLocked();
  }

  void ExpireIdle(Clock::time_point cutoff) override {
    std::vector<std::shared_ptr<Call>> expired;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = receiving_.begin(); it != receiving_.end();) {
        if (it->second->last_chunk >= cutoff) {
          ++it;
          continue;
        }
        assembler_.Refuse(it->first);
        expired.push_back(it->second);
        it = receiving_.erase(it);
      }
    }
    for (const std::shared_ptr<Call>& call : expired) {
      call->refused = status::Idle(fmt::format(
          "gemm_id {}: no chunk for {} s; its operands were dropped", call->streamed.gemm_id,
          service_.options_.idle_timeout.count()));
      Submit(call);
    }
  }

 private:
  // One GEMM of the stream, from its header until its answer is written.
  struct Call {
    explicit Call(AnnouncedGemm header)
        : streamed(std::move(header)),
          tally(streamed.refused.ok() ? streamed.ChunkedBytes() : 0) {}
    AnnouncedGemm streamed;  // its job gets the resident operands and the chunks' buffers
    // Not OK: answered with it instead of run (refused at its header, idle, or a copy failed).
    absl::Status refused;
    WriteTally tally;       // guarded by mu_
    PendingCharge pending;  // its chunked bytes, until they are all in
    Clock::time_point last_chunk;  // guarded by mu_; while in receiving_
    // The answer (guarded by mu_ once the GEMM is submitted):
    std::string c;
    int64_t c_ready = 0;     // C's bytes [0, c_ready) are final: they may be written out
    int64_t next_offset = 0;  // C's bytes before it are written out
    bool queued = false;      // in outgoing_
    bool completed = false;   // status, report and c_matrix are set
    absl::Status status;
    GemmReport report;
    v1::MatrixInfo c_matrix;  // a kept C
    QuotaReservation c_quota;  // for a kept C, until it is added to the store
  };

  void Start(AnnouncedGemm header) {
    auto call = std::make_shared<Call>(std::move(header));
    call->refused = call->streamed.refused;
    if (call->refused.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (draining_) call->refused = status::ShuttingDown();
      }
      if (call->refused.ok()) call->refused = Prepare(*call);
      if (!call->refused.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        assembler_.Refuse(call->streamed.gemm_id);  // its chunks are dropped from here on
      }
    }
    // Refused: answered at once, so the client learns it before sending all of its chunks.
    if (!call->refused.ok() || call->streamed.ChunkedBytes() == 0) return Submit(call);
    std::lock_guard<std::mutex> lock(mu_);
    call->last_chunk = Clock::now();
    receiving_[call->streamed.gemm_id] = call;
  }

  // Resolves handles and allocates where the chunked operands go, on the device the GEMM will
  // run on: the device of its resident operands, else the least loaded one.
  absl::Status Prepare(Call& call) {
    AnnouncedGemm& gemm = call.streamed;
    GemmJob& job = gemm.job;
    if (absl::Status s = service_.scheduler_->CheckSize(job.shape); !s.ok()) return s;
    if (absl::Status s = service_.ResolveResident(owner_, gemm.a_handle, gemm.b_handle,
                                                  gemm.keep_c, &job, &call.c_quota);
        !s.ok()) {
      return s;
    }
    if (gemm.ChunkedBytes() == 0) return absl::OkStatus();
    if (absl::Status s = call.pending.Take(&service_, owner_, gemm.ChunkedBytes()); !s.ok()) {
      return status::WithContext(fmt::format("gemm_id {}", gemm.gemm_id), s);
    }
    if (job.device_index < 0) job.device_index = service_.scheduler_->LeastLoadedDevice();
    for (auto [chunked, bytes, buffer] :
         {std::tuple{gemm.a_handle.empty(), job.shape.ABytes(), &job.a_resident},
          std::tuple{gemm.b_handle.empty(), job.shape.BBytes(), &job.b_resident}}) {
      if (!chunked) continue;
      absl::Status s = service_.backend_->AllocateResident(job.device_index, bytes, buffer);
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        // The GEMM fits the limits (CheckSize): the memory is taken by other work for now.
        return status::QueueFull("device memory is busy: " + status::Message(s));
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  void Place(OperandChunk chunk) {
    std::shared_ptr<Call> call;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = receiving_.find(chunk.gemm_id);
      if (it == receiving_.end()) return;  // expired between the assembler and here: dropped
      call = it->second;
      call->last_chunk = Clock::now();
      if (chunk.last) receiving_.erase(it);
      writes_in_flight_++;
    }
    const GemmJob& job = call->streamed.job;
    const int64_t size = chunk.data.size();
    if (service_.metrics_ != nullptr) service_.metrics_->AddReceivedBytes(Rpc::kGemmStream, size);
    service_.uploads_->Write(
        chunk.operand == v1::OPERAND_A ? job.a_resident : job.b_resident, chunk.offset,
        std::move(chunk.data), [this, call, size](const absl::Status& s, double copy_ms) {
          bool written;
          {
            std::lock_guard<std::mutex> lock(mu_);
            written = call->tally.Add(s, size, copy_ms);
            if (written) call->refused = call->tally.error();
          }
          if (written) Submit(call);
          std::lock_guard<std::mutex> lock(mu_);
          writes_in_flight_--;
          MaybeFinishLocked();
        });
  }

  // Enqueues the GEMM, or answers it with the reason it was refused.
  void Submit(std::shared_ptr<Call> call) {
    call->pending.Release();  // its chunks are all in (or no more are awaited)
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_++;
    }
    GemmJob job = call->streamed.job;
    call->streamed.job.a_resident.reset();  // the job holds the operands until it has run
    call->streamed.job.b_resident.reset();
    if (!call->refused.ok()) return Complete(call, call->refused, GemmReport{});
    absl::Status s;
    try {
      if (!job.keep_c) {
        call->c = service_.result_buffers_.Take(job.shape.CBytes());
        job.c = reinterpret_cast<uint16_t*>(call->c.data());
      }
      job.deadline = SteadyDeadline(context_);
      job.is_cancelled = [this] { return context_->IsCancelled(); };
      job.traceparent = CallTraceparent(context_);
      // C goes out chunk by chunk while the rest of it is still coming off the device.
      job.c_progress = [this, call](int64_t ready) {
        std::lock_guard<std::mutex> lock(mu_);
        call->c_ready = ready;
        QueueLocked(call);
        NextWriteLocked();
      };
      s = service_.scheduler_->Enqueue(
          std::move(job), [this, call](const absl::Status& status, const GemmReport& report) {
            Complete(call, status, report);
          });
    } catch (...) {  // before the scheduler took it: answered here
      s = status::FromCurrentException("GemmStream");
    }
    if (!s.ok()) Complete(call, s, GemmReport{});
  }

  void Complete(std::shared_ptr<Call> call, const absl::Status& status, const GemmReport& report) {
    v1::MatrixInfo c_matrix;
    if (status.ok() && report.c_resident) {
      service_.KeepResult(std::move(call->c_quota), call->streamed.job.shape, report,
                          call->streamed.c_ttl_seconds, &c_matrix);
    }
    std::lock_guard<std::mutex> lock(mu_);
    call->status = status;
    call->report = report;
    call->report.c_resident.reset();  // the store holds a kept C now
    call->report.host_to_device_ms += call->tally.copy_ms();
    call->c_matrix = std::move(c_matrix);
    if (status.ok()) {
      call->c_ready = call->c.size();
    } else {  // chunks already sent are void: the client drops C on an error
      service_.result_buffers_.Give(std::exchange(call->c, {}));
      call->c_ready = 0;
    }
    call->completed = true;
    in_flight_--;
    QueueLocked(call);
    NextWriteLocked();
    MaybeFinishLocked();
  }

  void QueueLocked(const std::shared_ptr<Call>& call) {
    if (call->queued || broken_) return;
    call->queued = true;
    outgoing_.push_back(call);
  }

  void NextWriteLocked() {
    if (writing_ || outgoing_.empty()) return;
    Call& out = *outgoing_.front();
    const AnnouncedGemm& gemm = out.streamed;
    const int64_t chunk_bytes = service_.options_.stream_chunk_bytes;
    const int64_t ready = out.c_ready - out.next_offset;
    // Whole chunks while C is still coming off the device; the rest once it is all there.
    if (ready >= chunk_bytes || (ready > 0 && out.c_ready == int64_t(out.c.size()))) {
      // chunk_message_ stays a chunk, so its 1 MiB buffer is reused: reallocating it per
      // message (as Clear() on the oneof would) cost more than the copy itself.
      const int64_t size = std::min(chunk_bytes, ready);
      chunk_message_.set_gemm_id(gemm.gemm_id);
      v1::ResultChunk* chunk = chunk_message_.mutable_chunk();
      chunk->set_offset(out.next_offset);
      chunk->set_data(out.c.data() + out.next_offset, size);
      out.next_offset += size;
      if (service_.metrics_ != nullptr) service_.metrics_->AddSentBytes(Rpc::kGemmStream, size);
      writing_ = true;
      StartWrite(&chunk_message_);
      return;
    }
    if (!out.completed) return;  // more of C, or the answer, is still to come
    done_message_.Clear();
    done_message_.set_gemm_id(gemm.gemm_id);
    v1::GemmDone* done = done_message_.mutable_done();
    const grpc::Status answer = ToGrpcStatus(out.status);
    done->set_status_code(answer.error_code());
    done->set_status_message(answer.error_message());
    done->set_request_id(gemm.job.request_id);
    service_.Answered(Rpc::kGemmStream, out.status, context_, owner_, gemm.job.request_id,
                      gemm.gemm_id);
    if (out.status.ok()) {
      if (service_.metrics_ != nullptr) {
        service_.metrics_->ObserveGemm(out.report, out.report.Tflops(gemm.job.shape));
      }
      ToProto(gemm.job.shape, out.report, done->mutable_timing(), done->mutable_execution());
      done->mutable_execution()->set_backend(service_.backend_->Name());
      if (gemm.keep_c) *done->mutable_c_matrix() = out.c_matrix;
    }
    assembler_.Release(gemm.gemm_id);
    service_.result_buffers_.Give(std::move(out.c));
    outgoing_.pop_front();
    writing_ = true;
    StartWrite(&done_message_);
  }

  void MaybeFinishLocked() {
    if (finished_ || reading_ || in_flight_ > 0 || writes_in_flight_ > 0 || writing_ ||
        !outgoing_.empty()) {
      return;
    }
    // Draining, a stream with nothing half-received ends now (a read may be outstanding:
    // Finish is allowed then, and that read completes with ok = false).
    if (!reads_done_ && !(draining_ && receiving_.empty())) return;
    finished_ = true;
    absl::Status s = error_;
    if (broken_ || context_->IsCancelled()) {
      s = status::Cancelled();
    } else if (!reads_done_) {
      s = status::ShuttingDown();
    }
    service_.StreamEnded(s, context_, owner_);
    Finish(ToGrpcStatus(s));
  }

  GemmServiceImpl& service_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  v1::GemmStreamRequest request_;  // the read in flight

  std::mutex mu_;
  StreamAssembler assembler_;                             // guarded by mu_
  absl::Status error_;                                    // guarded by mu_; the call's final status
  bool reads_done_ = false;                               // guarded by mu_
  std::map<uint64_t, std::shared_ptr<Call>> receiving_;  // guarded by mu_; chunks still to come
  int64_t writes_in_flight_ = 0;                          // guarded by mu_; chunks being copied
  int64_t in_flight_ = 0;                                 // guarded by mu_; submitted, not completed
  std::deque<std::shared_ptr<Call>> outgoing_;            // guarded by mu_
  v1::GemmStreamResponse chunk_message_;                  // guarded by mu_; written C chunks
  v1::GemmStreamResponse done_message_;                   // guarded by mu_; written GemmDones
  bool writing_ = false;                                  // guarded by mu_
  bool broken_ = false;                                   // guarded by mu_; a write failed
  bool reading_ = false;  // guarded by mu_; a message is being acted on outside mu_
  bool draining_ = false;                                 // guarded by mu_; see Drain()
  bool finished_ = false;                                 // guarded by mu_
};

grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>*
GemmServiceImpl::GemmStream(grpc::CallbackServerContext* context) {
  Principal caller;
  if (absl::Status s = Identify(Rpc::kGemmStream, context, &caller); !s.ok()) {
    return new RefusedCall<grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>>(s);
  }
  return new GemmStreamReactor(*this, context, std::move(caller.name));
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

// UploadMatrix: the header allocates the matrix where it will live; each chunk is handed to the
// upload queue as it arrives; the matrix is registered once the client is done and every copy
// has landed.
class UploadMatrixReactor final : public grpc::ServerReadReactor<v1::UploadMatrixRequest>,
                                  public GemmServiceImpl::TrackedCall {
 public:
  UploadMatrixReactor(GemmServiceImpl& service, grpc::CallbackServerContext* context,
                      std::string owner, v1::MatrixInfo* response)
      : service_(service),
        context_(context),
        owner_(std::move(owner)),
        response_(response) {
    StartRead(&request_);
    service_.Track(this);
  }

  void OnReadDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reads_done_) return;  // timed out meanwhile: nothing more is read
      reading_ = true;  // the message is being acted on: the call can't finish under it
      last_read_ = Clock::now();
    }
    absl::Status s;
    bool more = false;
    try {
      if (!ok) {  // the client has sent everything (or went away)
        if (!buffer_) {
          s = status::InvalidArgument("header", "no header was sent");
        } else if (received_ != buffer_->bytes) {
          s = status::InvalidArgument(
              "chunk", fmt::format("the stream ended after {} of the matrix's {} bytes",
                                   received_, buffer_->bytes));
        }
      } else {
        s = buffer_ ? ConsumeChunk() : ConsumeHeader();
        more = s.ok();
      }
    } catch (...) {
      s = status::FromCurrentException("UploadMatrix");
      more = false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
    if (more) return StartRead(&request_);
    error_ = s;
    reads_done_ = true;
    MaybeFinishLocked();
  }

  void OnDone() override {
    service_.Untrack(this);
    {
      std::lock_guard<std::mutex> lock(mu_);  // whoever called Finish has let go of mu_
      // Only now is IsCancelled() exact: a cancellation can reach the reactor after the reads
      // ended and the matrix was registered; the client never learns that handle.
      if (!registered_.empty() && context_->IsCancelled()) {
        int64_t freed = 0;
        service_.store_->Release(owner_, registered_, &freed);
      }
    }
    delete this;
  }

  void Drain() override {}  // an upload in progress gets the drain deadline

  void ExpireIdle(Clock::time_point cutoff) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reads_done_ || reading_ || last_read_ >= cutoff) return;
    error_ = status::Idle(fmt::format("UploadMatrix: no message for {} s; the upload was dropped",
                                      service_.options_.idle_timeout.count()));
    reads_done_ = true;  // the read outstanding completes after Finish, and is ignored
    MaybeFinishLocked();
  }

 private:
  absl::Status ConsumeHeader() {
    if (!request_.has_header()) {
      return status::InvalidArgument("header", "the first message must be a header");
    }
    header_ = request_.header();
    GemmShape shape;  // validate rows x cols as the m x k of a GEMM
    if (header_.rows() == 0) return status::InvalidArgument("header.rows", "must be at least 1");
    if (header_.cols() == 0) return status::InvalidArgument("header.cols", "must be at least 1");
    if (absl::Status s = ValidateShape(header_.rows(), 1, header_.cols(), service_.options_.rules,
                                       &shape);
        !s.ok()) {
      return s;
    }
    if (header_.label().size() > kMaxRequestIdBytes) {
      return status::InvalidArgument("header.label", "at most 128 bytes");
    }
    int device_index = -1;
    if (header_.has_device_id()) {
      const auto devices = service_.backend_->Devices();
      auto it = std::find_if(devices.begin(), devices.end(),
                             [&](const DeviceDescription& d) { return d.id == header_.device_id(); });
      if (it == devices.end()) {
        return status::InvalidArgument("header.device_id",
                                       fmt::format("no device {} on this server", header_.device_id()));
      }
      device_index = int(it - devices.begin());
    }
    std::shared_ptr<ResidentBuffer> buffer;
    if (absl::Status s = service_.store_->Allocate(owner_, device_index, header_.rows(),
                                                   header_.cols(), &buffer, &quota_);
        !s.ok()) {
      return s;
    }
    std::lock_guard<std::mutex> lock(mu_);
    tally_.emplace(buffer->bytes);
    buffer_ = std::move(buffer);
    return absl::OkStatus();
  }

  absl::Status ConsumeChunk() {
    if (!request_.has_chunk()) return status::InvalidArgument("header", "sent twice");
    const int64_t size = request_.chunk().size();
    if (received_ + size > buffer_->bytes) {
      return status::InvalidArgument(
          "chunk", fmt::format("past the end: {} + {} bytes of a {}-byte matrix", received_, size,
                               buffer_->bytes));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      writes_in_flight_++;
    }
    if (service_.metrics_ != nullptr) service_.metrics_->AddReceivedBytes(Rpc::kUploadMatrix, size);
    service_.uploads_->Write(buffer_, received_, std::move(*request_.mutable_chunk()),
                             [this, size](const absl::Status& s, double copy_ms) {
                               std::lock_guard<std::mutex> lock(mu_);
                               tally_->Add(s, size, copy_ms);
                               writes_in_flight_--;
                               MaybeFinishLocked();
                             });
    received_ += size;
    return absl::OkStatus();
  }

  void MaybeFinishLocked() {
    if (finished_ || !reads_done_ || reading_ || writes_in_flight_ > 0) return;
    finished_ = true;
    absl::Status s = error_.ok() ? tally_->error() : error_;
    // A client that cancelled won't learn the handle: registering the matrix would leak it.
    if (s.ok() && context_->IsCancelled()) s = status::Cancelled();
    if (s.ok()) {
      ResidentMatrix m = service_.store_->Add(std::move(quota_), header_.rows(), header_.cols(),
                                              std::move(buffer_),
                                              std::chrono::seconds(header_.ttl_seconds()),
                                              header_.label());
      service_.Describe(m, response_);
      registered_ = m.handle;
    } else {  // given back before the client hears of it, so that it can retry at once
      quota_ = QuotaReservation();
      buffer_.reset();
    }
    service_.Answered(Rpc::kUploadMatrix, s, context_, owner_);
    Finish(ToGrpcStatus(s));
  }

  GemmServiceImpl& service_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  v1::MatrixInfo* const response_;
  v1::UploadMatrixRequest request_;  // the read in flight
  v1::MatrixHeader header_;
  int64_t received_ = 0;
  QuotaReservation quota_;  // the matrix's bytes of the client's quota, from the header on
  std::string registered_;  // guarded by mu_; the handle, once the matrix is in the store

  std::mutex mu_;
  // Where the matrix goes: set by the header, moved into the store once the reads are done.
  std::shared_ptr<ResidentBuffer> buffer_;
  std::optional<WriteTally> tally_;         // guarded by mu_
  int64_t writes_in_flight_ = 0;            // guarded by mu_
  absl::Status error_;                      // guarded by mu_; a broken rule
  bool reads_done_ = false;                 // guarded by mu_
  bool reading_ = false;                    // guarded by mu_; a message is being acted on
  Clock::time_point last_read_ = Clock::now();  // guarded by mu_
  bool finished_ = false;                   // guarded by mu_
};

grpc::ServerReadReactor<v1::UploadMatrixRequest>* GemmServiceImpl::UploadMatrix(
    grpc::CallbackServerContext* context, v1::MatrixInfo* response) {
  Principal caller;
  if (absl::Status s = Identify(Rpc::kUploadMatrix, context, &caller); !s.ok()) {
    return new RefusedCall<grpc::ServerReadReactor<v1::UploadMatrixRequest>>(s);
  }
  return new UploadMatrixReactor(*this, context, std::move(caller.name), response);
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

// DownloadMatrix: the device copy runs on its own thread, then the chunks go out one by one.
class DownloadMatrixReactor final : public grpc::ServerWriteReactor<v1::ResultChunk> {
 public:
  DownloadMatrixReactor(const GemmServiceImpl& service, grpc::CallbackServerContext* context,
                        std::string owner, const v1::DownloadMatrixRequest& request)
      : service_(service),
        context_(context),
        owner_(std::move(owner)),
        chunk_bytes_(service.options_.stream_chunk_bytes),
        buffers_(service.result_buffers_) {
    ResidentMatrix m;
    absl::Status s = service.store_->Lookup(owner_, request.handle(), "handle", &m);
    if (!s.ok()) {
      Answer(s);
      return;
    }
    std::thread([this, &service, buffer = m.buffer] {
      absl::Status read;
      try {
        data_ = buffers_.Take(buffer->bytes);
        read = service.backend_->ReadResident(*buffer, data_.data());
      } catch (...) {
        read = status::FromCurrentException("DownloadMatrix");
      }
      if (!read.ok()) return Answer(read);
      NextWrite();
    }).detach();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Answer(status::Cancelled());
    NextWrite();
  }

  void OnDone() override {
    buffers_.Give(std::move(data_));
    delete this;
  }

 private:
  void Answer(const absl::Status& s) {
    service_.Answered(Rpc::kDownloadMatrix, s, context_, owner_);
    Finish(ToGrpcStatus(s));
  }

  void NextWrite() {
    if (offset_ >= int64_t(data_.size())) return Answer(absl::OkStatus());
    const int64_t size = std::min<int64_t>(chunk_bytes_, data_.size() - offset_);
    if (service_.metrics_ != nullptr) service_.metrics_->AddSentBytes(Rpc::kDownloadMatrix, size);
    chunk_.set_offset(offset_);
    chunk_.set_data(data_.data() + offset_, size);
    chunk_.set_total_bytes(offset_ == 0 ? data_.size() : 0);
    offset_ += size;
    StartWrite(&chunk_);
  }

  const GemmServiceImpl& service_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  const int64_t chunk_bytes_;
  HostBufferPool& buffers_;
  std::string data_;
  int64_t offset_ = 0;
  v1::ResultChunk chunk_;
};

grpc::ServerWriteReactor<v1::ResultChunk>* GemmServiceImpl::DownloadMatrix(
    grpc::CallbackServerContext* context, const v1::DownloadMatrixRequest* request) {
  Principal caller;
  if (absl::Status s = Identify(Rpc::kDownloadMatrix, context, &caller); !s.ok()) {
    return new RefusedCall<grpc::ServerWriteReactor<v1::ResultChunk>>(s);
  }
  return new DownloadMatrixReactor(*this, context, std::move(caller.name), *request);
}

}  // namespace hgemm
