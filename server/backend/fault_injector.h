// FaultInjector: makes the CUDA backend's calls fail on purpose, in test builds only.
//
// The CUDA backend consults it at each class of CUDA call site (FaultSite) when it is compiled
// with HGEMM_FAULT_INJECTION, i.e. as //server/backend:cuda_backend_fault_injection (testonly,
// so no release binary can link it). That build's factory is MakeFaultInjectingCudaBackend; the
// release build (//server/backend:cuda_backend, MakeCudaBackend) has no hook at all: its call
// sites are the plain CUDA calls.
//
// An armed fault replaces the call: the site returns the armed cudaError_t without making the
// call, as if CUDA had returned it. Arming a sticky code (cudaErrorIllegalAddress, ...) tests
// the backend's sticky-error logic without harming the context; a real sticky fault comes from
// ArmAfterLaunch with a kernel that faults (cuda_fault_kernel.cu).
//
// Thread safety: every method is thread-safe. One process-wide instance (Global()), so tests
// that arm it must not run GEMMs they did not mean to fail at the same time.
#ifndef HGEMM_SERVER_BACKEND_FAULT_INJECTOR_H_
#define HGEMM_SERVER_BACKEND_FAULT_INJECTOR_H_

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "server/backend/backend.h"
#include "server/backend/cuda_backend.h"

namespace hgemm {

// The classes of CUDA call the backend makes for a GEMM or a resident matrix.
enum class FaultSite {
  kDeviceAlloc,   // cudaMalloc of a slot's buffers, and resident buffers (AllocateResident)
  kCopyToDevice,  // cudaMemcpyAsync host→device (staged operands, WriteResident), peer copies
  kCopyToHost,    // cudaMemcpyAsync device→host (staged C, ReadResident)
  kLaunch,        // the GEMM kernel's launch
  kEvent,         // cudaEventRecord / Synchronize / Query / ElapsedTime
  kStream,        // cudaSetDevice, cudaStreamSynchronize
};
inline constexpr int kNumFaultSites = 6;
// "device_alloc", "copy_to_device", ... (for test names and messages).
const char* FaultSiteName(FaultSite site);

class FaultInjector {
 public:
  // The process's injector.
  static FaultInjector& Global();

  // The call at `site` after the next `skip` ones there fails with `error`, and so do the
  // `count` - 1 after it. Replaces what was armed at `site`. REQUIRES: error != cudaSuccess.
  void Arm(FaultSite site, cudaError_t error, int skip = 0, int count = 1);
  // After the GEMM kernel launch that follows the next `skip_launches` ones, `launch` runs with
  // the slot's stream (a test kernel that faults, making the device's context unusable). Once.
  void ArmAfterLaunch(std::function<void(cudaStream_t)> launch, int skip_launches = 0);
  // After the GEMM of the next `count` runs, before their Freivalds check reads C (and before C
  // leaves the device), `corrupt` runs with the slot's stream, C on the device and its bytes:
  // a test kernel that damages C as a faulty device would (LaunchXorWord,
  // cuda_fault_kernel.h).
  void ArmCorruptOutput(std::function<void(cudaStream_t, void* c, int64_t c_bytes)> corrupt,
                        int count = 1);
  // Arms from the environment (hgemm_server_fault_injection): HGEMM_FAULT_STICKY_AFTER=N makes
  // a real sticky fault (cuda_fault_kernel.h) after the (N+1)-th GEMM kernel launch. Returns
  // what it armed, for the log ("" when nothing).
  std::string ArmFromEnvironment();
  // Disarms everything and zeroes the counts.
  void Reset();

  // At a call site: cudaSuccess (make the call) or the error to return instead of making it.
  cudaError_t Take(FaultSite site);
  // At the launch site, after a successful launch: what ArmAfterLaunch armed (consumed), or an
  // empty function.
  std::function<void(cudaStream_t)> TakeAfterLaunch();
  // After a GEMM: what ArmCorruptOutput armed (one of its runs), or an empty function.
  std::function<void(cudaStream_t, void*, int64_t)> TakeCorruptOutput();

  // Faults injected at `site` since the last Reset().
  int64_t injected(FaultSite site) const;

 private:
  struct Armed {
    cudaError_t error = cudaSuccess;
    int skip = 0;
    int count = 0;
    int64_t injected = 0;
  };
  std::atomic<bool> armed_{false};  // anything armed: the fast path skips the mutex
  mutable std::mutex mu_;
  std::array<Armed, kNumFaultSites> sites_;                           // guarded by mu_
  std::function<void(cudaStream_t)> after_launch_;                    // guarded by mu_
  int after_launch_skip_ = 0;                                         // guarded by mu_
  std::function<void(cudaStream_t, void*, int64_t)> corrupt_output_;  // guarded by mu_
  int corrupt_output_count_ = 0;                                      // guarded by mu_
};

// The CUDA backend compiled with its fault-injection sites (see above); otherwise as
// MakeCudaBackend (cuda_backend.h).
std::unique_ptr<Backend> MakeFaultInjectingCudaBackend(const CudaBackendOptions& options,
                                                       std::string* error);

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_FAULT_INJECTOR_H_
