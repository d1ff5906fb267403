#include "server/backend/fault_injector.h"

#include <cstdlib>
#include <utility>

#include "server/backend/cuda_fault_kernel.h"

namespace hgemm {

const char* FaultSiteName(FaultSite site) {
  switch (site) {
    case FaultSite::kDeviceAlloc:
      return "device_alloc";
    case FaultSite::kCopyToDevice:
      return "copy_to_device";
    case FaultSite::kCopyToHost:
      return "copy_to_host";
    case FaultSite::kLaunch:
      return "launch";
    case FaultSite::kEvent:
      return "event";
    case FaultSite::kStream:
      return "stream";
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

void FaultInjector::ArmAfterLaunch(std::function<void(cudaStream_t)> launch, int skip_launches) {
  std::lock_guard<std::mutex> lock(mu_);
  after_launch_ = std::move(launch);
  after_launch_skip_ = skip_launches;
  armed_ = true;
}

void FaultInjector::ArmCorruptOutput(std::function<void(cudaStream_t, void*, int64_t)> corrupt,
                                     int count) {
  std::lock_guard<std::mutex> lock(mu_);
  corrupt_output_ = std::move(corrupt);
  corrupt_output_count_ = count;
  armed_ = true;
}

std::function<void(cudaStream_t, void*, int64_t)> FaultInjector::TakeCorruptOutput() {
  if (!armed_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (corrupt_output_count_ <= 0) return nullptr;
  if (--corrupt_output_count_ == 0) return std::exchange(corrupt_output_, nullptr);
  return corrupt_output_;
}

void FaultInjector::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  sites_ = {};
  after_launch_ = nullptr;
  after_launch_skip_ = 0;
  corrupt_output_ = nullptr;
  corrupt_output_count_ = 0;
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
  if (!after_launch_) return nullptr;
  if (after_launch_skip_ > 0) {
    after_launch_skip_--;
    return nullptr;
  }
  return std::exchange(after_launch_, nullptr);
}

std::string FaultInjector::ArmFromEnvironment() {
  const char* after = std::getenv("HGEMM_FAULT_STICKY_AFTER");
  if (after == nullptr || *after == '\0') return "";
  const int skip = std::atoi(after);
  ArmAfterLaunch([](cudaStream_t stream) { LaunchIllegalAddressWrite(stream); }, skip);
  return "a sticky device fault (illegal address) after GEMM kernel launch " +
         std::to_string(skip + 1);
}

int64_t FaultInjector::injected(FaultSite site) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sites_[int(site)].injected;
}

}  // namespace hgemm
