// EchoServer: a running hgemm.bench.EchoService (bench/echo.proto), the transport baseline of
// hgemm_load. It receives bytes and sends back the requested number of bytes, computing nothing,
// with the same message limits as HgemmServer; hgemm_load starts one in-process or talks to
// the `echo_server` binary (echo_server_main.cc).
// Thread safety: Shutdown() may be called from any thread; the destructor calls it.
#ifndef HGEMM_BENCH_ECHO_SERVICE_H_
#define HGEMM_BENCH_ECHO_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace hgemm::bench {

struct EchoServerOptions {
  // HOST:PORT; port 0 picks a free one (see EchoServer::port()).
  std::string listen_address = "127.0.0.1:0";
  // Largest gRPC message accepted or sent; the same default as ServerOptions.
  int64_t max_message_bytes = int64_t{1} << 30;
  // Largest reply a call may ask for; larger → INVALID_ARGUMENT naming reply_bytes.
  int64_t max_reply_bytes = int64_t{4} << 30;
  // Every reply goes out this long after its call's last byte came in (0: at once), from another
  // thread: a stand-in for the GEMM, to see what idle time costs the transport.
  std::chrono::microseconds reply_delay{0};
};

class EchoServer {
 public:
  // Starts serving. Returns nullptr (and logs why) if the address can't be bound.
  static std::unique_ptr<EchoServer> Start(const EchoServerOptions& options);
  ~EchoServer();
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  int port() const { return port_; }

  // Stops accepting calls and cancels the ones in flight after 2 s. Idempotent.
  void Shutdown();

 private:
  EchoServer() = default;

  class Service;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::once_flag shutdown_once_;
};

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_ECHO_SERVICE_H_
