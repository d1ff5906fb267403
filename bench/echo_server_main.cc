// echo_server: the transport baseline of hgemm_load as its own process (bench/echo.proto), so
// that it runs beside the load generator the way hgemm_server does.
//   echo_server --listen=127.0.0.1:50061
//   hgemm_load --server=127.0.0.1:50051 --baseline --echo_server=127.0.0.1:50061
#include <signal.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "bench/echo_service.h"

int main(int argc, char** argv) {
  hgemm::bench::EchoServerOptions options;
  options.listen_address = "127.0.0.1:50061";
  CLI::App app{"echo_server: plain gRPC byte echo (hgemm.bench.EchoService)"};
  app.add_option("--listen", options.listen_address, "HOST:PORT to serve on")
      ->capture_default_str();
  app.add_option("--max_message_bytes", options.max_message_bytes, "largest gRPC message accepted")
      ->check(CLI::Range(int64_t{4} << 20, int64_t{INT32_MAX}))
      ->capture_default_str();
  int64_t reply_delay_us = 0;
  app.add_option("--reply_delay_us", reply_delay_us,
                 "send every reply this long after the call arrived, from another thread "
                 "(a stand-in for a GEMM of that length)")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  options.reply_delay = std::chrono::microseconds(reply_delay_us);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<hgemm::bench::EchoServer> server = hgemm::bench::EchoServer::Start(options);
  if (!server) return 1;
  spdlog::info("echo_server listening on {} (port {})", options.listen_address, server->port());
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received {}; shutting down", strsignal(signal_number));
  server->Shutdown();
  return 0;
}
