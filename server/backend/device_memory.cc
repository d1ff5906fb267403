#include "server/backend/device_memory.h"

#include <fmt/format.h>

#include "server/core/status.h"

namespace hgemm {

int64_t DeviceMemory::SizeClass(int64_t bytes) {
  if (bytes >= kResidentGranularity)
    return (bytes + kResidentGranularity - 1) / kResidentGranularity * kResidentGranularity;
  int64_t size = kSmallestClass;
  while (size < bytes) size *= 2;
  return size;
}

bool DeviceMemory::Reserve(int64_t bytes) {
  if (TryReserve(bytes)) return true;
  ReleaseCache();
  return TryReserve(bytes);
}

bool DeviceMemory::TryReserve(int64_t bytes) {
  if (used_bytes_.fetch_add(bytes) + bytes <= budget_bytes_) return true;
  used_bytes_ -= bytes;
  return false;
}

absl::Status DeviceMemory::AllocateResident(int64_t bytes,
                                            std::shared_ptr<ResidentBuffer>* buffer) {
  if (bytes <= 0) return status::BackendFailure(fmt::format("resident buffer of {} bytes", bytes));
  const int64_t size = SizeClass(bytes);
  void* data = TakeCached(size);
  if (data == nullptr) {
    if (!Reserve(size)) {
      return status::OverLimit(
          "device_memory",
          fmt::format(
              "{} more bytes would pass device {}'s memory budget ({} of {} in use by streams and "
              "resident matrices)",
              size, ordinal_, used_bytes(), budget_bytes_));
    }
    std::string error;
    data = allocator_->Allocate(size, &error);
    if (data == nullptr) {
      used_bytes_ -= size;
      return status::OverLimit("device_memory", fmt::format("device {}: {}", ordinal_, error));
    }
  }
  *buffer = std::make_shared<ResidentBuffer>(device_index_, bytes, data,
                                             [this, size](void* p) { Cache(size, p); });
  return absl::OkStatus();
}

void* DeviceMemory::TakeCached(int64_t size) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto it = cache_.find(size);
  if (it == cache_.end()) return nullptr;
  void* data = it->second;
  cache_.erase(it);
  return data;
}

void DeviceMemory::Cache(int64_t size, void* data) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  cache_.emplace(size, data);
}

void DeviceMemory::ReleaseCache() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (auto [size, data] : cache_) {
    allocator_->Free(data);
    used_bytes_ -= size;
  }
  cache_.clear();
}

int64_t DeviceMemory::cached_bytes() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  int64_t bytes = 0;
  for (const auto& [size, data] : cache_) bytes += size;
  return bytes;
}

}  // namespace hgemm
