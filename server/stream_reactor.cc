#include "server/stream_reactor.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "server/convert.h"
#include "server/core/status.h"
#include "server/status_util.h"
#include "server/stream_assembler.h"

namespace hgemm {

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

// One GemmStream call (see stream_reactor.h). A GEMM refused for any reason of its own is
// answered at once. Finish happens once the client has stopped sending (or broke a rule, or the
// server is draining and nothing is half-received), every allocation, copy and admitted GEMM is
// done and every answer is written.
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
        it->second->dropped = true;
        it->second->early_chunks.clear();
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
    // Where its chunks go is allocated (on an upload thread); until then they wait here.
    bool allocated = false;                 // guarded by mu_
    std::vector<OperandChunk> early_chunks;  // guarded by mu_
    // Answered before its chunks were all in (idle, or no memory): chunks are dropped.
    bool dropped = false;  // guarded by mu_
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
      if (call->refused.ok()) call->refused = Admit(*call);
      if (!call->refused.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        assembler_.Refuse(call->streamed.gemm_id);  // its chunks are dropped from here on
      }
    }
    // Refused: answered at once, so the client learns it before sending all of its chunks.
    if (!call->refused.ok() || call->streamed.ChunkedBytes() == 0) return Submit(call);
    const GemmJob& job = call->streamed.job;
    const int device = service_.resolver_.PlaceArriving(&call->streamed.job);
    const int64_t a_bytes = call->streamed.a_handle.empty() ? job.shape.ABytes() : 0;
    const int64_t b_bytes = call->streamed.b_handle.empty() ? job.shape.BBytes() : 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      call->last_chunk = Clock::now();
      receiving_[call->streamed.gemm_id] = call;
      allocations_in_flight_++;
    }
    service_.uploads_->Post([this, call, device, a_bytes, b_bytes] {
      std::shared_ptr<ResidentBuffer> a, b;
      absl::Status s;
      try {
        s = AllocateArriving(device, a_bytes, &a);
        if (s.ok()) s = AllocateArriving(device, b_bytes, &b);
      } catch (...) {
        s = status::FromCurrentException("GemmStream");
      }
      Allocated(call, s, std::move(a), std::move(b));
    });
  }

  // Resolves handles and reserves what the GEMM will hold (no device work): the size limits,
  // its resident operands and kept C (ResidentResolver), its chunked bytes of the client's
  // pending budget.
  absl::Status Admit(Call& call) {
    AnnouncedGemm& gemm = call.streamed;
    if (absl::Status s = service_.scheduler_->CheckSize(gemm.job.shape); !s.ok()) return s;
    if (absl::Status s = service_.resolver_.Resolve(
            owner_, {.a_handle = gemm.a_handle, .b_handle = gemm.b_handle, .keep_c = gemm.keep_c},
            &gemm.job, &call.c_quota);
        !s.ok()) {
      return s;
    }
    if (gemm.ChunkedBytes() == 0) return absl::OkStatus();
    if (absl::Status s = call.pending.Take(&service_, owner_, gemm.ChunkedBytes()); !s.ok()) {
      return status::WithContext(fmt::format("gemm_id {}", gemm.gemm_id), s);
    }
    return absl::OkStatus();
  }

  // On an upload thread: a buffer of `bytes` (none for 0: the operand is resident) on
  // `device`, where the GEMM will run.
  absl::Status AllocateArriving(int device, int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer) {
    if (bytes == 0) return absl::OkStatus();
    absl::Status s = service_.backend_->AllocateResident(device, bytes, buffer);
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      // The GEMM fits the limits (CheckSize): the memory is taken by other work for now.
      return status::QueueFull("device memory is busy: " + status::Message(s));
    }
    return s;
  }

  // On an upload thread: where the chunks go is allocated (or why not). Writes the chunks that
  // came meanwhile, or answers the GEMM.
  void Allocated(const std::shared_ptr<Call>& call, const absl::Status& s,
                 std::shared_ptr<ResidentBuffer> a, std::shared_ptr<ResidentBuffer> b) {
    std::vector<OperandChunk> early;
    bool refuse = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (call->dropped) {
        // Expired meanwhile: answered already; `a` and `b` are freed below, without mu_.
      } else if (!s.ok()) {
        call->dropped = true;
        call->early_chunks.clear();
        receiving_.erase(call->streamed.gemm_id);
        assembler_.Refuse(call->streamed.gemm_id);
        refuse = true;
      } else {
        if (a) call->streamed.job.a_resident = std::move(a);
        if (b) call->streamed.job.b_resident = std::move(b);
        call->allocated = true;
        early.swap(call->early_chunks);
        writes_in_flight_ += int64_t(early.size());
      }
    }
    if (refuse) {
      call->refused = s;
      Submit(call);
    }
    for (OperandChunk& chunk : early) CopyChunk(call, std::move(chunk));
    std::lock_guard<std::mutex> lock(mu_);
    allocations_in_flight_--;
    MaybeFinishLocked();
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
      if (service_.metrics_ != nullptr) {
        service_.metrics_->AddReceivedBytes(Rpc::kGemmStream, int64_t(chunk.data.size()));
      }
      if (!call->allocated) {
        call->early_chunks.push_back(std::move(chunk));
        return;
      }
      writes_in_flight_++;
    }
    CopyChunk(call, std::move(chunk));
  }

  // Copies a chunk into the GEMM's operand; the last one submits the GEMM.
  // REQUIRES: call->allocated; writes_in_flight_ counts this write.
  void CopyChunk(const std::shared_ptr<Call>& call, OperandChunk chunk) {
    const GemmJob& job = call->streamed.job;
    const int64_t size = chunk.data.size();
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
      job.deadline = SteadyDeadline(*context_);
      job.is_cancelled = [this] { return context_->IsCancelled(); };
      job.traceparent = CallTraceparent(*context_);
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
    if (finished_ || reading_ || in_flight_ > 0 || writes_in_flight_ > 0 ||
        allocations_in_flight_ > 0 || writing_ || !outgoing_.empty()) {
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
  int64_t allocations_in_flight_ = 0;                     // guarded by mu_; on upload threads
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

grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>* NewGemmStreamReactor(
    GemmServiceImpl& service, grpc::CallbackServerContext* context, std::string owner) {
  return new GemmStreamReactor(service, context, std::move(owner));
}

}  // namespace hgemm
