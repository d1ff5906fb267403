#include "server/session/part_session.h"

#include <fmt/format.h>

#include <cstdint>
#include <utility>

#include "server/core/status.h"

namespace hgemm {

PartSession::PartSession(GemmCoreInterface& core, PartTransport* transport, std::string owner,
                         std::chrono::seconds idle_timeout)
    : core_(core), transport_(transport), owner_(std::move(owner)), idle_timeout_(idle_timeout) {}

PartSession::~PartSession() {
  std::lock_guard<std::mutex> lock(mu_);  // whoever called Finish has let go of mu_
}

int64_t PartSession::OnRead(PartMessage& message) {
  const int64_t received = received_;
  auto consume = [&] {
    if (header_.handle.empty()) return ConsumeHeader(message);
    WireBytes* chunk = std::get_if<WireBytes>(&message.content);
    if (chunk == nullptr) return status::InvalidArgument("header", "sent twice");
    return ConsumeChunk(std::move(*chunk));
  };
  absl::Status s;
  if (!ActOnRead(mu_, reads_, "UploadPart", consume, &s)) {
    return 0;  // ended meanwhile: nothing more is read
  }
  std::lock_guard<std::mutex> lock(mu_);
  reads_.acting = false;
  if (!s.ok()) FailLocked(s);
  if (!reads_.done) {
    transport_->StartRead();
  } else {
    MaybeFinishLocked();
  }
  return received_ - received;
}

void PartSession::OnReadsDone() {
  std::lock_guard<std::mutex> lock(mu_);
  if (reads_.done) return;  // ended already (a failure, the idle timeout)
  if (header_.handle.empty()) {
    FailLocked(status::InvalidArgument("header", "no header was sent"));
  } else if (received_ != length_) {
    FailLocked(status::InvalidArgument(
        "chunk", fmt::format("the part ended after {} of the {} bytes its header announced",
                             received_, length_)));
  }
  reads_.done = true;
  MaybeFinishLocked();
}

void PartSession::ExpireIdle(Clock::time_point cutoff) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reads_.IdleSince(cutoff)) return;
  // The read outstanding completes after Finish, and is ignored.
  FailLocked(status::Idle(
      fmt::format("UploadPart: no message for {} s; the part was dropped", idle_timeout_.count())));
  MaybeFinishLocked();
}

absl::Status PartSession::ConsumeHeader(const PartMessage& message) {
  const PartSpec* header = std::get_if<PartSpec>(&message.content);
  if (header == nullptr) {
    return status::InvalidArgument("header", "the first message must be a header");
  }
  if (header->handle.empty()) {
    return status::InvalidArgument("header.handle", "must name an upload (CreateUpload)");
  }
  if (header->offset > uint64_t(INT64_MAX) || header->length > uint64_t(INT64_MAX)) {
    return status::InvalidArgument("header", "offset and length must be below 2^63");
  }
  std::shared_ptr<ResidentBuffer> buffer;
  if (absl::Status s = core_.BeginPart(owner_, header->handle, int64_t(header->offset),
                                       int64_t(header->length), "header", &buffer);
      !s.ok()) {
    return s;
  }
  header_ = *header;
  offset_ = int64_t(header_.offset);
  length_ = int64_t(header_.length);
  std::lock_guard<std::mutex> lock(mu_);
  claimed_ = true;
  buffer_ = std::move(buffer);
  return absl::OkStatus();
}

absl::Status PartSession::ConsumeChunk(WireBytes chunk) {
  const int64_t size = chunk.size();
  if (size > length_ - received_) {
    return status::InvalidArgument(
        "chunk", fmt::format("more bytes than the header announced: {} + {} of a {}-byte part",
                             received_, size, length_));
  }
  std::shared_ptr<ResidentBuffer> buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return absl::OkStatus();  // a write failed: the rest is dropped
    buffer = buffer_;
    writes_in_flight_++;
  }
  core_.uploads().Write(std::move(buffer), offset_ + received_, std::move(chunk),
                        [this](const absl::Status& s, double) { Written(s); });
  received_ += size;
  return absl::OkStatus();
}

// On an upload thread.
void PartSession::Written(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  writes_in_flight_--;
  if (!s.ok()) FailLocked(s);
  MaybeFinishLocked();
}

void PartSession::FailLocked(const absl::Status& s) {
  if (error_.ok()) error_ = s;
  reads_.done = true;
}

void PartSession::MaybeFinishLocked() {
  if (finished_ || !reads_.done || reads_.acting || writes_in_flight_ > 0) return;
  finished_ = true;
  absl::Status s = error_;
  int64_t missing = 0;
  if (claimed_) {
    // Only now that no write of it is in flight may a failed part's range be sent again.
    absl::Status ended = core_.EndPart(owner_, header_.handle, offset_, length_, s.ok(), &missing);
    if (s.ok()) s = ended;
    buffer_.reset();
  }
  transport_->Finish(s, missing);
}

}  // namespace hgemm
