// HostBufferPool: host buffers for results on their way out (a stream's C, a download),
// recycled. A fresh 128 MiB buffer costs tens of milliseconds of page faults, which showed up
// as transport time on the H200; a recycled one costs nothing.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_SESSION_HOST_BUFFER_POOL_H_
#define HGEMM_SERVER_SESSION_HOST_BUFFER_POOL_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace hgemm {

class HostBufferPool {
 public:
  // Keeps at most `max_bytes` of idle buffers.
  explicit HostBufferPool(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // A buffer of `bytes` bytes, recycled when an idle one fits (at most twice as large), else
  // new. Its contents are undefined.
  std::string Take(int64_t bytes);

  // Keeps `buffer` for a later Take (or frees it, if the pool is full).
  void Give(std::string buffer);

  int64_t idle_bytes() const;

 private:
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::multimap<size_t, std::string> idle_;  // guarded by mu_; by capacity
  int64_t idle_bytes_ = 0;                   // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_HOST_BUFFER_POOL_H_
