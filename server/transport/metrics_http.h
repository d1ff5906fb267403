// MetricsHttpServer: a minimal HTTP/1.x server answering GET (and HEAD) /metrics with the
// Prometheus text format (0.0.4) of one prometheus::Collectable, serialised by prometheus-cpp's
// TextSerializer. Anything else gets 404, 405 or 400; every connection is closed after one
// answer (Prometheus scrapes that way just as well).
//
// Why not prometheus::Exposer (prometheus-cpp-pull, over Debian's civetweb): Debian's civetweb
// starts its threads with a fixed stack (USE_STACK_SIZE, about 100 KiB) from which glibc takes
// the static TLS of every loaded library. hgemm_server loads cuBLASLt (94 KiB of TLS), OpenBLAS
// (60 KiB) and cuBLAS (12 KiB): pthread_create fails with EINVAL and the exposer does not start.
// In a binary without the CUDA libraries it starts, but a request for any other path overflows
// the little stack that is left while civetweb formats its 404 page, and the process dies.
//
// Thread safety: one thread of its own serves the connections one at a time; each read and
// write has a timeout (a stalled client delays the next scrape by seconds, never forever).
// The Collectable is called on that thread and must be thread-safe.
#ifndef HGEMM_SERVER_TRANSPORT_METRICS_HTTP_H_
#define HGEMM_SERVER_TRANSPORT_METRICS_HTTP_H_

#include <prometheus/collectable.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace hgemm {

class MetricsHttpServer {
 public:
  // Listens on `address` (HOST:PORT, [V6]:PORT or :PORT for every interface; port 0 picks a
  // free one) and serves `source`. nullptr, and the reason in *error, if it can't be bound.
  static std::unique_ptr<MetricsHttpServer> Start(const std::string& address,
                                                  std::shared_ptr<prometheus::Collectable> source,
                                                  std::string* error);
  ~MetricsHttpServer();  // stops listening and joins the thread (after the answer in progress)
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

  // The response to one request (its raw bytes up to the blank line), status line to body.
  // Public for tests.
  static std::string Respond(const std::string& request, const prometheus::Collectable& source);

 private:
  MetricsHttpServer(int fd, int port, std::shared_ptr<prometheus::Collectable> source);
  void Serve();
  void Answer(int connection);

  const int fd_;
  const int port_;
  const std::shared_ptr<prometheus::Collectable> source_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_METRICS_HTTP_H_
