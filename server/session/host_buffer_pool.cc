#include "server/session/host_buffer_pool.h"

namespace hgemm {

std::string HostBufferPool::Take(int64_t bytes) {
  std::string buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.lower_bound(size_t(bytes));
    if (it != idle_.end() && it->first <= 2 * size_t(bytes)) {
      buffer = std::move(it->second);
      idle_bytes_ -= it->first;
      idle_.erase(it);
    }
  }
  buffer.resize(bytes);  // within the capacity of a recycled buffer (kept full): no writes
  return buffer;
}

// Small buffers are cheap to make; keeping them would only fragment the pool.
constexpr size_t kSmallestKept = size_t{64} << 10;

void HostBufferPool::Give(std::string buffer) {
  const size_t capacity = buffer.capacity();
  if (capacity < kSmallestKept) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_bytes_ + int64_t(capacity) > max_bytes_) return;  // freed on return
  buffer.resize(capacity);                                   // so that Take only ever shrinks it
  idle_bytes_ += capacity;
  idle_.emplace(capacity, std::move(buffer));
}

int64_t HostBufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_bytes_;
}

}  // namespace hgemm
