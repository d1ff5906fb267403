// HealthService: grpc.health.v1.Health (Check and Watch) for "" (the whole server) and the
// services it names, built from the generated health code so that server reflection can
// describe it (grpcurl's `describe` and the README's health check need nothing else).
//
// Unlike gRPC's default health service it ends its Watch calls at shutdown: Shutdown() sends
// NOT_SERVING to every watcher, then finishes them with UNAVAILABLE, so that an idle Watch does
// not hold the server's drain until its deadline.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_TRANSPORT_HEALTH_SERVICE_H_
#define HGEMM_SERVER_TRANSPORT_HEALTH_SERVICE_H_

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"

namespace hgemm {

class HealthWatchReactor;

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  // Every name in `services` (and "") starts NOT_SERVING.
  explicit HealthService(const std::vector<std::string>& services);

  // Sets every service's status. Ignored after Shutdown().
  void SetServing(bool serving);

  // Every service NOT_SERVING for good; open Watch calls get that, then end with UNAVAILABLE.
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

  // Called by a Watch call's reactor when it is done: no more updates go to it.
  void Forget(HealthWatchReactor* watch);

 private:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // The status of `service` (SERVICE_UNKNOWN if not one of ours). REQUIRES: mu_ held.
  ServingStatus StatusLocked(const std::string& service) const;

  std::mutex mu_;
  std::map<std::string, ServingStatus> statuses_;       // guarded by mu_
  std::map<HealthWatchReactor*, std::string> watches_;  // guarded by mu_; → its service
  bool shut_down_ = false;                              // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_HEALTH_SERVICE_H_
