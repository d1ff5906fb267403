#include "server/backend/fault_injector.h"

#include <utility>

namespace hgemm {

const char* FaultSiteName(FaultSite site) {
  switch (site) {
    case FaultSite::kDeviceAlloc: return "device_alloc";
    case FaultSite::kCopyToDevice: return "copy_to_device";
    case FaultSite::kCopyToHost: return "copy_to_host";
    case FaultSite::kLaunch: return "launch";
    case FaultSite::kEvent: return "event";
    case FaultSite::kStream: return "stream";
  }
  return "unknown";
}

FaultInjector& FaultInjector::Global() {
  static FaultInjector* injector = new FaultInjector();  // never destroyed: used at exit too
  return *injector;
}

void FaultInjector::Arm(FaultSite site, cudaError_t error, int skip, int count) {
  std::lock_guard<std::mutex> lock(mu_);
  Armed& a = sites_[int(site)];
  a.error = error;
  a.skip = skip;
  a.count = count;
  armed_ = true;
}

void FaultInjector::ArmAfterLaunch(std::function<void(cudaStream_t)> launch) {
  std::lock_guard<std::mutex> lock(mu_);
  after_launch_ = std::move(launch);
  armed_ = true;
}

void FaultInjector::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  sites_ = {};
  after_launch_ = nullptr;
  armed_ = false;
}

cudaError_t FaultInjector::Take(FaultSite site) {
  if (!armed_.load(std::memory_order_acquire)) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mu_);
  Armed& a = sites_[int(site)];
  if (a.count <= 0) return cudaSuccess;
  if (a.skip > 0) {
    a.skip--;
    return cudaSuccess;
  }
  a.count--;
  a.injected++;
  return a.error;
}

std::function<void(cudaStream_t)> FaultInjector::TakeAfterLaunch() {
  if (!armed_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(after_launch_, nullptr);
}

int64_t FaultInjector::injected(FaultSite site) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sites_[int(site)].injected;
}

}  // namespace hgemm
