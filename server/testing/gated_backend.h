// GatedBackend: another backend whose GEMMs wait before they run until Open(), so that a test
// can act while a GEMM is "running" (unregistering its region, say). Test-only.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_TESTING_GATED_BACKEND_H_
#define HGEMM_SERVER_TESTING_GATED_BACKEND_H_

#include <condition_variable>
#include <mutex>

#include "server/testing/forwarding_backend.h"

namespace hgemm {

class GatedBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  // Lets every GEMM through, now and from now on.
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  // Blocks until a GEMM waits at the gate.
  void AwaitWaiting() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return waiting_ > 0; });
  }
  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++waiting_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return open_; });
    }
    return ForwardingBackend::Run(slot, job, report);
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = false;  // guarded by mu_
  int waiting_ = 0;    // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_GATED_BACKEND_H_
