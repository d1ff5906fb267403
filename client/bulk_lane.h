// One lane of the bulk channel (proto/hgemm.proto, "Bulk channel") on the client side: a TCP
// connection (TLS over it when the client's gRPC channel has TLS) to the grant's host and port
// that presents the lane's capability, then sends (PUT) or receives (GET) exactly the lane's
// bytes, straight from or into the caller's memory. GemmClient::BulkPut and BulkGet run one
// per lane, on threads of their own. A connection whose lane ended whole goes back to the
// endpoint's BulkLanePool, and the next lane to that endpoint starts on it: no connect, TLS
// handshake or server thread per lane.
// Thread safety: functions without shared state but the pool (thread-safe); `data`/`into`
// belong to the caller; an endpoint's TLS context may be shared by lanes on several threads
// (OpenSSL's is).
#ifndef HGEMM_CLIENT_BULK_LANE_H_
#define HGEMM_CLIENT_BULK_LANE_H_

#include <grpcpp/support/status.h>
#include <openssl/ssl.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proto/bulk_wire.h"
#include "proto/hgemm.pb.h"

namespace hgemm {

// TLS for the lanes, as the client's gRPC channel has it (ConnectOptions' fields).
struct BulkTls {
  std::string ca_path;    // PEM CAs the server's certificate is checked against; "": system's
  std::string cert_path;  // the client's certificate and key (PEM), for mutual TLS
  std::string key_path;
};

// A client TLS context for `tls`; null and *error (naming the file) when it cannot be made.
std::shared_ptr<SSL_CTX> NewBulkTlsContext(const BulkTls& tls, std::string* error);

class BulkLanePool;

// Where the lanes of a grant connect, and how.
struct BulkEndpoint {
  std::string host;  // a name or address, IPv6 without brackets
  uint32_t port = 0;
  std::shared_ptr<SSL_CTX> tls;        // null: plaintext
  std::string server_name;             // what the server's certificate must name; "": `host`
  std::shared_ptr<BulkLanePool> pool;  // kept connections; null: a new one per lane
};

// Connections kept after a lane that ended whole, by endpoint (host, port, TLS context), at
// most `capacity` idle ones per endpoint. A kept connection the server has closed meanwhile
// (its hello timeout between lanes, a restart) is dropped when taken.
class BulkLanePool {
 public:
  explicit BulkLanePool(size_t capacity = 16) : capacity_(capacity) {}
  // An idle connection to `endpoint` that still looks open; false if there is none.
  bool Take(const BulkEndpoint& endpoint, bulk::Connection* connection);
  // Keeps `connection` (its lane ended whole) unless `endpoint` has `capacity` idle already.
  void Give(const BulkEndpoint& endpoint, bulk::Connection connection);

 private:
  static std::string Key(const BulkEndpoint& endpoint);

  const size_t capacity_;
  std::mutex mu_;
  std::map<std::string, std::vector<bulk::Connection>> idle_;  // guarded by mu_
};

// The host to reach the bulk channel at for a gRPC target ("H:P", "[V6]:P", "ipv4:H:P,...",
// "dns:///H:P"): its first address's host. "" for a target with no TCP host (unix:).
std::string BulkHostOf(const std::string& target);

// Sends `lane.length()` bytes from `data` (the lane's first byte) over a kept or new connection,
// each send and receive waiting at most `io_timeout`. OK once the server has them all in the
// matrix; *missing_bytes: the upload's bytes still missing then. The server's refusal as its
// status; UNAVAILABLE when the connection (or its TLS handshake) fails or ends early.
grpc::Status PutOverLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane, const char* data,
                         std::chrono::milliseconds io_timeout, uint64_t* missing_bytes);

// Receives `lane.length()` bytes into `into` (room for them) as PutOverLane sends.
grpc::Status GetOverLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane, char* into,
                         std::chrono::milliseconds io_timeout);

}  // namespace hgemm

#endif  // HGEMM_CLIENT_BULK_LANE_H_
