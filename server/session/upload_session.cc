#include "server/session/upload_session.h"

#include <fmt/format.h>

#include <utility>

#include "server/core/status.h"

namespace hgemm {

UploadSession::UploadSession(GemmCoreInterface& core, UploadTransport* transport, std::string owner,
                             std::chrono::seconds idle_timeout, bool over_unix_socket)
    : core_(core),
      transport_(transport),
      owner_(std::move(owner)),
      idle_timeout_(idle_timeout),
      over_unix_socket_(over_unix_socket) {}

UploadSession::~UploadSession() {
  std::lock_guard<std::mutex> lock(mu_);  // whoever called Finish has let go of mu_
}

int64_t UploadSession::OnRead(UploadMessage& message) {
  const int64_t received = received_;
  absl::Status s;
  auto consume = [&] { return header_seen_ ? ConsumeChunk(message) : ConsumeHeader(message); };
  if (!ActOnRead(mu_, reads_, "UploadMatrix", consume, &s)) {
    return 0;  // ended meanwhile: nothing more is read
  }
  // Bytes of this message: a region's are not (see region_bytes()).
  const int64_t accepted = received_ - received - (received == 0 ? region_bytes() : 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    reads_.acting = false;
    if (s.ok() && !reads_.done) {
      transport_->StartRead();
      return accepted;
    }
  }
  if (!s.ok()) {
    Fail(s);
    return accepted;
  }
  std::lock_guard<std::mutex> lock(mu_);
  MaybeFinishLocked();
  return accepted;
}

void UploadSession::OnReadsDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reads_.done) return;  // ended already (a failure, the idle timeout)
  }
  absl::Status s;
  if (!header_seen_) {
    s = status::InvalidArgument("header", "no header was sent");
  } else if (received_ != bytes_) {
    s = status::InvalidArgument(
        "chunk",
        fmt::format("the stream ended after {} of the matrix's {} bytes", received_, bytes_));
  }
  if (!s.ok()) return Fail(s);
  std::lock_guard<std::mutex> lock(mu_);
  reads_.done = true;
  MaybeFinishLocked();
}

void UploadSession::ExpireIdle(Clock::time_point cutoff) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reads_.IdleSince(cutoff)) return;
  }
  // The read outstanding completes after Finish, and is ignored.
  Fail(status::Idle(fmt::format("UploadMatrix: no message for {} s; the upload was dropped",
                                idle_timeout_.count())));
}

void UploadSession::OnCallDone(bool cancelled) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!registered_.empty() && cancelled) {
    int64_t freed = 0;
    // A handle of its own that it just registered: nothing to report if it is gone already.
    (void)core_.ReleaseMatrix(owner_, registered_, /*admin=*/false, &freed);
  }
}

absl::Status UploadSession::ConsumeHeader(const UploadMessage& message) {
  const MatrixSpec* header = std::get_if<MatrixSpec>(&message.content);
  if (header == nullptr) {
    return status::InvalidArgument("header", "the first message must be a header");
  }
  header_ = *header;
  int device_index = -1;
  if (absl::Status s = core_.CheckMatrixHeader(header_, "header", &device_index, &dtype_);
      !s.ok()) {
    return s;
  }
  bytes_ = MatrixBytes(header_.rows, header_.cols, dtype_);
  // The quota first: nothing is allocated or copied for a matrix its owner may not keep.
  QuotaReservation quota;
  if (absl::Status s = core_.ReserveMatrix(owner_, bytes_, &quota); !s.ok()) return s;
  // From a region: its bytes go to the upload threads with the lease, which holds the region
  // until they are copied (no copy here, on the RPC thread).
  WireBytes region_data;
  const bool from_region = header_.source.kind == OperandSource::Kind::kRegion;
  if (from_region) {
    if (absl::Status s =
            core_.ReadRegion(owner_, over_unix_socket_, header_.source.handle,
                             header_.source.offset, bytes_, "header.region", &region_data);
        !s.ok()) {
      return s;
    }
  }
  header_seen_ = true;
  std::shared_ptr<ArrivingBuffer> arriving;
  std::unique_lock<std::mutex> lock(mu_);
  quota_ = std::move(quota);
  arriving = arriving_ = ArrivingBuffer::Start(
      &core_.uploads(), bytes_,
      [this, device_index](std::shared_ptr<ResidentBuffer>* buffer) {
        return core_.AllocateMatrixBuffer(device_index, bytes_, buffer);
      },
      [this](const absl::Status& s, std::shared_ptr<ResidentBuffer> buffer, double) {
        Settled(s, std::move(buffer));
      });
  lock.unlock();  // Add may settle the buffer at once, which takes mu_
  if (from_region) {
    from_region_ = true;
    arriving->Add(0, std::move(region_data));
    received_ = bytes_;
  }
  return absl::OkStatus();
}

absl::Status UploadSession::ConsumeChunk(UploadMessage& message) {
  WireBytes* chunk = std::get_if<WireBytes>(&message.content);
  if (chunk == nullptr) return status::InvalidArgument("header", "sent twice");
  if (from_region_) {
    return status::InvalidArgument("chunk", "the header named a region: no chunk may follow");
  }
  const int64_t size = chunk->size();
  if (received_ + size > bytes_) {
    return status::InvalidArgument(
        "chunk",
        fmt::format("past the end: {} + {} bytes of a {}-byte matrix", received_, size, bytes_));
  }
  std::shared_ptr<ArrivingBuffer> arriving;
  {
    std::lock_guard<std::mutex> lock(mu_);
    arriving = arriving_;
  }
  arriving->Add(received_, std::move(*chunk));
  received_ += size;
  return absl::OkStatus();
}

// On an upload thread (or inside Fail's Drop): the matrix's bytes have all landed, or why not.
void UploadSession::Settled(const absl::Status& s, std::shared_ptr<ResidentBuffer> buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  settled_ = true;
  settled_status_ = s;
  buffer_ = std::move(buffer);
  if (!s.ok() && error_.ok()) {
    error_ = s;
    reads_.done = true;  // the read outstanding completes after Finish, and is ignored
  }
  MaybeFinishLocked();
}

void UploadSession::Fail(const absl::Status& s) {
  std::shared_ptr<ArrivingBuffer> arriving;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = s;
    reads_.done = true;
    arriving = arriving_;
  }
  if (arriving) arriving->Drop(s);
  std::lock_guard<std::mutex> lock(mu_);
  MaybeFinishLocked();
}

void UploadSession::MaybeFinishLocked() {
  if (finished_ || !reads_.done || reads_.acting || (arriving_ && !settled_)) return;
  finished_ = true;
  absl::Status s = error_.ok() ? settled_status_ : error_;
  // A client that cancelled won't learn the handle: registering the matrix would leak it.
  if (s.ok() && transport_->IsCancelled()) s = status::Cancelled();
  ResidentMatrix matrix;
  if (s.ok()) {
    matrix = core_.AddMatrix(std::move(quota_), header_, dtype_, std::move(buffer_));
    registered_ = matrix.handle;
  } else {  // given back before the client hears of it, so that it can retry at once
    quota_ = QuotaReservation();
    buffer_.reset();
  }
  transport_->Finish(s, matrix);
}

}  // namespace hgemm
