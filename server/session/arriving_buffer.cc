#include "server/session/arriving_buffer.h"

#include "server/core/status.h"

namespace hgemm {

std::shared_ptr<ArrivingBuffer> ArrivingBuffer::Start(UploadQueue* uploads, int64_t bytes,
                                                      Allocate allocate, Settled settled) {
  std::shared_ptr<ArrivingBuffer> arriving(new ArrivingBuffer(uploads, bytes, std::move(settled)));
  uploads->Post([arriving, allocate = std::move(allocate)] {
    std::shared_ptr<ResidentBuffer> buffer;
    absl::Status s;
    try {
      s = allocate(&buffer);
    } catch (...) {
      s = status::FromCurrentException("allocation");
    }
    arriving->Allocated(s, std::move(buffer));
  });
  return arriving;
}

void ArrivingBuffer::Allocated(const absl::Status& s, std::shared_ptr<ResidentBuffer> buffer) {
  std::unique_lock<std::mutex> lock(mu_);
  allocating_ = false;
  if (!s.ok() || dropped_) {
    tally_.Add(s, 0, 0);
    early_.clear();
    lock.unlock();
    buffer.reset();  // freed without mu_
    lock.lock();
    return MaybeSettle(lock);
  }
  buffer_ = std::move(buffer);
  for (auto& [offset, data] : early_) CopyLocked(offset, std::move(data));
  early_.clear();
  MaybeSettle(lock);
}

void ArrivingBuffer::Add(int64_t offset, WireBytes data) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!settled_ || dropped_) return;
  if (!tally_.error().ok()) {  // a copy failed: the rest is counted, not copied
    tally_.Add(absl::OkStatus(), int64_t(data.size()), 0);
    return MaybeSettle(lock);
  }
  if (allocating_) {
    early_.emplace_back(offset, std::move(data));
    return;
  }
  CopyLocked(offset, std::move(data));
}

void ArrivingBuffer::Drop(absl::Status why) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!settled_ || dropped_) return;
  dropped_ = true;
  tally_.Add(why, 0, 0);
  early_.clear();
  MaybeSettle(lock);
}

void ArrivingBuffer::CopyLocked(int64_t offset, WireBytes data) {
  const int64_t size = int64_t(data.size());
  writes_in_flight_++;
  uploads_->Write(buffer_, offset, std::move(data),
                  [self = shared_from_this(), size](const absl::Status& s, double copy_ms) {
                    self->Copied(s, size, copy_ms);
                  });
}

void ArrivingBuffer::Copied(const absl::Status& s, int64_t bytes, double copy_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  writes_in_flight_--;
  tally_.Add(s, bytes, copy_ms);
  MaybeSettle(lock);
}

void ArrivingBuffer::MaybeSettle(std::unique_lock<std::mutex>& lock) {
  const bool failed_for_good = dropped_ || (!tally_.error().ok() && !buffer_);
  if (!settled_ || allocating_ || writes_in_flight_ > 0 ||
      (!tally_.complete() && !failed_for_good)) {
    return lock.unlock();
  }
  Settled settled = std::exchange(settled_, nullptr);
  const absl::Status s = tally_.error();
  std::shared_ptr<ResidentBuffer> buffer = std::move(buffer_);
  const double copy_ms = tally_.copy_ms();
  lock.unlock();
  if (!s.ok()) buffer.reset();
  settled(s, std::move(buffer), copy_ms);
}

}  // namespace hgemm
