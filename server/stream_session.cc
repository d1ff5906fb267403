#include "server/stream_session.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "server/core/status.h"

namespace hgemm {

absl::Status ClientPendingBudget::Charge(const std::string& owner, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_bytes_.find(owner);
  const int64_t held = it == pending_bytes_.end() ? 0 : it->second;
  if (bytes > max_bytes_per_client_ - held) {
    return status::OverLimit(fmt::format(
        "its operands ({} bytes) would put this client's incomplete streamed GEMMs over {} "
        "bytes (--max_client_pending_bytes; {} pending now)",
        bytes, max_bytes_per_client_, held));
  }
  pending_bytes_[owner] = held + bytes;
  return absl::OkStatus();
}

void ClientPendingBudget::Release(const std::string& owner, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_bytes_.find(owner);
  if (it != pending_bytes_.end() && (it->second -= bytes) <= 0) pending_bytes_.erase(it);
}

namespace {

// Bytes of a client's ClientPendingBudget that a streamed GEMM holds until its chunks are all
// in.
class PendingCharge {
 public:
  PendingCharge() = default;
  PendingCharge(const PendingCharge&) = delete;
  PendingCharge& operator=(const PendingCharge&) = delete;
  ~PendingCharge() { Release(); }

  // Takes `bytes` for `owner`, or says why not.
  absl::Status Take(ClientPendingBudget* budget, const std::string& owner, int64_t bytes) {
    Release();
    if (absl::Status s = budget->Charge(owner, bytes); !s.ok()) return s;
    budget_ = budget, owner_ = owner, bytes_ = bytes;
    return absl::OkStatus();
  }
  void Release() {
    if (budget_ != nullptr) std::exchange(budget_, nullptr)->Release(owner_, bytes_);
  }

 private:
  ClientPendingBudget* budget_ = nullptr;
  std::string owner_;
  int64_t bytes_ = 0;
};

}  // namespace

// One GEMM of the stream, from its header until its answer is written.
struct StreamSession::Gemm {
  explicit Gemm(AnnouncedGemm header)
      : streamed(std::move(header)),
        tally(streamed.refused.ok() ? streamed.ChunkedBytes() : 0) {}
  AnnouncedGemm streamed;  // its job gets the resident operands and the chunks' buffers
  // Not OK: answered with it instead of run (refused at its header, idle, or a copy failed).
  absl::Status refused;
  WriteTally tally;       // guarded by mu_
  PendingCharge pending;  // its chunked bytes, until they are all in
  Clock::time_point last_chunk;  // guarded by mu_; while in receiving_
  // Where its chunks go is allocated (on an upload thread); until then they wait here.
  bool allocated = false;                  // guarded by mu_
  std::vector<OperandChunk> early_chunks;  // guarded by mu_
  // Answered before its chunks were all in (idle, or no memory): chunks are dropped.
  bool dropped = false;  // guarded by mu_
  // The answer (guarded by mu_ once the GEMM is submitted):
  std::string c;
  int64_t c_ready = 0;      // C's bytes [0, c_ready) are final: they may be written out
  int64_t next_offset = 0;  // C's bytes before it are written out
  bool queued = false;      // in outgoing_
  bool completed = false;   // status, report and kept_c are set
  absl::Status status;
  GemmReport report;
  ResidentMatrix kept_c;     // a kept C, now in the store
  QuotaReservation c_quota;  // for a kept C, until it is added to the store
};

StreamSession::StreamSession(const StreamServices& services, StreamTransport* transport,
                             std::string owner, Clock::time_point deadline,
                             std::string traceparent)
    : services_(services),
      transport_(transport),
      owner_(std::move(owner)),
      deadline_(deadline),
      traceparent_(std::move(traceparent)),
      assembler_(*services.rules, services.max_stream_pending_bytes) {}

StreamSession::~StreamSession() {
  std::lock_guard<std::mutex> lock(mu_);  // whoever called Finish has let go of mu_
}

void StreamSession::OnReadsDone() {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::vector<uint64_t> ids = assembler_.Incomplete(); !ids.empty() && error_.ok()) {
    error_ = status::InvalidArgument(
        "stream", fmt::format("closed by the client while gemm_id {} was incomplete",
                              fmt::join(ids, ", ")));
  }
  reads_done_ = true;
  MaybeFinishLocked();
}

void StreamSession::OnRead(v1::GemmStreamRequest& message) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) return;  // drained meanwhile: nothing more is read
  StreamEvent event;
  absl::Status s = assembler_.Consume(message, &event);
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
  if (!reads_done_ && !finished_) transport_->StartRead();
}

void StreamSession::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) {
    outgoing_.clear();  // the client is gone; nothing more can be delivered
    broken_ = true;
  }
  NextWriteLocked();
  MaybeFinishLocked();
}

void StreamSession::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  MaybeFinishLocked();
}

void StreamSession::ExpireIdle(Clock::time_point cutoff) {
  std::vector<std::shared_ptr<Gemm>> expired;
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
  for (const std::shared_ptr<Gemm>& gemm : expired) {
    gemm->refused = status::Idle(fmt::format("gemm_id {}: no chunk for {} s; its operands were dropped",
                                             gemm->streamed.gemm_id, services_.idle_timeout.count()));
    Submit(gemm);
  }
}

void StreamSession::Start(AnnouncedGemm header) {
  auto gemm = std::make_shared<Gemm>(std::move(header));
  gemm->refused = gemm->streamed.refused;
  if (gemm->refused.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (draining_) gemm->refused = status::ShuttingDown();
    }
    if (gemm->refused.ok()) gemm->refused = Admit(*gemm);
    if (!gemm->refused.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      assembler_.Refuse(gemm->streamed.gemm_id);  // its chunks are dropped from here on
    }
  }
  // Refused: answered at once, so the client learns it before sending all of its chunks.
  if (!gemm->refused.ok() || gemm->streamed.ChunkedBytes() == 0) return Submit(gemm);
  const GemmJob& job = gemm->streamed.job;
  const int device = services_.resolver->PlaceArriving(&gemm->streamed.job);
  const int64_t a_bytes = gemm->streamed.a_handle.empty() ? job.shape.ABytes() : 0;
  const int64_t b_bytes = gemm->streamed.b_handle.empty() ? job.shape.BBytes() : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gemm->last_chunk = Clock::now();
    receiving_[gemm->streamed.gemm_id] = gemm;
    allocations_in_flight_++;
  }
  services_.uploads->Post([this, gemm, device, a_bytes, b_bytes] {
    std::shared_ptr<ResidentBuffer> a, b;
    absl::Status s;
    try {
      s = AllocateArriving(device, a_bytes, &a);
      if (s.ok()) s = AllocateArriving(device, b_bytes, &b);
    } catch (...) {
      s = status::FromCurrentException("GemmStream");
    }
    Allocated(gemm, s, std::move(a), std::move(b));
  });
}

// Resolves handles and reserves what the GEMM will hold (no device work): the size limits, its
// resident operands and kept C (ResidentResolver), its chunked bytes of the client's pending
// budget.
absl::Status StreamSession::Admit(Gemm& gemm) {
  AnnouncedGemm& streamed = gemm.streamed;
  if (absl::Status s = services_.scheduler->CheckSize(streamed.job.shape); !s.ok()) return s;
  if (absl::Status s = services_.resolver->Resolve(owner_,
                                                   {.a_handle = streamed.a_handle,
                                                    .b_handle = streamed.b_handle,
                                                    .keep_c = streamed.keep_c},
                                                   &streamed.job, &gemm.c_quota);
      !s.ok()) {
    return s;
  }
  if (streamed.ChunkedBytes() == 0) return absl::OkStatus();
  if (absl::Status s = gemm.pending.Take(services_.client_pending, owner_, streamed.ChunkedBytes());
      !s.ok()) {
    return status::WithContext(fmt::format("gemm_id {}", streamed.gemm_id), s);
  }
  return absl::OkStatus();
}

// On an upload thread: a buffer of `bytes` (none for 0: the operand is resident) on `device`,
// where the GEMM will run.
absl::Status StreamSession::AllocateArriving(int device, int64_t bytes,
                                             std::shared_ptr<ResidentBuffer>* buffer) {
  if (bytes == 0) return absl::OkStatus();
  absl::Status s = services_.backend->AllocateResident(device, bytes, buffer);
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    // The GEMM fits the limits (CheckSize): the memory is taken by other work for now.
    return status::QueueFull("device memory is busy: " + status::Message(s));
  }
  return s;
}

// On an upload thread: where the chunks go is allocated (or why not). Writes the chunks that
// came meanwhile, or answers the GEMM.
void StreamSession::Allocated(const std::shared_ptr<Gemm>& gemm, const absl::Status& s,
                              std::shared_ptr<ResidentBuffer> a,
                              std::shared_ptr<ResidentBuffer> b) {
  std::vector<OperandChunk> early;
  bool refuse = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gemm->dropped) {
      // Expired meanwhile: answered already; `a` and `b` are freed below, without mu_.
    } else if (!s.ok()) {
      gemm->dropped = true;
      gemm->early_chunks.clear();
      receiving_.erase(gemm->streamed.gemm_id);
      assembler_.Refuse(gemm->streamed.gemm_id);
      refuse = true;
    } else {
      if (a) gemm->streamed.job.a_resident = std::move(a);
      if (b) gemm->streamed.job.b_resident = std::move(b);
      gemm->allocated = true;
      early.swap(gemm->early_chunks);
      writes_in_flight_ += int64_t(early.size());
    }
  }
  if (refuse) {
    gemm->refused = s;
    Submit(gemm);
  }
  for (OperandChunk& chunk : early) CopyChunk(gemm, std::move(chunk));
  std::lock_guard<std::mutex> lock(mu_);
  allocations_in_flight_--;
  MaybeFinishLocked();
}

void StreamSession::Place(OperandChunk chunk) {
  std::shared_ptr<Gemm> gemm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = receiving_.find(chunk.gemm_id);
    if (it == receiving_.end()) return;  // expired between the assembler and here: dropped
    gemm = it->second;
    gemm->last_chunk = Clock::now();
    if (chunk.last) receiving_.erase(it);
    if (services_.metrics != nullptr) {
      services_.metrics->AddReceivedBytes(Rpc::kGemmStream, int64_t(chunk.data.size()));
    }
    if (!gemm->allocated) {
      gemm->early_chunks.push_back(std::move(chunk));
      return;
    }
    writes_in_flight_++;
  }
  CopyChunk(gemm, std::move(chunk));
}

// Copies a chunk into the GEMM's operand; the last one submits the GEMM.
// REQUIRES: gemm->allocated; writes_in_flight_ counts this write.
void StreamSession::CopyChunk(const std::shared_ptr<Gemm>& gemm, OperandChunk chunk) {
  const GemmJob& job = gemm->streamed.job;
  const int64_t size = chunk.data.size();
  services_.uploads->Write(
      chunk.operand == v1::OPERAND_A ? job.a_resident : job.b_resident, chunk.offset,
      std::move(chunk.data), [this, gemm, size](const absl::Status& s, double copy_ms) {
        bool written;
        {
          std::lock_guard<std::mutex> lock(mu_);
          written = gemm->tally.Add(s, size, copy_ms);
          if (written) gemm->refused = gemm->tally.error();
        }
        if (written) Submit(gemm);
        std::lock_guard<std::mutex> lock(mu_);
        writes_in_flight_--;
        MaybeFinishLocked();
      });
}

// Enqueues the GEMM, or answers it with the reason it was refused.
void StreamSession::Submit(std::shared_ptr<Gemm> gemm) {
  gemm->pending.Release();  // its chunks are all in (or no more are awaited)
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_++;
  }
  GemmJob job = gemm->streamed.job;
  gemm->streamed.job.a_resident.reset();  // the job holds the operands until it has run
  gemm->streamed.job.b_resident.reset();
  if (!gemm->refused.ok()) return Complete(gemm, gemm->refused, GemmReport{});
  absl::Status s;
  try {
    if (!job.keep_c) {
      gemm->c = services_.result_buffers->Take(job.shape.CBytes());
      job.c = reinterpret_cast<uint16_t*>(gemm->c.data());
    }
    job.deadline = deadline_;
    job.is_cancelled = [this] { return transport_->IsCancelled(); };
    job.traceparent = traceparent_;
    // C goes out chunk by chunk while the rest of it is still coming off the device.
    job.c_progress = [this, gemm](int64_t ready) {
      std::lock_guard<std::mutex> lock(mu_);
      gemm->c_ready = ready;
      QueueLocked(gemm);
      NextWriteLocked();
    };
    s = services_.scheduler->Enqueue(
        std::move(job), [this, gemm](const absl::Status& status, const GemmReport& report) {
          Complete(gemm, status, report);
        });
  } catch (...) {  // before the scheduler took it: answered here
    s = status::FromCurrentException("GemmStream");
  }
  if (!s.ok()) Complete(gemm, s, GemmReport{});
}

void StreamSession::Complete(std::shared_ptr<Gemm> gemm, const absl::Status& status,
                             const GemmReport& report) {
  ResidentMatrix kept_c;
  if (status.ok() && report.c_resident) {
    kept_c = services_.resolver->KeepC(std::move(gemm->c_quota), gemm->streamed.job.shape, report,
                                       gemm->streamed.c_ttl_seconds);
  }
  std::lock_guard<std::mutex> lock(mu_);
  gemm->status = status;
  gemm->report = report;
  gemm->report.c_resident.reset();  // the store holds a kept C now
  gemm->report.host_to_device_ms += gemm->tally.copy_ms();
  gemm->kept_c = std::move(kept_c);
  if (status.ok()) {
    gemm->c_ready = gemm->c.size();
  } else {  // chunks already sent are void: the client drops C on an error
    services_.result_buffers->Give(std::exchange(gemm->c, {}));
    gemm->c_ready = 0;
  }
  gemm->completed = true;
  in_flight_--;
  QueueLocked(gemm);
  NextWriteLocked();
  MaybeFinishLocked();
}

void StreamSession::QueueLocked(const std::shared_ptr<Gemm>& gemm) {
  if (gemm->queued || broken_) return;
  gemm->queued = true;
  outgoing_.push_back(gemm);
}

void StreamSession::NextWriteLocked() {
  if (writing_ || outgoing_.empty()) return;
  Gemm& out = *outgoing_.front();
  const int64_t chunk_bytes = services_.stream_chunk_bytes;
  const int64_t ready = out.c_ready - out.next_offset;
  // Whole chunks while C is still coming off the device; the rest once it is all there.
  if (ready >= chunk_bytes || (ready > 0 && out.c_ready == int64_t(out.c.size()))) {
    const int64_t size = std::min(chunk_bytes, ready);
    const int64_t offset = out.next_offset;
    out.next_offset += size;
    writing_ = true;
    transport_->StartWriteChunk(out.streamed.gemm_id, offset,
                                std::string_view(out.c.data() + offset, size));
    return;
  }
  if (!out.completed) return;  // more of C, or the answer, is still to come
  std::shared_ptr<Gemm> done = std::move(outgoing_.front());
  outgoing_.pop_front();
  writing_ = true;
  transport_->StartWriteDone(done->streamed, done->status, done->report, done->kept_c);
  assembler_.Release(done->streamed.gemm_id);
  services_.result_buffers->Give(std::move(done->c));
}

void StreamSession::MaybeFinishLocked() {
  if (finished_ || reading_ || in_flight_ > 0 || writes_in_flight_ > 0 ||
      allocations_in_flight_ > 0 || writing_ || !outgoing_.empty()) {
    return;
  }
  // Draining, a stream with nothing half-received ends now (a read may be outstanding: Finish
  // is allowed then, and that read completes with ok = false).
  if (!reads_done_ && !(draining_ && receiving_.empty())) return;
  finished_ = true;
  absl::Status s = error_;
  if (broken_ || transport_->IsCancelled()) {
    s = status::Cancelled();
  } else if (!reads_done_) {
    s = status::ShuttingDown();
  }
  transport_->Finish(s);
}

}  // namespace hgemm
