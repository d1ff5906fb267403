#include "server/transport/health_service.h"

#include "server/core/status.h"
#include "server/transport/status_util.h"

namespace hgemm {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch call: writes the latest status whenever it changes (statuses that change while a
// write is in flight collapse into the newest), and finishes once the service shuts down or the
// client goes away.
class HealthWatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  explicit HealthWatchReactor(HealthService* service) : service_(service) {}

  // From the service, with its mu_ held. `last`: the server is shutting down.
  void Update(HealthCheckResponse::ServingStatus status, bool last) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status != sent_) latest_ = status;
    ending_ = ending_ || last;
    NextLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;
    NextLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    NextLocked();
  }

  void OnDone() override {
    service_->Forget(this);
    { std::lock_guard<std::mutex> lock(mu_); }  // whoever called Finish has let go of mu_
    delete this;
  }

 private:
  void NextLocked() {
    if (writing_ || finished_) return;
    if (cancelled_) {
      finished_ = true;
      return Finish(ToGrpcStatus(status::Cancelled()));
    }
    if (latest_ != sent_) {
      sent_ = latest_;
      response_.set_status(sent_);
      writing_ = true;
      return StartWrite(&response_);
    }
    if (ending_) {
      finished_ = true;
      Finish(ToGrpcStatus(status::ShuttingDown()));
    }
  }

  HealthService* const service_;
  std::mutex mu_;
  // Sentinel "nothing sent yet": any real status differs from it.
  static constexpr auto kNone = static_cast<HealthCheckResponse::ServingStatus>(-1);
  HealthCheckResponse::ServingStatus latest_ = kNone;  // guarded by mu_
  HealthCheckResponse::ServingStatus sent_ = kNone;    // guarded by mu_
  HealthCheckResponse response_;                       // guarded by mu_; the write in flight
  bool writing_ = false;                               // guarded by mu_
  bool ending_ = false;                                // guarded by mu_
  bool cancelled_ = false;                             // guarded by mu_
  bool finished_ = false;                              // guarded by mu_
};

HealthService::HealthService(const std::vector<std::string>& services) {
  statuses_[""] = HealthCheckResponse::NOT_SERVING;
  for (const std::string& s : services) statuses_[s] = HealthCheckResponse::NOT_SERVING;
}

HealthService::ServingStatus HealthService::StatusLocked(const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  for (auto& [name, status] : statuses_) {
    status = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  }
  for (auto& [watch, service] : watches_) watch->Update(StatusLocked(service), false);
}

void HealthService::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  for (auto& [name, status] : statuses_) status = HealthCheckResponse::NOT_SERVING;
  for (auto& [watch, service] : watches_) watch->Update(StatusLocked(service), true);
}

void HealthService::Forget(HealthWatchReactor* watch) {
  std::lock_guard<std::mutex> lock(mu_);
  watches_.erase(watch);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ServingStatus s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = StatusLocked(request->service());
  }
  if (s == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(
        ToGrpcStatus(status::NotFound("unknown service " + status::Quote(request->service()))));
  } else {
    response->set_status(s);
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext*, const HealthCheckRequest* request) {
  auto* watch = new HealthWatchReactor(this);
  std::lock_guard<std::mutex> lock(mu_);
  watches_[watch] = request->service();
  watch->Update(StatusLocked(request->service()), shut_down_);
  return watch;
}

}  // namespace hgemm
