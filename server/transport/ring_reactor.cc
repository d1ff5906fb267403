#include "server/transport/ring_reactor.h"

#include <memory>
#include <mutex>
#include <utility>

#include "server/core/status.h"
#include "server/session/ring_executor.h"
#include "server/transport/convert.h"
#include "server/transport/status_util.h"

namespace hgemm {
namespace {

class AttachRingReactor final : public grpc::ServerWriteReactor<v1::RingEvent>, public TrackedCall {
 public:
  AttachRingReactor(const CallServices& services, grpc::CallbackServerContext* context,
                    std::string owner, const v1::AttachRingRequest& request)
      : services_(services), context_(context), owner_(std::move(owner)) {
    std::lock_guard<std::mutex> lock(mu_);  // the ring thread may detach before we are done
    const RingSpec spec{.ring_region = request.ring_region(),
                        .sq_entries = request.sq_entries(),
                        .cq_entries = request.cq_entries(),
                        .regions = {request.regions().begin(), request.regions().end()},
                        .matrices = {request.matrices().begin(), request.matrices().end()}};
    const CallLog* log = services_.log;
    absl::Status s = RingExecutor::Attach(
        services_.core, services_.rings, owner_, OverUnixSocket(*context), spec,
        [log](absl::StatusCode code) { log->RingEntry(code); },
        [this](const absl::Status& reason) { End(reason); }, &ring_);
    services_.calls->Track(this);
    if (!s.ok()) {
      EndLocked(s);
      return;
    }
    v1::RingAttached* attached = event_.mutable_attached();
    attached->set_max_in_flight(ring_->max_in_flight());
    for (const KernelDescription& kernel : services_.core->rules().kernels) {
      attached->add_kernels(kernel.name);
    }
    // What a completion's device id and Execution.backend stand for (proto/ring_execution.h).
    attached->set_backend(services_.core->BackendName());
    for (const DeviceDescription& d : services_.core->Devices()) {
      ToProto(d, attached->add_devices());
    }
    writing_ = true;
    StartWrite(&event_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok && !ended_) EndLocked(status::Cancelled());
    if (finish_after_write_) Finish(ToGrpcStatus(end_status_));
  }

  // The client ended the call or went away: the ring is detached.
  void OnCancel() override { End(status::Cancelled()); }

  void OnDone() override {
    services_.calls->Untrack(this);
    StopRing();
    delete this;
  }

  void Drain() override { End(status::ShuttingDown()); }
  void ExpireIdle(Clock::time_point) override {}  // a ring waits for GEMMs as long as it likes

 private:
  void End(const absl::Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ended_) return;
      EndLocked(s);
    }
    StopRing();
  }

  // Answers the call with `s` once (after the RingAttached write, if one is in flight).
  // REQUIRES: mu_ held, !ended_.
  void EndLocked(const absl::Status& s) {
    ended_ = true;
    end_status_ = s;
    services_.log->Answered(Rpc::kAttachRing, s, context_, owner_);
    if (writing_) {
      finish_after_write_ = true;
    } else {
      Finish(ToGrpcStatus(s));
    }
  }

  // Outside mu_: Stop waits for a detach callback in progress, which takes mu_.
  void StopRing() {
    std::shared_ptr<RingExecutor> ring;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ring = ring_;
    }
    if (ring) ring->Stop();
  }

  const CallServices& services_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  std::mutex mu_;
  std::shared_ptr<RingExecutor> ring_;  // guarded by mu_; null when the attach failed
  v1::RingEvent event_;
  bool writing_ = false;             // guarded by mu_
  bool ended_ = false;               // guarded by mu_
  bool finish_after_write_ = false;  // guarded by mu_
  absl::Status end_status_;          // guarded by mu_
};

}  // namespace

grpc::ServerWriteReactor<v1::RingEvent>* NewAttachRingReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner,
    const v1::AttachRingRequest& request) {
  return new AttachRingReactor(services, context, std::move(owner), request);
}

}  // namespace hgemm
