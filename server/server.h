// HgemmServer: a running hgemm.v1 gRPC server: the service, its scheduler and backend, gRPC
// health (grpc.health.v1, server/health_service.h), server reflection and, if asked for, the
// Prometheus text endpoint /metrics on its own HTTP port (server/metrics.h). Used by main()
// and by the end-to-end tests.
// Thread safety: Shutdown() and Wait() may be called from any thread.
#ifndef HGEMM_SERVER_SERVER_H_
#define HGEMM_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>


#include "server/backend/backend.h"
#include "server/gemm_service.h"
#include "server/health_service.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/resident/matrix_store.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/upload_queue.h"

namespace hgemm {

struct ServerOptions {
  // HOST:PORT; port 0 picks a free one (see HgemmServer::port()).
  std::string listen_address = "0.0.0.0:50051";
  // HOST:PORT of the HTTP server answering GET /metrics (Prometheus text format); empty: no
  // metrics are kept or served. Port 0 picks a free one (see HgemmServer::metrics_port()).
  std::string metrics_listen;
  // Largest gRPC message accepted (unary requests); streams are bounded by the scheduler.
  int64_t max_message_bytes = int64_t{1} << 30;
  // On Shutdown(): how long in-flight calls may take before they are cancelled.
  std::chrono::milliseconds drain_deadline{20000};
  // Threads copying streamed operands and uploaded matrices to the device as chunks arrive.
  int upload_threads = 4;
  ServiceOptions service;
};

class HgemmServer {
 public:
  // Starts serving on options.listen_address (and metrics_listen). Returns nullptr (and logs
  // why) if an address can't be bound.
  static std::unique_ptr<HgemmServer> Start(ServerOptions options, std::unique_ptr<Backend> backend);
  ~HgemmServer();  // Shutdown()

  int port() const { return port_; }
  // The port of /metrics; 0 when metrics_listen is empty.
  int metrics_port() const { return metrics_port_; }
  const Backend& backend() const { return *backend_; }

  // Health NOT_SERVING, stop accepting calls, let in-flight ones finish until the drain
  // deadline (then cancel them), run what was admitted, stop workers, then stop serving
  // /metrics (it answers throughout the drain). Idempotent.
  void Shutdown();

 private:
  HgemmServer(ServerOptions options, std::unique_ptr<Backend> backend);
  void WatchHealth();

  const ServerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MatrixStore> store_;  // after backend_: its buffers go back to the backend
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<UploadQueue> uploads_;
  std::shared_ptr<ServiceMetrics> metrics_;  // null without metrics_listen; samples the above
  std::unique_ptr<GemmServiceImpl> service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;  // after the services, which must outlive it
  int port_ = 0;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // last: it calls metrics_ until destroyed
  int metrics_port_ = 0;

  std::mutex mu_;
  std::condition_variable stop_watching_;
  bool shutting_down_ = false;  // guarded by mu_
  std::thread health_watcher_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SERVER_H_
