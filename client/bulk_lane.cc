#include "client/bulk_lane.h"

#include <fmt/format.h>
#include <netdb.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <thread>

#include "proto/bulk_wire.h"

namespace hgemm {
namespace {

grpc::Status Unavailable(const std::string& what) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "bulk channel: " + what);
}

std::string ErrnoText() { return errno == 0 ? "end of stream" : std::strerror(errno); }

void SetIoTimeout(int fd, std::chrono::milliseconds io_timeout) {
  timeval tv{io_timeout.count() / 1000, suseconds_t(io_timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// A TCP connection to `endpoint`, with `io_timeout` on each send and receive.
grpc::Status Connect(const BulkEndpoint& endpoint, std::chrono::milliseconds io_timeout,
                     bulk::Connection* connection) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (int rc = getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Unavailable(fmt::format("resolving {}: {}", endpoint.host, gai_strerror(rc)));
  }
  int fd = -1, error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = errno;
      close(std::exchange(fd, -1));
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return Unavailable(
        fmt::format("connecting to {}:{}: {}", endpoint.host, endpoint.port, std::strerror(error)));
  }
  SetIoTimeout(fd, io_timeout);
  *connection = bulk::Connection(fd);
  return grpc::Status::OK;
}

grpc::Status FromFrame(const bulk::Frame& frame) {
  if (frame.code == 0) return grpc::Status::OK;
  const auto code = frame.code <= grpc::StatusCode::UNAUTHENTICATED ? grpc::StatusCode(frame.code)
                                                                    : grpc::StatusCode::UNKNOWN;
  return grpc::Status(code, frame.message);
}

// Connects (with TLS where the endpoint has it) and presents the lane's capability; the
// server's answer to it. A server with all its bulk connections busy answers UNAVAILABLE (or,
// racing, resets the connection; under TLS it closes it) before it claims the capability:
// that is tried again, with backoff, while the grant is young.
grpc::Status OpenLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane,
                      std::chrono::milliseconds io_timeout, bulk::Connection* c) {
  const std::string hello = bulk::Hello(lane.capability());
  // A kept connection first. The server reads nothing of a connection it closes between
  // lanes, so a hello that gets no answer there was never claimed: the next connection
  // presents it again.
  while (endpoint.pool != nullptr && endpoint.pool->Take(endpoint, c)) {
    SetIoTimeout(c->fd(), io_timeout);
    bulk::Frame frame;
    if (c->SendAll(hello.data(), hello.size()) && c->ReceiveFrame(&frame)) return FromFrame(frame);
  }
  constexpr int kAttempts = 8;
  auto backoff = std::chrono::milliseconds(10);
  grpc::Status s;
  for (int attempt = 0; attempt < kAttempts; ++attempt, backoff *= 2) {
    if (attempt > 0) std::this_thread::sleep_for(backoff);
    if (s = Connect(endpoint, io_timeout, c); !s.ok()) return s;
    if (endpoint.tls) {
      const std::string error = c->HandshakeAsClient(
          endpoint.tls.get(), endpoint.server_name.empty() ? endpoint.host : endpoint.server_name);
      if (!error.empty()) {
        // A refused certificate will not change: only a closed connection is tried again.
        s = Unavailable(error);
        if (error.find("certificate") != std::string::npos) return s;
        continue;
      }
    }
    bulk::Frame frame;
    if (!c->SendAll(hello.data(), hello.size()) || !c->ReceiveFrame(&frame)) {
      s = Unavailable(
          fmt::format("the server closed the lane before it answered its hello ({})", ErrnoText()));
      continue;
    }
    if (s = FromFrame(frame); s.error_code() != grpc::StatusCode::UNAVAILABLE) return s;
  }
  return s;
}

}  // namespace

std::shared_ptr<SSL_CTX> NewBulkTlsContext(const BulkTls& tls, std::string* error) {
  std::shared_ptr<SSL_CTX> context(SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
  SSL_CTX* c = context.get();
  if (c == nullptr || SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION) != 1) {
    *error = "bulk channel: no TLS client context";
    return nullptr;
  }
  SSL_CTX_set_options(c, SSL_OP_ENABLE_KTLS);
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  const bool roots = tls.ca_path.empty()
                         ? SSL_CTX_set_default_verify_paths(c) == 1
                         : SSL_CTX_load_verify_locations(c, tls.ca_path.c_str(), nullptr) == 1;
  if (!roots) {
    *error = "bulk channel: cannot load the CAs " +
             (tls.ca_path.empty() ? "of the system" : tls.ca_path);
    ERR_clear_error();
    return nullptr;
  }
  if (!tls.cert_path.empty() &&
      (SSL_CTX_use_certificate_chain_file(c, tls.cert_path.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(c, tls.key_path.c_str(), SSL_FILETYPE_PEM) != 1)) {
    *error = fmt::format("bulk channel: cannot load the client certificate {} and key {}",
                         tls.cert_path, tls.key_path);
    ERR_clear_error();
    return nullptr;
  }
  return context;
}

std::string BulkHostOf(const std::string& target) {
  std::string_view t = target;
  for (std::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (t.substr(0, scheme.size()) == scheme) {
      t.remove_prefix(scheme.size());
      break;
    }
  }
  if (target.rfind("unix:", 0) == 0) return "";
  t = t.substr(0, t.find(','));
  if (!t.empty() && t.front() == '[') {
    const size_t close = t.find(']');
    return close == std::string_view::npos ? "" : std::string(t.substr(1, close - 1));
  }
  return std::string(t.substr(0, t.rfind(':')));
}

grpc::Status PutOverLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane, const char* data,
                         std::chrono::milliseconds io_timeout, uint64_t* missing_bytes) {
  bulk::Connection c;
  if (grpc::Status s = OpenLane(endpoint, lane, io_timeout, &c); !s.ok()) return s;
  const bool sent = c.SendAll(data, lane.length());
  const int send_error = errno;
  // The server answers after the last byte landed, or at once when it stops the part (and
  // then reads what is still coming, so that its answer is not lost to a reset).
  bulk::Frame frame;
  if (!c.ReceiveFrame(&frame)) {
    if (!sent) errno = send_error;
    return Unavailable(fmt::format("the lane ended before the server answered ({})", ErrnoText()));
  }
  if (missing_bytes != nullptr) *missing_bytes = frame.value;
  const grpc::Status s = FromFrame(frame);
  if (s.ok() && sent && endpoint.pool != nullptr) endpoint.pool->Give(endpoint, std::move(c));
  return s;
}

grpc::Status GetOverLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane, char* into,
                         std::chrono::milliseconds io_timeout) {
  bulk::Connection c;
  if (grpc::Status s = OpenLane(endpoint, lane, io_timeout, &c); !s.ok()) return s;
  const size_t got = c.ReceiveAll(into, lane.length());
  if (got != lane.length()) {
    return Unavailable(fmt::format("the lane ended after {} of its {} bytes ({})", got,
                                   lane.length(), ErrnoText()));
  }
  if (endpoint.pool != nullptr) endpoint.pool->Give(endpoint, std::move(c));
  return grpc::Status::OK;
}

std::string BulkLanePool::Key(const BulkEndpoint& endpoint) {
  return fmt::format("{}|{}|{}|{}", endpoint.host, endpoint.port,
                     static_cast<const void*>(endpoint.tls.get()), endpoint.server_name);
}

bool BulkLanePool::Take(const BulkEndpoint& endpoint, bulk::Connection* connection) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(Key(endpoint));
  while (it != idle_.end() && !it->second.empty()) {
    bulk::Connection kept = std::move(it->second.back());
    it->second.pop_back();
    // Between lanes the server sends nothing: a readable socket is one it closed.
    pollfd p{kept.fd(), POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) == 0) {
      *connection = std::move(kept);
      return true;
    }
  }
  return false;
}

void BulkLanePool::Give(const BulkEndpoint& endpoint, bulk::Connection connection) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bulk::Connection>& idle = idle_[Key(endpoint)];
  if (idle.size() < capacity_) idle.push_back(std::move(connection));
}

}  // namespace hgemm
