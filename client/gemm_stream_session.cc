#include "client/gemm_stream_session.h"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "client/error_details.h"

namespace hgemm {

GemmStreamSession::GemmStreamSession(const GemmClient& client, const CallOptions& options)
    : chunk_bytes_(options.chunk_bytes), client_(client) {
  answer_.c_of = [this](uint64_t gemm_id, CBuffer* c) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(gemm_id);
    if (it == in_flight_.end()) return false;
    *c = it->second;
    return true;
  };
  stream_ = client_.OpenStream(options.replica, options, &context_);
  try {
    writer_ = std::thread(&GemmStreamSession::Write, this);
  } catch (...) {
    context_.TryCancel();
    StreamAnswer discarded;
    while (stream_->Read(&discarded)) {
    }
    stream_->Finish();
    throw;
  }
}

GemmStreamSession::~GemmStreamSession() {
  if (over_) return;
  context_.TryCancel();
  StreamAnswer discarded;  // no c_of: nothing is written into the GEMMs' buffers
  while (stream_->Read(&discarded)) {
  }
  Finish();
}

grpc::Status GemmStreamSession::Submit(uint64_t gemm_id, v1::GemmRequest request,
                                       OperandBytes borrowed, CBuffer c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the stream is closed");
    }
    if (!in_flight_.try_emplace(gemm_id, c).second) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          fmt::format("gemm_id {} is in use on this stream", gemm_id));
    }
    queue_.push_back(Queued{gemm_id, std::move(request), borrowed});
  }
  wake_.notify_all();
  return grpc::Status::OK;
}

bool GemmStreamSession::Next(uint64_t* gemm_id, v1::GemmDone* done, grpc::Status* end) {
  while (!over_ && stream_->Read(&answer_)) {
    if (!protocol_error_.ok()) continue;  // draining a cancelled call
    if (!answer_.problem.empty()) {
      protocol_error_ = grpc::Status(grpc::StatusCode::INTERNAL, answer_.problem);
      context_.TryCancel();
    } else if (answer_.has_done) {  // of a GEMM in flight (c_of found it)
      Answered(answer_.gemm_id);
      *gemm_id = answer_.gemm_id;
      *done = std::move(answer_.done);
      return true;
    }
  }
  if (!over_) {
    over_ = true;
    const grpc::Status finished = Finish();
    end_ = finished.ok() ? protocol_error_ : finished;
  }
  *end = end_;
  return false;
}

void GemmStreamSession::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  wake_.notify_all();
}

void GemmStreamSession::Cancel() { context_.TryCancel(); }

void GemmStreamSession::Write() {
  while (true) {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait(lock, [&] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) break;  // closing, everything written
    lock.unlock();
    std::unique_lock<std::mutex> borrow(borrow_mu_);
    lock.lock();
    if (queue_.empty()) continue;  // answered meanwhile (a server that broke the protocol)
    Queued next = std::move(queue_.front());
    queue_.pop_front();
    writing_id_ = next.gemm_id;
    writing_answered_ = false;
    lock.unlock();
    StreamedGemmMessages messages(next.request, next.gemm_id, chunk_bytes_, next.borrowed);
    grpc::ByteBuffer message;
    // Once answered, the rest of it would be dropped by the server anyway.
    while (!writing_answered_ && messages.Next(&message)) {
      borrow.unlock();                       // the message holds its own copy of the chunk
      if (!stream_->Write(message)) return;  // the call is over: the reader learns why
      borrow.lock();
    }
  }
  stream_->WritesDone();
}

void GemmStreamSession::Answered(uint64_t gemm_id) {
  std::lock_guard<std::mutex> borrow(borrow_mu_);
  if (writing_id_ == gemm_id) writing_answered_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.erase(gemm_id);
  // Answered before it was sent: only a server that broke the protocol does that.
  std::erase_if(queue_, [&](const Queued& q) { return q.gemm_id == gemm_id; });
}

grpc::Status GemmStreamSession::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  writer_.join();
  return stream_->Finish();
}

}  // namespace hgemm
