// hgemm_server: serves hgemm.v1.GemmService. Every flag can also be set through the
// environment variable named in its help (e.g. HGEMM_LISTEN), for containers.
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/grpc_args.h"
#include "server/backend/backend_factory.h"
#include "server/server.h"
#include "server/transport/grpc_logging.h"

namespace {

std::vector<int> ParseDeviceList(const std::string& list) {
  std::vector<int> devices;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) devices.push_back(std::stoi(item));
  }
  return devices;
}

// gRPC reads a socket into freshly malloc()ed slices of up to 4 MiB and frees each once its
// message is consumed. glibc's defaults hand such blocks back to the kernel (munmap, or a trim
// of the heap's top past twice the last freed block), so the next read faults in and zeroes
// new pages: a sixth of an upload's server CPU (docs/data_plane.md, "Where a remote byte's
// time goes"). Blocks up to 32 MiB (glibc's largest threshold) now come from the heap and its
// top is kept up to 256 MiB, so reads reuse pages already mapped; larger blocks (matrices)
// are still mapped and unmapped on their own.
void KeepReadBuffersMapped() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  hgemm::ServerOptions server_options;
  hgemm::BackendOptions backend_options;
  std::string devices, log_level = "info", tls_client_auth = "request", log_format = "text";
  int64_t drain_deadline_s = 20, resident_ttl_s = 0, stream_idle_timeout_s = 60;

  CLI::App app{"hgemm-serve: fp16 GEMM over gRPC (hgemm.v1.GemmService)"};
  std::vector<std::string> listen{server_options.listen_address};
  app.add_option("--listen", listen,
                 "HOST:PORT or unix:/PATH to serve on; may be given several times, or as a "
                 "comma-separated list (a Unix socket beside TCP: shared memory is accepted only "
                 "over a unix: one)")
      ->envname("HGEMM_LISTEN")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--allowed_uids", server_options.auth.allowed_uids,
                 "uids that may call over the unix: sockets (the kernel's SO_PEERCRED; others "
                 "get PERMISSION_DENIED), comma-separated; empty: any")
      ->envname("HGEMM_ALLOWED_UIDS")
      ->delimiter(',');
  std::string unix_socket_mode;
  app.add_option("--unix_socket_mode", unix_socket_mode,
                 "octal file mode given to each unix: socket once bound, e.g. 0660 (empty: "
                 "gRPC's default)")
      ->envname("HGEMM_UNIX_SOCKET_MODE")
      ->check([](const std::string& mode) -> std::string {
        if (mode.empty() || mode.size() > 4 ||
            mode.find_first_not_of("01234567") != std::string::npos) {
          return "an octal mode such as 0660";
        }
        return "";
      });
  app.add_option("--advertise_address", server_options.service.resident.replica,
                 "HOST:PORT clients reach this replica at (e.g. its pod's DNS name), for one of "
                 "several replicas: handles name it, so clients send calls naming a handle here "
                 "(empty: a single server)")
      ->envname("HGEMM_ADVERTISE_ADDRESS")
      ->check([](const std::string& address) -> std::string {
        // Handles end with "@" + the address (proto/handle.h): it must be one plain token.
        if (address.find_first_of("@ \t\n/,") != std::string::npos) {
          return "a HOST:PORT without '@', '/', ',' or spaces";
        }
        return "";
      });
  app.add_option("--metrics_listen", server_options.metrics_listen,
                 "HOST:PORT serving Prometheus metrics over HTTP at /metrics (empty: off)")
      ->envname("HGEMM_METRICS_LISTEN");
  app.add_option("--bulk_listen", server_options.bulk.address,
                 "HOST:PORT of the bulk channel: large transfers move over TCP connections of "
                 "their own beside gRPC (OpenBulk; TLS with --tls_cert; empty: off)")
      ->envname("HGEMM_BULK_LISTEN");
  app.add_option("--max_bulk_lanes", server_options.bulk_grants.max_lanes,
                 "bulk lanes one client may hold granted and not yet connected")
      ->envname("HGEMM_MAX_BULK_LANES")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--max_bulk_connections", server_options.bulk.max_connections,
                 "bulk connections served at once (more are closed)")
      ->envname("HGEMM_MAX_BULK_CONNECTIONS")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--health_listen", server_options.health_listen,
                 "HOST:PORT of a plaintext port serving only grpc.health.v1, for probes that speak "
                 "no TLS (empty: none)")
      ->envname("HGEMM_HEALTH_LISTEN");
  app.add_option("--tls_cert", server_options.tls.cert_path,
                 "PEM certificate (chain) of the gRPC port: serve TLS (with --tls_key); re-read on "
                 "change")
      ->envname("HGEMM_TLS_CERT");
  app.add_option("--tls_key", server_options.tls.key_path, "PEM private key of --tls_cert")
      ->envname("HGEMM_TLS_KEY");
  app.add_option("--tls_client_ca", server_options.tls.client_ca_path,
                 "PEM CA bundle of client certificates: mutual TLS (see --tls_client_auth)")
      ->envname("HGEMM_TLS_CLIENT_CA");
  app.add_option("--tls_client_auth", tls_client_auth,
                 "with --tls_client_ca: request (verify a client certificate if one is sent) or "
                 "require (no connection without one)")
      ->envname("HGEMM_TLS_CLIENT_AUTH")
      ->check(CLI::IsMember({"request", "require"}))
      ->capture_default_str();
  app.add_option("--auth_tokens_file", server_options.auth.tokens_file,
                 "lines PRINCIPAL SHA256_HEX_OF_TOKEN [admin]: every GemmService call needs "
                 "\"authorization: Bearer TOKEN\"; re-read on change")
      ->envname("HGEMM_AUTH_TOKENS_FILE");
  app.add_flag("--auth_principal_from_cert", server_options.auth.principal_from_cert,
               "a verified client certificate (--tls_client_ca) names the principal: its first "
               "SAN, else its CN")
      ->envname("HGEMM_AUTH_PRINCIPAL_FROM_CERT");
  app.add_flag("--auth_protect_reflection", server_options.auth.protect_reflection,
               "server reflection needs authentication too (TLS only; health stays open)")
      ->envname("HGEMM_AUTH_PROTECT_REFLECTION");
  app.add_option("--backend", backend_options.kind,
                 "auto (CUDA if a GPU is usable, else CPU), cuda or cpu")
      ->envname("HGEMM_BACKEND")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  app.add_option("--devices", devices, "CUDA devices to use, e.g. 0,1 (default: all visible)")
      ->envname("HGEMM_DEVICES");
  app.add_option("--streams_per_device", backend_options.cuda.streams_per_device,
                 "CUDA streams (concurrent GEMMs) per device")
      ->envname("HGEMM_STREAMS_PER_DEVICE")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--preallocate_bytes_per_stream",
                 backend_options.cuda.preallocate_bytes_per_stream,
                 "device buffer bytes each stream allocates at start (grown on demand)")
      ->envname("HGEMM_PREALLOCATE_BYTES_PER_STREAM")
      ->capture_default_str();
  app.add_option("--device_memory_fraction", backend_options.cuda.device_memory_fraction,
                 "share of each device's free memory the streams' buffers may use")
      ->envname("HGEMM_DEVICE_MEMORY_FRACTION")
      ->check(CLI::Range(0.05, 0.98))
      ->capture_default_str();
  app.add_flag("--fused_scale,!--no_fused_scale", backend_options.cuda.fused_scale,
               "alpha/beta inside the kernels that can (--no_fused_scale: a separate epilogue "
               "pass over an fp32 intermediate)")
      ->envname("HGEMM_FUSED_SCALE");
  int64_t spin_us = 1000;
  app.add_option("--spin_us", spin_us,
                 "how long an idle worker polls for the next GEMM, and a kept-C GEMM polls for its "
                 "kernel's end, before sleeping (lower latency for CPU; 0 = always sleep)")
      ->envname("HGEMM_SPIN_US")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}))
      ->capture_default_str();
  app.add_option("--upload_threads", server_options.upload_threads,
                 "threads copying streamed chunks to the device as they arrive")
      ->envname("HGEMM_UPLOAD_THREADS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--cpu_workers", backend_options.cpu.workers,
                 "concurrent GEMMs on the CPU backend")
      ->envname("HGEMM_CPU_WORKERS")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--max_elements_per_matrix", server_options.service.rules.max_elements_per_matrix,
                 "largest A, B or C accepted, in elements (at most 2^40)")
      ->envname("HGEMM_MAX_ELEMENTS_PER_MATRIX")
      ->check(CLI::Range(int64_t{1}, hgemm::kMaxElementsPerMatrix))
      ->capture_default_str();
  app.add_option("--max_queued_requests", server_options.service.scheduler.max_queued_requests,
                 "GEMMs waiting for a stream; more get UNAVAILABLE")
      ->envname("HGEMM_MAX_QUEUED_REQUESTS")
      ->capture_default_str();
  // Unset: a quarter of --max_queued_requests, whatever that is set to.
  int64_t max_queued_per_client = -1;
  app.add_option("--max_queued_per_client", max_queued_per_client,
                 "of those, GEMMs of one client; more of its get UNAVAILABLE while other clients' "
                 "are still admitted (default: a quarter of --max_queued_requests; 0: no limit)")
      ->envname("HGEMM_MAX_QUEUED_PER_CLIENT")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_queued_bytes", server_options.service.scheduler.max_queued_bytes,
                 "operand+result bytes of admitted GEMMs; more get UNAVAILABLE")
      ->envname("HGEMM_MAX_QUEUED_BYTES")
      ->capture_default_str();
  app.add_option("--max_message_bytes", server_options.max_message_bytes,
                 "largest gRPC message accepted (unary Gemm)")
      ->envname("HGEMM_MAX_MESSAGE_BYTES")
      ->check(CLI::Range(int64_t{4} << 20, int64_t{INT32_MAX}))
      ->capture_default_str();
  int64_t max_connection_age_s = 0, max_connection_age_grace_s = 0;
  app.add_option("--max_connection_age_s", max_connection_age_s,
                 "a client connection this old (±10 %) is sent a GOAWAY, so that its client "
                 "reconnects and re-resolves the server's name and reaches replicas added since "
                 "(a round_robin channel over a headless Service); 0: never")
      ->envname("HGEMM_MAX_CONNECTION_AGE_S")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  app.add_option("--max_connection_age_grace_s", max_connection_age_grace_s,
                 "then, how long the calls still open on it may go on before it is closed (they "
                 "end UNAVAILABLE); 0: until they end. Keep 0 where submission rings are used: "
                 "an AttachRing call stays open as long as its ring is attached")
      ->envname("HGEMM_MAX_CONNECTION_AGE_GRACE_S")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  app.add_option("--max_stream_pending_bytes", server_options.service.max_stream_pending_bytes,
                 "operand bytes one GemmStream may hold for GEMMs whose chunks are still coming")
      ->envname("HGEMM_MAX_STREAM_PENDING_BYTES")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max_client_pending_bytes", server_options.service.max_client_pending_bytes,
                 "the same, summed over all streams of one client")
      ->envname("HGEMM_MAX_CLIENT_PENDING_BYTES")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--stream_idle_timeout_s", stream_idle_timeout_s,
                 "a streamed GEMM or upload whose next chunk takes longer is refused and freed")
      ->envname("HGEMM_STREAM_IDLE_TIMEOUT_S")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--resident_quota_bytes", server_options.service.resident.quota_bytes_per_client,
                 "resident-matrix bytes one client may hold")
      ->envname("HGEMM_RESIDENT_QUOTA_BYTES")
      ->capture_default_str();
  app.add_option("--resident_ttl_s", resident_ttl_s,
                 "default time to live of resident matrices after their last use (0: none)")
      ->envname("HGEMM_RESIDENT_TTL_S")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--resident_copy_to_idle_device",
               server_options.service.scheduler.copy_resident_to_idle_device,
               "run a GEMM whose resident operands live on a saturated GPU on an idle one, copying "
               "the operands over")
      ->envname("HGEMM_RESIDENT_COPY_TO_IDLE_DEVICE")
      ->capture_default_str();
  app.add_flag("--verify", server_options.service.scheduler.verify_all,
               "check every GEMM's C by Freivalds' method before answering "
               "(docs/verification.md), not only those that ask (GemmOptions.verify)")
      ->envname("HGEMM_VERIFY");
  app.add_option("--verify_repetitions", server_options.service.scheduler.verify_repetitions,
                 "repetitions of the check (fresh random vectors) for a GEMM that names none")
      ->envname("HGEMM_VERIFY_REPETITIONS")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--verify_failures_to_retire",
                 server_options.service.scheduler.verify_failures_to_retire,
                 "failed Freivalds checks after which a device is taken out of service, as after "
                 "a sticky fault (0: never)")
      ->envname("HGEMM_VERIFY_FAILURES_TO_RETIRE")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--batching", server_options.service.scheduler.batching,
                 "run queued GEMMs of one client that share a resident B (same b_handle, form and "
                 "options) as one GEMM with their rows stacked (docs/operations.md, Batching); "
                 "off: every GEMM runs alone")
      ->envname("HGEMM_BATCHING")
      ->capture_default_str();
  int64_t batch_window_us = 0;
  app.add_option("--batch_window_us", batch_window_us,
                 "how long past a batchable GEMM's arrival its worker waits for more GEMMs to "
                 "share its launch (0: it takes what is queued and waits for nothing)")
      ->envname("HGEMM_BATCH_WINDOW_US")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--max_batch_rows", server_options.service.scheduler.max_batch_rows,
                 "rows (the GEMMs' m summed) of one batched launch at most")
      ->envname("HGEMM_MAX_BATCH_ROWS")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--resident_lru_eviction", server_options.service.resident.lru_eviction,
               "when device memory is full, evict least recently used resident matrices")
      ->envname("HGEMM_RESIDENT_LRU_EVICTION");
  app.add_flag("--allow_shared_memory", server_options.service.regions.allow_shared_memory,
               "accept shared-memory regions (sealed memfds, RegisterRegion) on calls over a "
               "unix: listener; off: refused with FAILED_PRECONDITION")
      ->envname("HGEMM_ALLOW_SHARED_MEMORY");
  app.add_option("--pin_shared_memory", server_options.service.regions.pin_for_dma,
                 "pin each region's pages for the GPUs (cudaHostRegister) so that operands and C "
                 "travel by DMA; false: through staging buffers (locks no memory)")
      ->envname("HGEMM_PIN_SHARED_MEMORY")
      ->capture_default_str();
  int64_t region_ttl_s = 3600;
  app.add_option("--region_ttl_s", region_ttl_s,
                 "a region no GEMM used for this long is released (the regions of a client that "
                 "went away); 0: kept until unregistered")
      ->envname("HGEMM_REGION_TTL_S")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max_regions_per_client", server_options.service.regions.max_regions_per_owner,
                 "shared-memory regions one client may have registered")
      ->envname("HGEMM_MAX_REGIONS_PER_CLIENT")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max_region_bytes_per_client",
                 server_options.service.regions.max_bytes_per_owner,
                 "bytes of the shared-memory regions one client may have registered")
      ->envname("HGEMM_MAX_REGION_BYTES_PER_CLIENT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max_region_bytes_total", server_options.service.regions.max_host_bytes,
                 "bytes of the shared-memory regions of all clients together: the server pins "
                 "them, so keep it below the memory the server may lock (its container's limit)")
      ->envname("HGEMM_MAX_REGION_BYTES_TOTAL")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--allow_cuda_ipc", server_options.service.regions.allow_cuda_ipc,
               "accept CUDA IPC regions (RegisterRegion.cuda_ipc) from the unix: listeners' "
               "callers: trusted clients only, since an exporter that frees its memory during a "
               "GEMM can fault the GPU for everyone (docs/same_host_security.md)")
      ->envname("HGEMM_ALLOW_CUDA_IPC");
  app.add_option("--ring_spin_us", server_options.service.rings.spin_us,
                 "how long a submission ring's thread polls for the client's next entry before it "
                 "sleeps on the ring's futex (lower latency for one CPU core per busy ring)")
      ->envname("HGEMM_RING_SPIN_US")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}))
      ->capture_default_str();
  app.add_option("--ring_max_in_flight", server_options.service.rings.max_in_flight,
                 "GEMMs of one submission ring admitted and not yet completed, at most")
      ->envname("HGEMM_RING_MAX_IN_FLIGHT")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max_rings_per_client", server_options.service.rings.max_rings_per_owner,
                 "submission rings (AttachRing) one client may have attached at once")
      ->envname("HGEMM_MAX_RINGS_PER_CLIENT")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--drain_deadline_s", drain_deadline_s,
                 "on SIGTERM/SIGINT, seconds in-flight calls get before they are cancelled")
      ->envname("HGEMM_DRAIN_DEADLINE_S")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  app.add_option("--log_level", log_level, "trace, debug (one line per GEMM), info, warn, error")
      ->envname("HGEMM_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--log_format", log_format,
                 "text, or json: one JSON object per line (time, level, message, and the fields of "
                 "a call: rpc, code, reason, request_id, peer, principal, traceparent)")
      ->envname("HGEMM_LOG_FORMAT")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  hgemm::AddGrpcArgFlag(&app, &server_options.grpc_args);
  CLI11_PARSE(app, argc, argv);
  KeepReadBuffersMapped();
  if (!listen.empty()) server_options.listen_address = listen.front();
  if (listen.size() > 1)
    server_options.more_listen_addresses.assign(listen.begin() + 1, listen.end());
  if (!unix_socket_mode.empty())
    server_options.unix_socket_mode = std::stoi(unix_socket_mode, nullptr, 8);

  hgemm::logging::Format format = hgemm::logging::Format::kText;
  hgemm::logging::ParseFormat(log_format, &format);
  hgemm::InstallServerLogging(format);
  spdlog::set_level(spdlog::level::from_str(log_level));
  backend_options.cuda.devices = ParseDeviceList(devices);
  backend_options.cuda.completion_spin = std::chrono::microseconds(spin_us);
  server_options.service.scheduler.idle_spin = std::chrono::microseconds(spin_us);
  server_options.service.scheduler.batch_window = std::chrono::microseconds(batch_window_us);
  hgemm::SchedulerOptions& scheduler = server_options.service.scheduler;
  scheduler.max_queued_per_owner = max_queued_per_client >= 0
                                       ? max_queued_per_client
                                       : std::max<int64_t>(1, scheduler.max_queued_requests / 4);
  server_options.drain_deadline = std::chrono::seconds(drain_deadline_s);
  server_options.max_connection_age = std::chrono::seconds(max_connection_age_s);
  server_options.max_connection_age_grace = std::chrono::seconds(max_connection_age_grace_s);
  server_options.tls.client_certificates = tls_client_auth == "require"
                                               ? hgemm::ClientCertificates::kRequire
                                               : hgemm::ClientCertificates::kRequest;
  server_options.service.resident.default_ttl = std::chrono::seconds(resident_ttl_s);
  server_options.service.idle_timeout = std::chrono::seconds(stream_idle_timeout_s);
  server_options.service.resident.upload_idle_timeout = server_options.service.idle_timeout;
  server_options.bulk.idle_timeout = server_options.service.idle_timeout;
  server_options.service.regions.ttl = std::chrono::seconds(region_ttl_s);

  // Signals are taken by sigwait below, never by a handler: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string error;
  std::unique_ptr<hgemm::Backend> backend = hgemm::CreateBackend(backend_options, &error);
  if (!backend) {
    spdlog::critical("no backend: {}", error);
    return 1;
  }
  std::unique_ptr<hgemm::HgemmServer> server =
      hgemm::HgemmServer::Start(server_options, std::move(backend));
  if (!server) return 1;

  if (server->metrics_port() != 0) {
    spdlog::info("metrics at http://{}/metrics (port {})", server_options.metrics_listen,
                 server->metrics_port());
  }
  const hgemm::Backend& b = server->backend();
  // A Unix socket has no port: gRPC reports 1 for it, which would read as a TCP port.
  if (server_options.listen_address.rfind("unix:", 0) == 0) {
    spdlog::info("hgemm-serve {} listening on {}", hgemm::kVersion, server_options.listen_address);
  } else {
    spdlog::info("hgemm-serve {} listening on {} (port {})", hgemm::kVersion,
                 server_options.listen_address, server->port());
  }
  for (const std::string& address : server_options.more_listen_addresses) {
    spdlog::info("also listening on {}", address);
  }
  if (!server_options.service.resident.replica.empty()) {
    spdlog::info("replica {}: resident-matrix handles name it",
                 server_options.service.resident.replica);
  }
  spdlog::info("security: {}, {}",
               server_options.tls.cert_path.empty()        ? "plaintext"
               : server_options.tls.client_ca_path.empty() ? "TLS"
               : tls_client_auth == "require" ? "mutual TLS (client certificates required)"
                                              : "mutual TLS (client certificates requested)",
               server_options.auth.tokens_file.empty() && !server_options.auth.principal_from_cert
                   ? "no authentication (callers named by x-client-id or address)"
                   : "authentication required");
  if (server->bulk_port() != 0) {
    spdlog::info("bulk channel on {} (port {})", server_options.bulk.address, server->bulk_port());
  }
  if (server->health_port() != 0) {
    spdlog::info("health only (plaintext) on {} (port {})", server_options.health_listen,
                 server->health_port());
  }
  spdlog::info("backend {}: {} execution slots, largest GEMM {} bytes", b.Name(), b.NumSlots(),
               b.MaxJobBytes());
  for (const hgemm::DeviceDescription& d : b.Devices()) {
    if (d.compute_capability.empty()) {
      spdlog::info("  {}: {} workers", d.name, d.slots);
    } else {
      spdlog::info("  device {}: {} (cc {}, {} MiB, {} streams)", d.id, d.name,
                   d.compute_capability, d.memory_bytes >> 20, d.slots);
    }
  }
  spdlog::info(
      "limits: {} elements per matrix, {} queued GEMMs ({} per client), {} queued bytes, "
      "{} bytes per message",
      server_options.service.rules.max_elements_per_matrix,
      server_options.service.scheduler.max_queued_requests,
      server_options.service.scheduler.max_queued_per_owner,
      server_options.service.scheduler.max_queued_bytes, server_options.max_message_bytes);
  if (server_options.service.scheduler.batching) {
    spdlog::info("batching: GEMMs sharing a resident B, up to {} rows per launch, {} us window",
                 server_options.service.scheduler.max_batch_rows, batch_window_us);
  } else {
    spdlog::info("batching: off");
  }

  if (max_connection_age_s > 0) {
    spdlog::info("connections: a GOAWAY after {} s, then closed {}", max_connection_age_s,
                 max_connection_age_grace_s > 0
                     ? fmt::format("{} s later", max_connection_age_grace_s)
                     : std::string("once their calls have ended"));
  }

  // Until a signal, or until no device is usable (sticky faults): then drain and exit
  // kExitDeviceFailed, so that the orchestrator restarts the server.
  static constexpr int kExitDeviceFailed = 3;
  const timespec poll_interval{0, 100'000'000};
  int signal_number = -1;
  while ((signal_number = sigtimedwait(&signals, nullptr, &poll_interval)) < 0 && b.Healthy()) {
  }
  if (signal_number > 0) {
    spdlog::info("received {}; shutting down", strsignal(signal_number));
  } else {
    spdlog::critical("every device has failed; draining, then exiting with {}", kExitDeviceFailed);
  }
  // The drain cancels what is left at its deadline; a GEMM already on a device still runs to
  // its end. Past this margin the exit is forced, so an orchestrator's grace period sized
  // from --drain_deadline_s holds whatever the calls in flight are doing.
  static constexpr int kExitMarginSeconds = 10;
  std::thread([deadline =
                   server_options.drain_deadline + std::chrono::seconds(kExitMarginSeconds)] {
    std::this_thread::sleep_for(deadline);
    spdlog::error("shutdown took longer than the drain deadline + {} s; exiting now",
                  kExitMarginSeconds);
    spdlog::shutdown();
    std::_Exit(1);
  }).detach();
  server->Shutdown();
  // Every call is answered and the log flushed. Skip the library teardown: gRPC's (and the CUDA
  // runtime's) exit-time cleanup was seen to linger up to ~8 s after GPU traffic, which would
  // push the exit past the Kubernetes grace period the drain deadline is sized for.
  const int failed = b.FailedDevices();
  if (failed > 0)
    spdlog::critical("{} device(s) failed; exit status {}", failed, kExitDeviceFailed);
  spdlog::shutdown();
  std::_Exit(failed > 0 ? kExitDeviceFailed : 0);
}
