#include "server/session/stream_session.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "server/core/status.h"

namespace hgemm {

// One GEMM of the stream, from its header until its answer is written.
struct StreamSession::Gemm {
  explicit Gemm(AnnouncedGemm header) : streamed(std::move(header)) {}
  AnnouncedGemm streamed;
  // Not OK: answered with it instead of run (refused at its header, idle, or its operands
  // could not be placed or copied).
  absl::Status refused;
  AdmittedGemm admitted;  // from admission until it runs
  // Where its chunked operands arrive (A, B, C_in; null when given by handle or absent),
  // until they settle.
  std::shared_ptr<ArrivingBuffer> arriving[3];  // guarded by mu_
  int unsettled = 0;                            // guarded by mu_
  double copy_ms = 0;                           // guarded by mu_
  Clock::time_point last_chunk;                 // guarded by mu_; while in receiving_
  // Answered before its operands were all in (idle, no memory, a failed copy).
  bool dropped = false;  // guarded by mu_
  // The answer (guarded by mu_ once the GEMM is submitted):
  std::string c;
  int64_t c_ready = 0;      // C's bytes [0, c_ready) are final: they may be written out
  int64_t next_offset = 0;  // C's bytes before it are written out
  bool queued = false;      // in outgoing_
  bool completed = false;   // status and result are set
  absl::Status status;
  GemmResult result;
};

StreamSession::StreamSession(GemmCoreInterface& core, const StreamOptions& options,
                             StreamTransport* transport, std::string owner,
                             Clock::time_point deadline, std::string traceparent)
    : core_(core),
      options_(options),
      transport_(transport),
      owner_(std::move(owner)),
      deadline_(deadline),
      traceparent_(std::move(traceparent)),
      assembler_(core.rules(), options.max_stream_pending_bytes) {}

StreamSession::~StreamSession() {
  std::lock_guard<std::mutex> lock(mu_);  // whoever called Finish has let go of mu_
}

void StreamSession::OnReadsDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::vector<uint64_t> ids = assembler_.Incomplete(); !ids.empty() && error_.ok()) {
      error_ = status::InvalidArgument(
          "stream", fmt::format("closed by the client while gemm_id {} was incomplete",
                                fmt::join(ids, ", ")));
    }
    reads_done_ = true;
  }
  AbandonReceiving();
  std::lock_guard<std::mutex> lock(mu_);
  MaybeFinishLocked();
}

int64_t StreamSession::OnRead(StreamMessage& message) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) return 0;  // drained meanwhile: nothing more is read
  StreamEvent event;
  absl::Status s = assembler_.Consume(message, &event);
  int64_t accepted = 0;
  if (s.ok()) {
    reading_ = true;  // the message is being acted on: the call can't finish under it
    lock.unlock();
    try {
      if (event.header) Start(std::move(*event.header));
      if (event.chunk) accepted = Place(std::move(*event.chunk));
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
    lock.unlock();
    AbandonReceiving();
    lock.lock();
  }
  MaybeFinishLocked();
  if (!reads_done_ && !finished_) transport_->StartRead();
  return accepted;
}

// The reads have ended: the GEMMs still receiving will never be complete. They are dropped
// unanswered (the call's status says why), and what they held is given back.
void StreamSession::AbandonReceiving() {
  std::map<uint64_t, std::shared_ptr<Gemm>> abandoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned.swap(receiving_);
    for (auto& [id, gemm] : abandoned) gemm->dropped = true;
  }
  for (auto& [id, gemm] : abandoned) {
    DropArriving(*gemm, status::Cancelled());
    gemm->admitted = AdmittedGemm();
  }
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
      expired.push_back(it->second);
      it = receiving_.erase(it);
    }
  }
  for (const std::shared_ptr<Gemm>& gemm : expired) {
    gemm->refused =
        status::Idle(fmt::format("gemm_id {}: no chunk for {} s; its operands were dropped",
                                 gemm->streamed.gemm_id, options_.idle_timeout.count()));
    Submit(gemm);  // first: the answer keeps the call open while the drop settles
    DropArriving(*gemm, gemm->refused);
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
  if (!gemm->refused.ok() || gemm->admitted.arriving_bytes() == 0) return Submit(gemm);
  std::lock_guard<std::mutex> lock(mu_);
  ReceiveLocked(gemm);
}

// The stream's GEMM through the core's admission: the chunked operands arrive, the ones named
// by handle are resident.
absl::Status StreamSession::Admit(Gemm& gemm) {
  return core_.Admit(owner_, gemm.streamed.order, &gemm.admitted);
}

// Starts an ArrivingBuffer for each chunked operand (its allocation runs on an upload thread).
void StreamSession::ReceiveLocked(const std::shared_ptr<Gemm>& gemm) {
  const int64_t bytes[3] = {gemm->streamed.ChunkedABytes(), gemm->streamed.ChunkedBBytes(),
                            gemm->streamed.ChunkedCInBytes()};
  gemm->last_chunk = Clock::now();
  receiving_[gemm->streamed.gemm_id] = gemm;
  for (int operand = 0; operand < 3; ++operand) {
    if (bytes[operand] == 0) continue;
    gemm->unsettled++;
    arriving_++;
    gemm->arriving[operand] = ArrivingBuffer::Start(
        &core_.uploads(), bytes[operand],
        [this, device = gemm->admitted.job().device_index,
         n = bytes[operand]](std::shared_ptr<ResidentBuffer>* buffer) {
          return core_.AllocateArriving(device, n, buffer);
        },
        [this, gemm, operand](const absl::Status& s, std::shared_ptr<ResidentBuffer> buffer,
                              double copy_ms) {
          Settled(gemm, operand, s, std::move(buffer), copy_ms);
        });
  }
}

// An operand has arrived (on an upload thread), or could not: the GEMM runs once both are in,
// and is answered at its first failure (its other operand and chunks are dropped).
void StreamSession::Settled(const std::shared_ptr<Gemm>& gemm, int operand, const absl::Status& s,
                            std::shared_ptr<ResidentBuffer> buffer, double copy_ms) {
  bool run = false, refuse = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gemm->arriving[operand].reset();
    gemm->unsettled--;
    gemm->copy_ms += copy_ms;
    if (gemm->dropped) {
      // Answered already; `buffer` is freed below, without mu_.
    } else if (!s.ok()) {
      gemm->dropped = true;
      receiving_.erase(gemm->streamed.gemm_id);
      assembler_.Refuse(gemm->streamed.gemm_id);
      refuse = true;
    } else {
      GemmJob& job = gemm->admitted.job();
      (operand == 0   ? job.a_resident
       : operand == 1 ? job.b_resident
                      : job.c_in_resident) = std::move(buffer);
      run = gemm->unsettled == 0;
    }
  }
  buffer.reset();
  if (refuse) gemm->refused = s;
  if (run || refuse) Submit(gemm);
  if (refuse) DropArriving(*gemm, s);
  std::lock_guard<std::mutex> lock(mu_);
  arriving_--;
  MaybeFinishLocked();
}

// Drops what is still arriving for `gemm`. REQUIRES: mu_ not held (a buffer may settle here).
void StreamSession::DropArriving(Gemm& gemm, const absl::Status& why) {
  std::shared_ptr<ArrivingBuffer> arriving[3];
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::copy(std::begin(gemm.arriving), std::end(gemm.arriving), arriving);
  }
  for (const std::shared_ptr<ArrivingBuffer>& buffer : arriving) {
    if (buffer) buffer->Drop(why);
  }
}

int64_t StreamSession::Place(OperandChunk chunk) {
  std::shared_ptr<ArrivingBuffer> buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = receiving_.find(chunk.gemm_id);
    if (it == receiving_.end()) return 0;  // dropped between the assembler and here
    Gemm& gemm = *it->second;
    gemm.last_chunk = Clock::now();
    buffer = gemm.arriving[chunk.operand == ChunkOperand::kA   ? 0
                           : chunk.operand == ChunkOperand::kB ? 1
                                                               : 2];
    if (chunk.last) receiving_.erase(it);
  }
  // Not settled: the session does not finish while a buffer has bytes to come.
  const int64_t size = int64_t(chunk.data.size());
  if (buffer) buffer->Add(chunk.offset, std::move(chunk.data));
  return size;
}

// Runs the GEMM, or answers it with the reason it was refused.
void StreamSession::Submit(std::shared_ptr<Gemm> gemm) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_++;
  }
  if (!gemm->refused.ok()) {
    gemm->admitted = AdmittedGemm();  // gives back what it held
    return Complete(gemm, gemm->refused, GemmResult{});
  }
  absl::Status s;
  try {
    GemmJob& job = gemm->admitted.job();
    if (!job.keep_c) {
      gemm->c = core_.host_buffers().Take(job.shape.CBytes());
      job.c = gemm->c.data();
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
    s = core_.Run(std::move(gemm->admitted),
                  [this, gemm](const absl::Status& status, GemmResult result) {
                    Complete(gemm, status, std::move(result));
                  });
  } catch (...) {  // before the scheduler took it: answered here
    s = status::FromCurrentException("GemmStream");
  }
  if (!s.ok()) Complete(gemm, s, GemmResult{});
}

void StreamSession::Complete(std::shared_ptr<Gemm> gemm, const absl::Status& status,
                             GemmResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  gemm->status = status;
  gemm->result = std::move(result);
  gemm->result.report.host_to_device_ms += gemm->copy_ms;
  if (status.ok()) {
    gemm->c_ready = gemm->c.size();
  } else {  // chunks already sent are void: the client drops C on an error
    core_.host_buffers().Give(std::exchange(gemm->c, {}));
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
  const int64_t chunk_bytes = options_.stream_chunk_bytes;
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
  transport_->StartWriteDone(done->streamed, done->status, done->result);
  assembler_.Release(done->streamed.gemm_id);
  core_.host_buffers().Give(std::move(done->c));
}

void StreamSession::MaybeFinishLocked() {
  if (finished_ || reading_ || in_flight_ > 0 || arriving_ > 0 || writing_ || !outgoing_.empty()) {
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
