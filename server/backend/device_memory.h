// DeviceMemory: one device's memory budget and its cache of freed resident buffers.
//
// The budget is shared by the slots' buffers (Reserve / Unreserve) and by resident matrices and
// kept results (AllocateResident). Resident buffers are allocated in size classes (SizeClass:
// powers of two below the driver's 2 MiB page, multiples of it from there) and, when their last
// reference goes, kept by size for the next request
// of that class: a steady flow of kept results then allocates nothing, and the driver's free
// (cudaFree synchronizes the device) runs only when the budget needs the memory. Cached bytes
// stay counted as used. The raw allocations go through a DeviceAllocator, so the accounting is
// host logic (device_memory_test.cc uses host memory).
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_BACKEND_DEVICE_MEMORY_H_
#define HGEMM_SERVER_BACKEND_DEVICE_MEMORY_H_

#include <absl/status/status.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "server/core/job.h"

namespace hgemm {

// The raw allocations of one device (cudaMalloc / cudaFree for CUDA).
// Thread safety: implementations are thread-safe.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  // `bytes` of device memory, or nullptr with *error saying why.
  virtual void* Allocate(int64_t bytes, std::string* error) = 0;
  // Frees what Allocate returned.
  virtual void Free(void* data) = 0;
};

class DeviceMemory {
 public:
  // Resident buffers of 2 MiB (the driver's page) and more come in multiples of it, so that a
  // cached buffer fits every later request of its size class.
  static constexpr int64_t kResidentGranularity = int64_t{2} << 20;
  // The smallest size class.
  static constexpr int64_t kSmallestClass = int64_t{4} << 10;

  // The bytes a resident buffer of `bytes` takes from the budget: the next power of two from
  // kSmallestClass below kResidentGranularity (the driver packs such allocations into shared
  // pages, so that a tiny matrix does not hold 2 MiB: the H100 soak's 2 548 leftover 48x48
  // uploads held 5 GB as whole pages), else the next multiple of kResidentGranularity.
  // REQUIRES: bytes > 0.
  static int64_t SizeClass(int64_t bytes);

  // The memory of device `device_index` (a Backend::Devices() index; `ordinal` names it in
  // messages) with `budget_bytes` to hand out. REQUIRES: `allocator` outlives it.
  DeviceMemory(int device_index, int ordinal, int64_t budget_bytes, DeviceAllocator* allocator)
      : device_index_(device_index),
        ordinal_(ordinal),
        budget_bytes_(budget_bytes),
        allocator_(allocator) {}
  // Frees the cached buffers. REQUIRES: no resident buffer of it is still alive.
  ~DeviceMemory() { ReleaseCache(); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Claims `bytes` of the budget, returning cached buffers to the driver if that is what it
  // takes; false (and nothing claimed) if it would still be passed.
  bool Reserve(int64_t bytes);
  // Gives back `bytes` that Reserve claimed.
  void Unreserve(int64_t bytes) { used_bytes_ -= bytes; }

  // A resident buffer of `bytes` (its size class in the budget): a cached one of that class, or
  // a new one. RESOURCE_EXHAUSTED when the budget would be passed or the driver has no memory;
  // INTERNAL for bytes <= 0 (it would lower the budget's count for good). The buffer goes back
  // to the cache when its last reference goes. REQUIRES: the memory outlives the buffer.
  absl::Status AllocateResident(int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer);

  // Returns every cached buffer to the driver.
  void ReleaseCache();

  int64_t used_bytes() const { return used_bytes_.load(); }  // slots', resident and cached
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t cached_bytes() const;

 private:
  bool TryReserve(int64_t bytes);
  void* TakeCached(int64_t size);
  void Cache(int64_t size, void* data);

  const int device_index_;
  const int ordinal_;
  const int64_t budget_bytes_;
  DeviceAllocator* const allocator_;
  std::atomic<int64_t> used_bytes_{0};

  mutable std::mutex cache_mu_;
  std::multimap<int64_t, void*> cache_;  // guarded by cache_mu_; by size class
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_DEVICE_MEMORY_H_
