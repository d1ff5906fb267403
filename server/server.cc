#include "server/server.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/transport/peer_connections.h"
#include "server/transport/status_util.h"

namespace hgemm {
namespace {

// For the TLS port's credentials (SetAuthMetadataProcessor): refuses server reflection calls
// without a principal (UNAUTHENTICATED) and lets every other call through (their services call
// Authenticator::Identify). gRPC runs processors on secure ports only.
class ReflectionGuard final : public grpc::AuthMetadataProcessor {
 public:
  explicit ReflectionGuard(const Authenticator* auth) : auth_(auth) {}

  // Token hashing only: no need for gRPC's separate thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    auto path = metadata.find(":path");
    if (path == metadata.end() ||
        std::string_view(path->second.data(), path->second.size()).rfind("/grpc.reflection.", 0) !=
            0) {
      return grpc::Status::OK;
    }
    Principal caller;
    return ToGrpcStatus(auth_->FromCredentials(metadata, context, &caller));
  }

 private:
  const Authenticator* const auth_;
};

constexpr char kServiceName[] = "hgemm.v1.GemmService";

// True for 127.x.x.x, [::1] and localhost: nobody else can reach a plaintext port there.
bool IsLoopback(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return true;  // a socket file: this host only
  const std::string host = address.substr(0, address.rfind(':'));
  return host.rfind("127.", 0) == 0 || host == "[::1]" || host == "localhost";
}

// "" if the security options fit together, else why not (naming the flags).
std::string CheckSecurity(const ServerOptions& o) {
  if (o.tls.cert_path.empty() != o.tls.key_path.empty())
    return "--tls_cert and --tls_key go together";
  if (!o.tls.client_ca_path.empty() && o.tls.cert_path.empty()) {
    return "--tls_client_ca needs --tls_cert and --tls_key";
  }
  if (o.auth.principal_from_cert && o.tls.client_ca_path.empty()) {
    return "--auth_principal_from_cert needs --tls_client_ca (client certificates)";
  }
  if (o.auth.protect_reflection && o.tls.cert_path.empty()) {
    return "--auth_protect_reflection needs TLS (--tls_cert): gRPC checks reflection calls on "
           "secure ports only";
  }
  if (o.auth.protect_reflection && o.auth.tokens_file.empty() && !o.auth.principal_from_cert) {
    return "--auth_protect_reflection needs authentication (--auth_tokens_file or "
           "--auth_principal_from_cert)";
  }
  return "";
}

// "" if the connection age options fit together, else why not (naming the flags).
std::string CheckConnectionAge(const ServerOptions& o) {
  constexpr std::chrono::milliseconds kMax{INT32_MAX};  // gRPC takes an int of milliseconds
  if (o.max_connection_age.count() < 0 || o.max_connection_age > kMax ||
      o.max_connection_age_grace.count() < 0 || o.max_connection_age_grace > kMax) {
    return "--max_connection_age_s and --max_connection_age_grace_s must be in [0, 2147483] "
           "(gRPC takes them as an int of milliseconds)";
  }
  if (o.max_connection_age_grace.count() > 0 && o.max_connection_age.count() == 0) {
    return "--max_connection_age_grace_s needs --max_connection_age_s";
  }
  return "";
}

constexpr char kUnixPrefix[] = "unix:";

// The socket file of a "unix:PATH" address; "" for any other address.
std::string UnixSocketPath(const std::string& address) {
  if (address.rfind(kUnixPrefix, 0) != 0) return "";
  std::string path = address.substr(sizeof(kUnixPrefix) - 1);
  // "unix:///run/x.sock" and "unix:/run/x.sock" name the same file.
  if (path.rfind("//", 0) == 0) path = path.substr(2);
  return path;
}

// The host a bulk lane connects to: --bulk_listen's own, unless it is every interface; then
// the advertised replica's; else "" (the host the client's call reached).
std::string BulkHost(const ServerOptions& o) {
  std::string host = o.bulk.address.substr(0, o.bulk.address.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") {
    const std::string& replica = o.service.resident.replica;
    host = replica.substr(0, replica.rfind(':'));
  }
  return host;
}

// Every address the service is served on, listen_address first.
std::vector<std::string> ListenAddresses(const ServerOptions& o) {
  std::vector<std::string> addresses{o.listen_address};
  addresses.insert(addresses.end(), o.more_listen_addresses.begin(), o.more_listen_addresses.end());
  return addresses;
}

}  // namespace

HgemmServer::HgemmServer(ServerOptions options, std::unique_ptr<Backend> backend)
    : options_(std::move(options)), backend_(std::move(backend)) {}

std::unique_ptr<HgemmServer> HgemmServer::Start(ServerOptions options,
                                                std::unique_ptr<Backend> backend) {
  options.service.rules.kernels = backend->Kernels();
  options.service.max_message_bytes = options.max_message_bytes;
  options.service.tls = !options.tls.cert_path.empty();
  for (const std::string& address : ListenAddresses(options)) {
    if (!UnixSocketPath(address).empty()) options.service.unix_socket = true;
  }
  std::unique_ptr<HgemmServer> server(new HgemmServer(std::move(options), std::move(backend)));
  const ServerOptions& opts = server->options_;
  std::string error;
  if (error = CheckSecurity(opts); error.empty()) error = CheckConnectionAge(opts);
  if (!error.empty()) {
    spdlog::critical("{}", error);
    return nullptr;
  }
  if (!(server->authenticator_ = Authenticator::Open(opts.auth, &server->unix_peers_, &error))) {
    spdlog::critical("--auth_tokens_file {}", error);
    return nullptr;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!opts.tls.cert_path.empty()) {
    if (!(server->tls_ = ServerTls::Start(opts.tls, &error))) {
      spdlog::critical("TLS: {}", error);
      return nullptr;
    }
    credentials = server->tls_->credentials();
    if (opts.auth.protect_reflection) {
      credentials->SetAuthMetadataProcessor(
          std::make_shared<ReflectionGuard>(server->authenticator_.get()));
    }
  } else {
    for (const std::string& address : ListenAddresses(opts)) {
      if (IsLoopback(address)) continue;
      spdlog::warn(
          "serving PLAINTEXT on {}: anyone on the network can read the matrices{} (set "
          "--tls_cert and --tls_key)",
          address, server->authenticator_->enabled() ? " and the tokens" : "");
    }
  }
  server->store_ = std::make_unique<MatrixStore>(server->backend_.get(), opts.service.resident);
  server->scheduler_ = std::make_unique<Scheduler>(server->backend_.get(), opts.service.scheduler);
  server->uploads_ = std::make_unique<UploadQueue>(server->backend_.get(), opts.upload_threads);
  server->core_ = std::make_unique<GemmCore>(server->scheduler_.get(), server->backend_.get(),
                                             server->store_.get(), server->uploads_.get(),
                                             CoreOptions(opts.service));
  if (!opts.metrics_listen.empty()) {
    const std::vector<DeviceDescription> devices = server->backend_->Devices();
    server->metrics_ = std::make_shared<ServiceMetrics>(
        kVersion, server->backend_->Name(), devices, [s = server.get(), devices] {
          LoadSample load;
          const Scheduler::Stats stats = s->scheduler_->GetStats();
          load.queued = stats.queued;
          load.running = stats.running;
          load.admitted_bytes = stats.admitted_bytes;
          load.upload_queue_writes = s->uploads_->Pending();
          const std::vector<MatrixStore::DeviceUsage> usage = s->store_->UsageByDevice();
          const std::vector<Scheduler::VerifyStats> verify = s->scheduler_->GetVerifyStats();
          for (size_t i = 0; i < usage.size() && i < devices.size(); ++i) {
            load.devices.push_back({std::to_string(devices[i].id), usage[i].bytes,
                                    usage[i].matrices, !s->backend_->DeviceHealthy(int(i)),
                                    verify[i].verified, verify[i].failures, verify[i].reruns,
                                    verify[i].suspect});
          }
          for (const RegionStore::OwnerUsage& u : s->core_->RegionUsageByOwner()) {
            load.region_owners.push_back({u.owner, u.regions, u.bytes});
          }
          load.staged_regions = s->core_->StagedRegions();
          load.rings_attached = s->service_->rings().Attached();
          Scheduler::BatchStats batches = s->scheduler_->GetBatchStats();
          load.batch_members = std::move(batches.by_members);
          load.batch_rows = std::move(batches.by_rows);
          return load;
        });
  }
  server->service_ = std::make_unique<GemmServiceImpl>(
      server->core_.get(), opts.service, server->metrics_.get(), server->authenticator_.get());
  if (!opts.bulk.address.empty()) {
    server->bulk_grants_ = std::make_unique<BulkGrants>(opts.bulk_grants);
    BulkListenerOptions bulk = opts.bulk;
    if (server->tls_) {
      // The lanes get the files the gRPC port serves: the last good version of each.
      bulk.tls = {server->tls_->cert_path(), server->tls_->key_path(),
                  server->tls_->client_ca_path(),
                  opts.tls.client_certificates == ClientCertificates::kRequire};
    }
    server->bulk_listener_ = BulkListener::Start(
        bulk, server->core_.get(), server->bulk_grants_.get(), server->metrics_.get(), &error);
    if (!server->bulk_listener_) {
      spdlog::critical("cannot listen on {} (--bulk_listen): {}", opts.bulk.address, error);
      server->scheduler_->Shutdown();
      return nullptr;
    }
    server->service_->ServeBulk(server->bulk_grants_.get(), server->bulk_listener_->port(),
                                BulkHost(opts));
    if (!server->tls_ && !IsLoopback(opts.bulk.address)) {
      spdlog::warn("bulk channel PLAINTEXT on {}: anyone on the network can read the matrices",
                   opts.bulk.address);
    }
  }

  server->health_ = std::make_unique<HealthService>(std::vector<std::string>{kServiceName});
  if (!opts.health_listen.empty()) {
    server->probe_health_ = std::make_unique<HealthService>(std::vector<std::string>{kServiceName});
    grpc::ServerBuilder probe;
    probe.AddListeningPort(opts.health_listen, grpc::InsecureServerCredentials(),
                           &server->health_port_);
    probe.RegisterService(server->probe_health_.get());
    server->probe_server_ = probe.BuildAndStart();
    if (!server->probe_server_ || server->health_port_ == 0) {
      spdlog::critical("cannot listen on {} (--health_listen)", opts.health_listen);
      server->scheduler_->Shutdown();
      return nullptr;
    }
  }

  server->reflection_ = std::make_unique<ReflectionService>(std::vector<std::string>{
      kServiceName, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"});
  grpc::ServerBuilder builder;
  // unix: addresses are accepted by the server itself (UnixListener, below), for the peers'
  // SO_PEERCRED, and served in plaintext also when TCP has TLS: on one host the kernel already
  // names the peer and nobody else sees the bytes, while gRPC's own Unix listener would make
  // every local caller the same anonymous peer.
  auto listen = [&](const std::string& address, int* port) {
    if (!UnixSocketPath(address).empty()) {
      *port = 1;  // as gRPC reports a Unix socket's
    } else {
      builder.AddListeningPort(address, credentials, port);
    }
  };
  listen(opts.listen_address, &server->port_);
  std::vector<int> more_ports(opts.more_listen_addresses.size(), 0);
  for (size_t i = 0; i < more_ports.size(); ++i)
    listen(opts.more_listen_addresses[i], &more_ports[i]);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->health_.get());
  builder.RegisterService(server->reflection_.get());
  const int max_message = static_cast<int>(std::min<int64_t>(opts.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  if (opts.max_connection_age.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(opts.max_connection_age.count()));
  }
  if (opts.max_connection_age_grace.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(opts.max_connection_age_grace.count()));
  }
  ApplyGrpcArgs(opts.grpc_args, &builder);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    spdlog::error("cannot listen on {}", opts.listen_address);
    server->scheduler_->Shutdown();
    return nullptr;
  }
  for (size_t i = 0; i < more_ports.size(); ++i) {
    if (more_ports[i] == 0) {
      spdlog::error("cannot listen on {}", opts.more_listen_addresses[i]);
      return nullptr;  // ~HgemmServer stops the gRPC server
    }
    if (UnixSocketPath(opts.more_listen_addresses[i]).empty())
      server->tcp_ports_.push_back(more_ports[i]);
  }
  if (UnixSocketPath(opts.listen_address).empty()) server->tcp_ports_.push_back(server->port_);
  for (const std::string& address : ListenAddresses(opts)) {
    const std::string path = UnixSocketPath(address);
    if (path.empty()) continue;
    auto listener = UnixListener::Start(path, opts.unix_socket_mode, server->server_.get(),
                                        &server->unix_peers_, &error);
    if (!listener) {
      spdlog::error("cannot listen on {}: {}", address, error);
      return nullptr;  // ~HgemmServer stops the gRPC server
    }
    server->unix_listeners_.push_back(std::move(listener));
  }
  if (server->metrics_) {
    server->metrics_http_ = MetricsHttpServer::Start(opts.metrics_listen, server->metrics_, &error);
    if (!server->metrics_http_) {
      spdlog::error("cannot serve metrics on {}: {}", opts.metrics_listen, error);
      return nullptr;  // ~HgemmServer stops the gRPC server
    }
    server->metrics_port_ = server->metrics_http_->port();
  }
  server->health_watcher_ = std::thread([s = server.get()] { s->WatchHealth(); });
  return server;
}

HgemmServer::~HgemmServer() { Shutdown(); }

void HgemmServer::WatchHealth() {
  std::unique_lock<std::mutex> lock(mu_);
  bool serving = !backend_->Healthy();  // differs, so the first pass always publishes
  while (!shutting_down_) {
    if (bool healthy = backend_->Healthy(); healthy != serving) {
      serving = healthy;
      health_->SetServing(serving);
      if (probe_health_) probe_health_->SetServing(serving);
      if (!serving) spdlog::error("backend unhealthy: health is NOT_SERVING");
    }
    stop_watching_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

void HgemmServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  stop_watching_.notify_all();
  if (health_watcher_.joinable()) health_watcher_.join();
  if (probe_server_) {  // the probe hears NOT_SERVING, then the port closes
    probe_health_->Shutdown();
    probe_server_->Shutdown(std::chrono::system_clock::now());
    probe_server_->Wait();
  }
  if (!server_) {  // Start gave up before serving
    if (scheduler_) scheduler_->Shutdown();
    return;
  }
  health_->Shutdown();      // NOT_SERVING for good; Watch calls end
  service_->Drain();        // idle streams end now, busy ones once their work is answered
  unix_listeners_.clear();  // no new connections on the Unix sockets
  bulk_listener_.reset();   // nor bulk lanes; those in progress are cut
  spdlog::info("draining: in-flight calls have {} ms", options_.drain_deadline.count());
  const auto deadline = std::chrono::system_clock::now() + options_.drain_deadline;
  WaitForAdmittedWork(deadline);
  server_->Shutdown(deadline);
  scheduler_->Shutdown();
  server_->Wait();
  WaitForPeersToClose();
  metrics_http_.reset();  // joins its thread: no scrape runs once Shutdown returns
  spdlog::info("stopped");
}

void HgemmServer::WaitForAdmittedWork(std::chrono::system_clock::time_point deadline) {
  // gRPC closes a connection as soon as its last call is over after Shutdown, and a socket
  // closed with unread input (the client's flow-control updates for the answer just sent) is
  // reset: the client may lose that answer (CI: a drained stream ended "Connection reset by
  // peer"). So the answers go out before Shutdown, while the transports still read.
  const int64_t admitted = scheduler_->GetStats().admitted_total;
  while (scheduler_->GetStats().completed_total < admitted &&
         std::chrono::system_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

void HgemmServer::WaitForPeersToClose() {
  // Every call is answered, but the last bytes of an answer may still be in gRPC's write queue
  // or the socket's send buffer, and the peer's flow-control updates keep arriving. A process
  // that exits now closes sockets with unread input, which resets them and drops those bytes
  // (a client saw "Connection reset by peer" for a drained stream). After the GOAWAY, a gRPC
  // client closes its connection once it has read its last answer: wait for that, bounded.
  constexpr auto kBound = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  auto open = [this] {
    int count = 0;
    for (int port : tcp_ports_) count += OpenTcpConnections(port);
    return count;
  };
  int still_open = open();
  while (still_open > 0 && std::chrono::steady_clock::now() - start < kBound) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    still_open = open();
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  if (still_open > 0) {
    spdlog::warn("{} client connection(s) still open {} ms after the drain; closing them",
                 still_open, waited.count());
  } else {
    spdlog::debug("client connections closed {} ms after the drain", waited.count());
  }
}

}  // namespace hgemm
