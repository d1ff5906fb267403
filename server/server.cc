#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <string>
#include <vector>

namespace hgemm {
namespace {

constexpr char kServiceName[] = "hgemm.v1.GemmService";

}  // namespace

HgemmServer::HgemmServer(ServerOptions options, std::unique_ptr<Backend> backend)
    : options_(std::move(options)), backend_(std::move(backend)) {}

std::unique_ptr<HgemmServer> HgemmServer::Start(ServerOptions options,
                                                std::unique_ptr<Backend> backend) {
  options.service.rules.kernels = backend->Kernels();
  options.service.max_message_bytes = options.max_message_bytes;
  std::unique_ptr<HgemmServer> server(new HgemmServer(std::move(options), std::move(backend)));
  const ServerOptions& opts = server->options_;
  server->store_ = std::make_unique<MatrixStore>(server->backend_.get(), opts.service.resident);
  server->scheduler_ = std::make_unique<Scheduler>(server->backend_.get(), opts.service.scheduler);
  server->uploads_ = std::make_unique<UploadQueue>(server->backend_.get(), opts.upload_threads);
  if (!opts.metrics_listen.empty()) {
    const std::vector<DeviceDescription> devices = server->backend_->Devices();
    server->metrics_ = std::make_shared<ServiceMetrics>(
        kVersion, server->backend_->Name(), devices,
        [s = server.get(), devices] {
          LoadSample load;
          const Scheduler::Stats stats = s->scheduler_->GetStats();
          load.queued = stats.queued;
          load.running = stats.running;
          load.admitted_bytes = stats.admitted_bytes;
          load.upload_queue_writes = s->uploads_->Pending();
          const std::vector<MatrixStore::DeviceUsage> usage = s->store_->UsageByDevice();
          for (size_t i = 0; i < usage.size() && i < devices.size(); ++i) {
            load.devices.push_back({std::to_string(devices[i].id), usage[i].bytes, usage[i].matrices});
          }
          return load;
        });
  }
  server->service_ = std::make_unique<GemmServiceImpl>(
      server->scheduler_.get(), server->backend_.get(), server->store_.get(),
      server->uploads_.get(), opts.service, server->metrics_.get());

  server->health_ = std::make_unique<HealthService>(std::vector<std::string>{kServiceName});

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(opts.listen_address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->health_.get());
  const int max_message = static_cast<int>(std::min<int64_t>(opts.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    spdlog::error("cannot listen on {}", opts.listen_address);
    server->scheduler_->Shutdown();
    return nullptr;
  }
  if (server->metrics_) {
    std::string error;
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
  health_->Shutdown();  // NOT_SERVING for good; Watch calls end
  service_->Drain();    // idle streams end now, busy ones once their work is answered
  spdlog::info("draining: in-flight calls have {} ms", options_.drain_deadline.count());
  server_->Shutdown(std::chrono::system_clock::now() + options_.drain_deadline);
  scheduler_->Shutdown();
  server_->Wait();
  metrics_http_.reset();  // joins its thread: no scrape runs once Shutdown returns
  spdlog::info("stopped");
}

}  // namespace hgemm
