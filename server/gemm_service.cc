#include "server/gemm_service.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <memory>
#include <mutex>

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

GemmServiceImpl::GemmServiceImpl(Scheduler* scheduler, const Backend* backend,
                                 ServiceOptions options)
    : scheduler_(scheduler), backend_(backend), options_(std::move(options)) {}

grpc::ServerUnaryReactor* GemmServiceImpl::Gemm(grpc::CallbackServerContext* context,
                                                const v1::GemmRequest* request,
                                                v1::GemmResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  GemmJob job;
  grpc::Status s = ValidateGemmRequest(*request, options_.rules, &job);
  if (!s.ok()) {
    spdlog::debug("Gemm rejected: {}", s.error_message());
    reactor->Finish(s);
    return reactor;
  }
  const GemmShape shape = job.shape;
  response->set_m(shape.m);
  response->set_n(shape.n);
  response->set_request_id(job.request_id);
  response->mutable_c()->resize(2 * shape.m * shape.n);
  job.a = HalfData(request->a());
  job.b = HalfData(request->b());
  job.c = reinterpret_cast<uint16_t*>(response->mutable_c()->data());
  job.deadline = SteadyDeadline(context);
  job.is_cancelled = [context] { return context->IsCancelled(); };
  const std::string backend_name = backend_->Name();
  s = scheduler_->Enqueue(std::move(job), [reactor, response, shape, backend_name](
                                              const grpc::Status& status, const GemmReport& report) {
    if (status.ok()) {
      ToProto(shape, report, response->mutable_timing(), response->mutable_execution());
      response->mutable_execution()->set_backend(backend_name);
    }
    reactor->Finish(status);
  });
  if (!s.ok()) reactor->Finish(s);
  return reactor;
}

// One GemmStream call. Reads are sequential; completions arrive on scheduler threads; the
// write queue is drained one message at a time. Finish happens once the client has stopped
// sending (or broke a rule), every admitted GEMM has completed and every answer is written.
class GemmStreamReactor final
    : public grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse> {
 public:
  GemmStreamReactor(const GemmServiceImpl& service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        assembler_(service.options_.rules, service.options_.max_stream_pending_bytes) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side, or the call was cancelled
      std::lock_guard<std::mutex> lock(mu_);
      if (std::vector<uint64_t> ids = assembler_.Incomplete(); !ids.empty() && error_.ok()) {
        error_ = status::InvalidArgument(
            "stream", fmt::format("closed by the client while gemm_id {} was incomplete",
                                  fmt::join(ids, ", ")));
      }
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    std::unique_ptr<AssembledGemm> complete;
    grpc::Status s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = assembler_.Consume(request_, &complete);
      if (!s.ok()) {
        spdlog::debug("GemmStream broken: {}", s.error_message());
        error_ = s;
        reads_done_ = true;  // stop reading; answer what was admitted, then fail the call
        MaybeFinishLocked();
        return;
      }
    }
    if (complete) Dispatch(std::move(complete));
    StartRead(&request_);
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

  void OnDone() override { delete this; }

 private:
  // A finished GEMM waiting to be written: C chunk by chunk, then its `done` message.
  struct Outgoing {
    std::shared_ptr<AssembledGemm> gemm;
    std::string c;
    grpc::Status status;
    GemmReport report;
    int64_t next_offset = 0;
  };

  void Dispatch(std::unique_ptr<AssembledGemm> complete) {
    auto gemm = std::shared_ptr<AssembledGemm>(std::move(complete));
    auto out = std::make_shared<Outgoing>();
    out->gemm = gemm;
    out->c.resize(2 * gemm->job.shape.m * gemm->job.shape.n);
    GemmJob job = gemm->job;
    job.a = HalfData(gemm->a);
    job.b = HalfData(gemm->b);
    job.c = reinterpret_cast<uint16_t*>(out->c.data());
    job.deadline = SteadyDeadline(context_);
    job.is_cancelled = [this] { return context_->IsCancelled(); };
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_++;
    }
    grpc::Status s = service_.scheduler_->Enqueue(
        std::move(job), [this, out](const grpc::Status& status, const GemmReport& report) {
          Complete(out, status, report);
        });
    if (!s.ok()) Complete(out, s, GemmReport{});
  }

  void Complete(std::shared_ptr<Outgoing> out, const grpc::Status& status,
                const GemmReport& report) {
    out->status = status;
    out->report = report;
    if (!status.ok()) out->c.clear();
    out->gemm->a.clear();  // operands are no longer needed; free them before C is written
    out->gemm->a.shrink_to_fit();
    out->gemm->b.clear();
    out->gemm->b.shrink_to_fit();
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_--;
    if (!broken_) outgoing_.push_back(std::move(out));
    NextWriteLocked();
    MaybeFinishLocked();
  }

  void NextWriteLocked() {
    if (writing_ || outgoing_.empty()) return;
    Outgoing& out = *outgoing_.front();
    response_.Clear();
    response_.set_gemm_id(out.gemm->gemm_id);
    const int64_t c_bytes = out.c.size();
    if (out.next_offset < c_bytes) {
      const int64_t size = std::min(service_.options_.stream_chunk_bytes, c_bytes - out.next_offset);
      v1::ResultChunk* chunk = response_.mutable_chunk();
      chunk->set_offset(out.next_offset);
      chunk->set_data(out.c.data() + out.next_offset, size);
      out.next_offset += size;
    } else {
      v1::GemmDone* done = response_.mutable_done();
      done->set_status_code(out.status.error_code());
      done->set_status_message(out.status.error_message());
      done->set_request_id(out.gemm->job.request_id);
      if (out.status.ok()) {
        ToProto(out.gemm->job.shape, out.report, done->mutable_timing(), done->mutable_execution());
        done->mutable_execution()->set_backend(service_.backend_->Name());
      }
      assembler_.Release(out.gemm->gemm_id);
      outgoing_.pop_front();
    }
    writing_ = true;
    StartWrite(&response_);
  }

  void MaybeFinishLocked() {
    if (finished_ || !reads_done_ || in_flight_ > 0 || writing_ || !outgoing_.empty()) return;
    finished_ = true;
    if (broken_ || context_->IsCancelled()) {
      Finish(status::Cancelled());
    } else {
      Finish(error_);
    }
  }

  const GemmServiceImpl& service_;
  grpc::CallbackServerContext* const context_;
  v1::GemmStreamRequest request_;  // the read in flight

  std::mutex mu_;
  StreamAssembler assembler_;                       // guarded by mu_
  grpc::Status error_;                              // guarded by mu_; the call's final status
  bool reads_done_ = false;                         // guarded by mu_
  int64_t in_flight_ = 0;                           // guarded by mu_; admitted, not completed
  std::deque<std::shared_ptr<Outgoing>> outgoing_;  // guarded by mu_
  v1::GemmStreamResponse response_;                 // guarded by mu_; the write in flight
  bool writing_ = false;                            // guarded by mu_
  bool broken_ = false;                             // guarded by mu_; a write failed
  bool finished_ = false;                           // guarded by mu_
};

grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>*
GemmServiceImpl::GemmStream(grpc::CallbackServerContext* context) {
  return new GemmStreamReactor(*this, context);
}

grpc::ServerUnaryReactor* GemmServiceImpl::ListKernels(grpc::CallbackServerContext* context,
                                                       const v1::ListKernelsRequest*,
                                                       v1::ListKernelsResponse* response) {
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
  auto_kernel->add_accumulations(v1::ACCUMULATION_FP16);
  auto_kernel->add_accumulations(v1::ACCUMULATION_FP32);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GemmServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetServerInfoRequest*,
                                                         v1::ServerInfo* response) {
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
  const Scheduler::Stats stats = scheduler_->GetStats();
  v1::Load* load = response->mutable_load();
  load->set_queued(stats.queued);
  load->set_running(stats.running);
  load->set_admitted_bytes(stats.admitted_bytes);
  load->set_admitted_total(stats.admitted_total);
  load->set_completed_total(stats.completed_total);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace hgemm
