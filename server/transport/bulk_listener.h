// BulkListener: the bulk channel's TCP listener (proto/hgemm.proto, "Bulk channel"). Each
// connection is one lane: its hello's capability is claimed from BulkGrants, which says whose
// bytes it moves, where and which way; a PUT lane is a part of an upload (a PartSession, as
// UploadPart's, with this connection as its transport), a GET lane reads its range of the
// matrix and sends it. The bytes go between the socket and the matrix with no framing: received
// into pooled host buffers and written by the upload queue (PUT), read by the backend into a
// pooled buffer and sent from it (GET).
//
// With TLS options each lane is TLS (OpenSSL, kTLS where the kernel has it) with the gRPC
// port's certificate, and under mTLS the client's certificate is checked as gRPC checks it.
//
// Every connection has a thread of its own (bulk transfers are few and long); at most
// max_connections are served at once, more are closed at once. A connection that sends no
// hello within hello_timeout, or stalls for idle_timeout, is closed: nobody holds a lane by
// connecting and waiting.
// Thread safety: Start and the destructor are called by one owner; port() is thread-safe.
#ifndef HGEMM_SERVER_TRANSPORT_BULK_LISTENER_H_
#define HGEMM_SERVER_TRANSPORT_BULK_LISTENER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "proto/bulk_wire.h"
#include "server/metrics/metrics.h"
#include "server/session/bulk_grants.h"
#include "server/session/gemm_core.h"

namespace hgemm {

struct BulkListenerOptions {
  std::string address;  // HOST:PORT (port 0: a free one)
  // TLS on every lane when cert_path is set (the gRPC port's files: PEM certificate chain and
  // key, and the CAs of client certificates for mTLS), read anew for each connection so that
  // a rotated certificate serves the next lane.
  struct Tls {
    std::string cert_path, key_path, client_ca_path;
    bool require_client_certificate = false;
  } tls;
  int max_connections = 64;
  std::chrono::milliseconds hello_timeout{10000};
  std::chrono::milliseconds idle_timeout{60000};
  int64_t chunk_bytes = int64_t{4} << 20;  // what one receive or send moves at most
};

class BulkListener {
 public:
  // Listens on options.address; nullptr and the reason in *error if it can't be bound.
  // Counts the bytes each lane moved in `metrics` (null: none kept) as DataPath::kBulk.
  // REQUIRES: `core`, `grants` and `metrics` outlive the listener.
  static std::unique_ptr<BulkListener> Start(BulkListenerOptions options, GemmCoreInterface* core,
                                             BulkGrants* grants, ServiceMetrics* metrics,
                                             std::string* error);
  // Stops accepting, cuts the lanes in progress (a PUT lane's part then counts nothing) and
  // waits for their threads.
  ~BulkListener();
  BulkListener(const BulkListener&) = delete;
  BulkListener& operator=(const BulkListener&) = delete;

  int port() const { return port_; }

 private:
  BulkListener(BulkListenerOptions options, GemmCoreInterface* core, BulkGrants* grants,
               ServiceMetrics* metrics, int fd, int port);
  void AcceptLoop();
  // Serves one connection, lane after lane, then closes it.
  void Serve(int fd);
  // The hello, the claim of its capability, then the lane's transfer; whether it ended whole,
  // so that the connection may carry another lane. `first`: the connection's first lane (after
  // it, an end of stream or silence before a hello closes the connection without a word).
  bool ServeLane(bulk::Connection& lane, bool first);
  // The end of a kept connection's wait for its next hello: false if it was evicted meanwhile
  // (AcceptLoop shut it down to make room), and then nothing it received may be claimed.
  bool Resume(int fd);
  // A GET or PUT lane's transfer; whether it ended whole.
  bool ServeGet(bulk::Connection& lane, const BulkTicket& ticket);
  bool ServePut(bulk::Connection& lane, const BulkTicket& ticket);

  const BulkListenerOptions options_;
  GemmCoreInterface* const core_;
  BulkGrants* const grants_;
  ServiceMetrics* const metrics_;
  const int listen_fd_;
  const int port_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable lane_ended_;
  std::set<int> lanes_;    // guarded by mu_; the connections being served
  std::set<int> idle_;     // guarded by mu_; of those, kept ones waiting for their next hello
  std::set<int> evicted_;  // guarded by mu_; idle ones shut down to make room, not yet resumed
  std::thread acceptor_;   // last: starts once the rest is set
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_BULK_LISTENER_H_
