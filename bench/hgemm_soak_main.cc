// hgemm_soak: a long mixed run against an hgemm server that counts lost responses and wrong
// results (both must be 0) and watches the server's memory (docs/soak.md).
//
//   hgemm_soak --server_binary=bazel-bin/server/hgemm_server          # starts a CPU server
//   hgemm_soak --target=127.0.0.1:50051 --server_pid=$(pgrep -n hgemm_server)
//
// Prints requests by kind × status code, lost, wrong, and the server's VmRSS before the run, at
// its end and after --idle_s idle seconds, with the server's load then (nothing may stay
// admitted). Exits 1 if anything was lost or wrong, or the server died; 2 on a usage error.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include "bench/hgemm_load.h"
#include "bench/soak.h"
#include "proto/hgemm.grpc.pb.h"

namespace {

using hgemm::bench::ProcessMemory;
using hgemm::bench::ReadProcessMemory;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

// Starts `binary --listen=127.0.0.1:PORT --backend=cpu ARGS...`, output to `log`.
pid_t StartServer(const std::string& binary, int port, const std::string& args,
                  const std::string& log) {
  std::vector<std::string> argv_strings = {binary, fmt::format("--listen=127.0.0.1:{}", port),
                                           "--backend=cpu"};
  std::istringstream in(args);
  for (std::string a; in >> a;) argv_strings.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

bool Alive(pid_t pid) {
  if (pid <= 0) return false;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) return false;  // our child, exited
  return kill(pid, 0) == 0;
}

grpc::Status ServerInfo(const std::string& target, hgemm::v1::ServerInfo* info, double timeout_s,
                        bool wait_for_ready) {
  auto stub = hgemm::v1::GemmService::NewStub(hgemm::bench::LoadGenerator::MakeChannel(target));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  context.set_wait_for_ready(wait_for_ready);
  return stub->GetServerInfo(&context, hgemm::v1::GetServerInfoRequest(), info);
}

std::string Load(const hgemm::v1::ServerInfo& info) {
  const auto& l = info.load();
  return fmt::format(
      "queued {}, running {}, admitted_bytes {}, admitted_total {}, completed_total {}", l.queued(),
      l.running(), l.admitted_bytes(), l.admitted_total(), l.completed_total());
}

std::string Memory(const ProcessMemory& m) {
  if (m.rss_kib < 0) return "unreadable";
  return fmt::format("VmRSS {:.1f} MiB (VmHWM {:.1f} MiB)", m.rss_kib / 1024.0, m.hwm_kib / 1024.0);
}

// The resident matrices the soak's clients still hold, and whether the server's accounting agrees:
// each client's client_bytes must equal the bytes of its listed matrices, and once those are
// released (matrices that cancelled uploads created anyway), be 0.
struct ResidentCheck {
  int64_t matrices = 0, bytes = 0;  // listed after the run
  int64_t mismatched_clients = 0;   // client_bytes != the listed bytes, before or after release
  bool ok = true;                   // every call answered
};

ResidentCheck CheckResident(const std::string& target, const hgemm::bench::SoakOptions& o) {
  auto stub = hgemm::v1::GemmService::NewStub(hgemm::bench::LoadGenerator::MakeChannel(target));
  auto call = [&](int i, auto method, const auto& request, auto* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context.AddMetadata("x-client-id", fmt::format("{}-{}", o.client_id_prefix, i));
    return ((*stub).*method)(&context, request, response).ok();
  };
  ResidentCheck check;
  for (int i = 0; i < o.clients; ++i) {
    hgemm::v1::ListMatricesResponse list;
    if (!call(i, &hgemm::v1::GemmService::Stub::ListMatrices, hgemm::v1::ListMatricesRequest(),
              &list)) {
      check.ok = false;
      continue;
    }
    int64_t listed = 0;
    for (const auto& m : list.matrices()) {
      listed += m.bytes();
      hgemm::v1::ReleaseMatrixRequest release;
      release.set_handle(m.handle());
      hgemm::v1::ReleaseMatrixResponse freed;
      if (!call(i, &hgemm::v1::GemmService::Stub::ReleaseMatrix, release, &freed)) check.ok = false;
    }
    check.matrices += list.matrices_size();
    check.bytes += listed;
    bool mismatch = int64_t(list.client_bytes()) != listed;
    if (!call(i, &hgemm::v1::GemmService::Stub::ListMatrices, hgemm::v1::ListMatricesRequest(),
              &list)) {
      check.ok = false;
    } else if (list.matrices_size() != 0 || list.client_bytes() != 0) {
      mismatch = true;
    }
    if (mismatch) check.mismatched_clients++;
  }
  return check;
}

}  // namespace

int main(int argc, char** argv) {
  hgemm::bench::SoakOptions o;
  std::string server_binary, server_args, server_log = "/tmp/hgemm_soak_server.log";
  int server_pid = 0;
  double idle_s = 60, startup_timeout_s = 120, shutdown_timeout_s = 60;

  CLI::App app{"hgemm_soak: many clients, mixed requests, lost and wrong results must be 0"};
  app.add_option("--target", o.target, "server address HOST:PORT (not with --server_binary)");
  app.add_option("--server_pid", server_pid, "the server's pid, for its VmRSS");
  app.add_option("--server_binary", server_binary,
                 "start this hgemm_server (CPU backend, a free port on 127.0.0.1) and stop it with "
                 "SIGTERM at the end");
  app.add_option("--server_args", server_args, "extra flags for --server_binary, space-separated");
  app.add_option("--server_log", server_log, "where the started server's output goes")
      ->capture_default_str();
  app.add_option("--clients", o.clients, "concurrent clients")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--requests", o.requests, "requests in all (calls and streamed GEMMs)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max_dim", o.max_dim, "m, n, k are drawn from [1, max_dim]")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max_seconds", o.max_seconds,
                 "stop after this many seconds even if --requests are not reached (0: no limit)")
      ->capture_default_str();
  app.add_option("--weight_large", o.weight_large,
                 "weight of large unary GEMMs (log-uniform shapes up to --large_max_dim cubed; the "
                 "other scenarios weigh 100 together); 0: none")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--large_max_dim", o.large_max_dim, "largest m, n, k of the large GEMMs")
      ->check(CLI::Range(1, 16384))
      ->capture_default_str();
  app.add_option("--full_check_max_mnk", o.full_check_max_mnk,
                 "Cs of more multiply-adds are checked with Freivalds' test (2 random vectors)")
      ->capture_default_str();
  app.add_option("--stream_gemms", o.stream_gemms, "GEMMs per stream: drawn from [2, this]")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app.add_option("--short_deadline_max_ms", o.short_deadline_max_ms,
                 "short deadlines are uniform in [0.05, this] ms")
      ->capture_default_str();
  app.add_option("--cancel_after_max_ms", o.cancel_after_max_ms,
                 "cancellations come after a uniform [0, this] ms")
      ->capture_default_str();
  app.add_option("--call_timeout_s", o.call_timeout_s,
                 "deadline of every other call; a call that hits it counts as lost")
      ->capture_default_str();
  app.add_option("--tolerance", o.tolerance, "largest relative Frobenius error of a correct C")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of shapes, inputs and the mix")->capture_default_str();
  app.add_option("--idle_s", idle_s, "idle seconds after the run before the last RSS reading")
      ->capture_default_str();
  app.add_option("--startup_timeout_s", startup_timeout_s,
                 "how long the server may take to answer GetServerInfo")
      ->capture_default_str();
  app.add_option("--shutdown_timeout_s", shutdown_timeout_s,
                 "how long a started server may take to exit after SIGTERM")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (server_binary.empty() == o.target.empty()) {
    std::fprintf(stderr, "hgemm_soak: give --target or --server_binary (one of them)\n");
    return 2;
  }
  pid_t started = 0;
  if (!server_binary.empty()) {
    const int port = FreePort();
    started = StartServer(server_binary, port, server_args, server_log);
    server_pid = started;
    o.target = fmt::format("127.0.0.1:{}", port);
    std::printf("started %s (pid %d) on %s, log %s\n", server_binary.c_str(), started,
                o.target.c_str(), server_log.c_str());
  }
  if (o.client_id_prefix.empty()) o.client_id_prefix = fmt::format("soak-{}", getpid());

  hgemm::v1::ServerInfo info;
  if (grpc::Status s = ServerInfo(o.target, &info, startup_timeout_s, true); !s.ok()) {
    std::fprintf(stderr, "hgemm_soak: no server at %s: %s\n", o.target.c_str(),
                 s.error_message().c_str());
    if (started > 0) kill(started, SIGKILL);
    return 1;
  }
  const auto& l = info.limits();
  std::printf(
      "server %s, backend %s; limits: %llu queued GEMMs, %llu queued bytes, resident TTL %u s\n",
      info.version().c_str(), info.backend().c_str(), (unsigned long long)l.max_queued_requests(),
      (unsigned long long)l.max_queued_bytes(), l.resident_default_ttl_seconds());
  const ProcessMemory before = server_pid > 0 ? ReadProcessMemory(server_pid) : ProcessMemory{};
  std::printf(
      "soak: %d clients, %lld requests, shapes up to %ux%ux%u, short deadlines <= %.1f ms, "
      "cancel after <= %.1f ms\n",
      o.clients, (long long)o.requests, o.max_dim, o.max_dim, o.max_dim, o.short_deadline_max_ms,
      o.cancel_after_max_ms);
  std::fflush(stdout);

  const hgemm::bench::SoakResult result = hgemm::bench::RunSoak(o);
  const ProcessMemory end = server_pid > 0 ? ReadProcessMemory(server_pid) : ProcessMemory{};
  std::fputs(hgemm::bench::FormatSoakResult(result, o).c_str(), stdout);

  bool server_ok = true;
  if (server_pid > 0 && !Alive(server_pid)) {
    std::printf("SERVER DIED during the run (pid %d); see %s\n", server_pid, server_log.c_str());
    server_ok = false;
  }
  hgemm::v1::ServerInfo after;
  if (server_ok && ServerInfo(o.target, &after, 10, false).ok()) {
    std::printf("server load at the end: %s\n", Load(after).c_str());
  }
  std::printf("idle for %.0f s...\n", idle_s);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(int64_t(idle_s * 1000)));
  const ProcessMemory idle = server_pid > 0 ? ReadProcessMemory(server_pid) : ProcessMemory{};
  if (server_ok && ServerInfo(o.target, &after, 10, false).ok()) {
    std::printf("server load after idle: %s\n", Load(after).c_str());
    const auto& load = after.load();
    if (load.queued() != 0 || load.running() != 0 || load.admitted_bytes() != 0 ||
        load.admitted_total() != load.completed_total()) {
      std::printf("LEAK: work still admitted after the idle time\n");
      server_ok = false;
    }
    const ResidentCheck resident = CheckResident(o.target, o);
    std::printf(
        "resident matrices left by the soak's clients: %lld (%lld bytes; from uploads the "
        "client cancelled), released now; clients whose quota accounting is off: %lld\n",
        (long long)resident.matrices, (long long)resident.bytes,
        (long long)resident.mismatched_clients);
    if (!resident.ok || resident.mismatched_clients != 0) {
      std::printf(
          "LEAK: resident accounting does not add up (or ListMatrices/ReleaseMatrix failed)\n");
      server_ok = false;
    }
  } else if (server_ok) {
    std::printf("SERVER UNRESPONSIVE after the run: GetServerInfo failed\n");
    server_ok = false;
  }
  if (server_pid > 0) {
    std::printf("server memory: before %s; end %s; after %.0f s idle %s\n", Memory(before).c_str(),
                Memory(end).c_str(), idle_s, Memory(idle).c_str());
  }

  if (started > 0 && Alive(started)) {
    const auto stop = std::chrono::steady_clock::now();
    kill(started, SIGTERM);
    int status = 0;
    bool exited = false;
    while (std::chrono::steady_clock::now() - stop <
           std::chrono::duration<double>(shutdown_timeout_s)) {
      if (waitpid(started, &status, WNOHANG) == started) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - stop).count();
    if (!exited) {
      std::printf("SERVER DID NOT EXIT within %.0f s of SIGTERM; killed\n", shutdown_timeout_s);
      kill(started, SIGKILL);
      waitpid(started, &status, 0);
      server_ok = false;
    } else if (WIFEXITED(status)) {
      std::printf("server exited %d, %.2f s after SIGTERM\n", WEXITSTATUS(status), took);
      if (WEXITSTATUS(status) != 0) server_ok = false;
    } else {
      std::printf("server ended by signal %d, %.2f s after SIGTERM\n", WTERMSIG(status), took);
      server_ok = false;
    }
  }
  const bool ok = result.lost == 0 && result.wrong == 0 && server_ok;
  std::printf("soak %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
