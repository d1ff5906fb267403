// HgemmServer: a running hgemm.v1 gRPC server: the service, its scheduler and backend, gRPC
// health (grpc.health.v1, server/health_service.h) and server reflection. Used by main() and by the end-to-end tests.
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
#include "server/resident/matrix_store.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/upload_queue.h"

namespace hgemm {

struct ServerOptions {
  // HOST:PORT; port 0 picks a free one (see HgemmServer::port()).
  std::string listen_address = "0.0.0.0:50051";
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
  // Starts serving on options.listen_address. Returns nullptr (and logs why) if the address
  // can't be bound.
  static std::unique_ptr<HgemmServer> Start(ServerOptions options, std::unique_ptr<Backend> backend);
  ~HgemmServer();  // Shutdown()

  int port() const { return port_; }
  const Backend& backend() const { return *backend_; }

  // Health NOT_SERVING, stop accepting calls, let in-flight ones finish until the drain
  // deadline (then cancel them), run what was admitted, stop workers. Idempotent.
  void Shutdown();

 private:
  HgemmServer(ServerOptions options, std::unique_ptr<Backend> backend);
  void WatchHealth();

  const ServerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MatrixStore> store_;  // after backend_: its buffers go back to the backend
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<UploadQueue> uploads_;
  std::unique_ptr<GemmServiceImpl> service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;  // after the services, which must outlive it
  int port_ = 0;

  std::mutex mu_;
  std::condition_variable stop_watching_;
  bool shutting_down_ = false;  // guarded by mu_
  std::thread health_watcher_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SERVER_H_
