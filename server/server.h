// HgemmServer: a running hgemm.v1 gRPC server: the service, its scheduler and backend, gRPC
// health (grpc.health.v1, server/health_service.h), server reflection and, if asked for, the
// Prometheus text endpoint /metrics on its own HTTP port (server/metrics/metrics.h), TLS and
// authentication (server/auth/), and if asked for a plaintext health-only port. Used by main()
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
#include <vector>

#include "proto/grpc_args.h"
#include "server/auth/authenticator.h"
#include "server/auth/server_tls.h"
#include "server/backend/backend.h"
#include "server/metrics/metrics.h"
#include "server/resident/matrix_store.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/upload_queue.h"
#include "server/session/bulk_grants.h"
#include "server/session/gemm_core.h"
#include "server/transport/bulk_listener.h"
#include "server/transport/gemm_service.h"
#include "server/transport/health_service.h"
#include "server/transport/metrics_http.h"
#include "server/transport/reflection_service.h"
#include "server/transport/unix_listener.h"

namespace hgemm {

struct ServerOptions {
  // HOST:PORT; port 0 picks a free one (see HgemmServer::port()). May be a Unix socket,
  // "unix:/path/hgemm.sock" (port() is then 1).
  std::string listen_address = "0.0.0.0:50051";
  // More addresses serving the same calls, e.g. a Unix socket beside the TCP port. Shared
  // memory (regions) is accepted only on calls that arrive over a "unix:" one.
  std::vector<std::string> more_listen_addresses;
  // The file mode (e.g. 0660) each Unix socket file is given once bound; -1: leave gRPC's.
  int unix_socket_mode = -1;
  // HOST:PORT of the HTTP server answering GET /metrics (Prometheus text format); empty: no
  // metrics are kept or served. Port 0 picks a free one (see HgemmServer::metrics_port()).
  std::string metrics_listen;
  // Largest gRPC message accepted (unary requests); streams are bounded by the scheduler.
  int64_t max_message_bytes = int64_t{1} << 30;
  // On Shutdown(): how long in-flight calls may take before they are cancelled.
  std::chrono::milliseconds drain_deadline{20000};
  // A connection this old (gRPC adds up to ±10 % of jitter) is sent a GOAWAY: its client
  // reconnects for its next call and re-resolves the server's name, so a round_robin channel
  // over a headless Service reaches replicas added since it connected. Applies to the unix:
  // sockets' connections too (they reconnect to the same server). 0: connections never age.
  std::chrono::milliseconds max_connection_age{0};
  // After that GOAWAY, how long the calls still open on the connection may go on before it is
  // closed under them (they end UNAVAILABLE). 0: until they end, however long (a long
  // GemmStream then stays where it is; an AttachRing call, open while its ring is attached,
  // must not be cut). Needs max_connection_age.
  std::chrono::milliseconds max_connection_age_grace{0};
  // Threads copying streamed operands and uploaded matrices to the device as chunks arrive.
  int upload_threads = 4;
  // TLS on listen_address when tls.cert_path is set; else plaintext (a warning is logged if
  // the address is not a loopback one).
  TlsOptions tls;
  // Authentication (tokens, client certificates) of hgemm.v1.GemmService calls.
  AuthOptions auth;
  // HOST:PORT of a plaintext port serving only grpc.health.v1 (kubelet's gRPC probe speaks no
  // TLS); "": none. Port 0 picks a free one (see HgemmServer::health_port()).
  std::string health_listen;
  ServiceOptions service;
  // The bulk channel (proto/hgemm.proto, "Bulk channel"): its listener (address "": none) and
  // its grants. With `tls` its lanes are TLS with the same files (bulk.tls is set from them).
  BulkListenerOptions bulk;
  BulkGrantsOptions bulk_grants;
  // gRPC channel arguments set on the server (--grpc_arg), for transport experiments.
  std::vector<GrpcArg> grpc_args;
};

class HgemmServer {
 public:
  // Starts serving on options.listen_address (and metrics_listen, health_listen). Returns
  // nullptr (and logs why, naming the flag or file) if an address can't be bound, a
  // certificate, key or tokens file is unreadable or malformed, or the options contradict.
  static std::unique_ptr<HgemmServer> Start(ServerOptions options,
                                            std::unique_ptr<Backend> backend);
  ~HgemmServer();  // Shutdown()

  int port() const { return port_; }
  // The port of /metrics; 0 when metrics_listen is empty.
  int metrics_port() const { return metrics_port_; }
  // The port of the health-only listener; 0 when health_listen is empty.
  int health_port() const { return health_port_; }
  // The bulk channel's port; 0 when bulk.address is empty.
  int bulk_port() const { return bulk_listener_ ? bulk_listener_->port() : 0; }
  const Backend& backend() const { return *backend_; }

  // Health NOT_SERVING, refuse every new call (UNAVAILABLE: retry elsewhere; gRPC itself
  // takes them until it stops), let the GEMMs admitted so far finish, stop accepting calls, let
  // in-flight ones finish until the drain deadline (then cancel them), run what was admitted,
  // stop workers, wait (at most 2 s) for the clients to close their connections once they have
  // read their answers, then stop serving /metrics (it answers throughout the drain).
  // Idempotent.
  void Shutdown();

 private:
  HgemmServer(ServerOptions options, std::unique_ptr<Backend> backend);
  void WatchHealth();
  // Until the clients have closed their TCP connections to tcp_ports_, at most 2 s.
  void WaitForPeersToClose();
  // Until the GEMMs admitted so far have completed (at most until `deadline`), then 50 ms for
  // their answers to reach the clients and the clients' last frames to come back.
  void WaitForAdmittedWork(std::chrono::system_clock::time_point deadline);

  const ServerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MatrixStore> store_;  // after backend_: its buffers go back to the backend
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<UploadQueue> uploads_;
  // Over the four above; the service is handed it and must not outlive it (service_ is after).
  std::unique_ptr<GemmCore> core_;
  std::shared_ptr<ServiceMetrics> metrics_;  // null without metrics_listen; samples the above
  UnixPeers unix_peers_;                     // filled by unix_listeners_, read by authenticator_
  std::unique_ptr<Authenticator> authenticator_;
  std::unique_ptr<ServerTls> tls_;           // null: plaintext
  std::unique_ptr<BulkGrants> bulk_grants_;  // null without a bulk channel
  std::unique_ptr<GemmServiceImpl> service_;
  std::unique_ptr<BulkListener> bulk_listener_;  // after core_, which its lanes use
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<HealthService> probe_health_;  // the health-only port's; null without one
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<grpc::Server> server_;        // after the services, which must outlive it
  std::unique_ptr<grpc::Server> probe_server_;  // the health-only port; null without one
  // The plaintext unix: addresses, accepted by the server itself (after server_, which they
  // hand connections to).
  std::vector<std::unique_ptr<UnixListener>> unix_listeners_;
  int port_ = 0;
  std::vector<int> tcp_ports_;  // port_ and more, less the Unix sockets
  int health_port_ = 0;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // last: it calls metrics_ until destroyed
  int metrics_port_ = 0;

  std::mutex mu_;
  std::condition_variable stop_watching_;
  bool shutting_down_ = false;  // guarded by mu_
  std::thread health_watcher_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SERVER_H_
