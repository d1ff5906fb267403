#include "client/bulk_lane.h"

#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <thread>
#include <utility>

#include "proto/bulk_wire.h"

namespace hgemm {
namespace {

// A connected socket, closed when it goes.
class Connection {
 public:
  Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(Connection&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Connection() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

  grpc::Status Open(const BulkEndpoint& endpoint, std::chrono::milliseconds io_timeout) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(endpoint.port);
    if (int rc = getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return Unavailable(fmt::format("resolving {}: {}", endpoint.host, gai_strerror(rc)));
    }
    int error = 0;
    for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
      } else {
        error = errno;
        close(fd);
      }
    }
    freeaddrinfo(found);
    if (fd_ < 0) {
      return Unavailable(fmt::format("connecting to {}:{}: {}", endpoint.host, endpoint.port,
                                     std::strerror(error)));
    }
    timeval tv{io_timeout.count() / 1000, suseconds_t(io_timeout.count() % 1000 * 1000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return grpc::Status::OK;
  }

  static grpc::Status Unavailable(const std::string& what) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "bulk channel: " + what);
  }

 private:
  int fd_ = -1;
};

grpc::Status FromFrame(const bulk::Frame& frame) {
  if (frame.code == 0) return grpc::Status::OK;
  const auto code = frame.code <= grpc::StatusCode::UNAUTHENTICATED
                        ? grpc::StatusCode(frame.code)
                        : grpc::StatusCode::UNKNOWN;
  return grpc::Status(code, frame.message);
}

// Connects and presents the lane's capability; the server's answer to it. A server with all
// its bulk connections busy answers UNAVAILABLE (or, racing, resets the connection) before it
// claims the capability: that is tried again, with backoff, while the grant is young.
grpc::Status OpenLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane,
                      std::chrono::milliseconds io_timeout, Connection* c) {
  constexpr int kAttempts = 8;
  auto backoff = std::chrono::milliseconds(10);
  grpc::Status s;
  for (int attempt = 0; attempt < kAttempts; ++attempt, backoff *= 2) {
    if (attempt > 0) std::this_thread::sleep_for(backoff);
    *c = Connection();
    if (s = c->Open(endpoint, io_timeout); !s.ok()) return s;
    const std::string hello = bulk::Hello(lane.capability());
    bulk::Frame frame;
    if (!bulk::SendAll(c->fd(), hello.data(), hello.size()) ||
        !bulk::ReceiveFrame(c->fd(), &frame)) {
      s = Connection::Unavailable(
          fmt::format("the server closed the lane before it answered its hello ({})",
                      errno == 0 ? "end of stream" : std::strerror(errno)));
      continue;
    }
    if (s = FromFrame(frame); s.error_code() != grpc::StatusCode::UNAVAILABLE) return s;
  }
  return s;
}

}  // namespace

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

grpc::Status PutOverLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane,
                         const char* data, std::chrono::milliseconds io_timeout,
                         uint64_t* missing_bytes) {
  Connection c;
  if (grpc::Status s = OpenLane(endpoint, lane, io_timeout, &c); !s.ok()) return s;
  const bool sent = bulk::SendAll(c.fd(), data, lane.length());
  const int send_error = errno;
  // The server answers after the last byte landed, or at once when it stops the part (and
  // then reads what is still coming, so that its answer is not lost to a reset).
  bulk::Frame frame;
  if (!bulk::ReceiveFrame(c.fd(), &frame)) {
    const int why = sent ? errno : send_error;
    return Connection::Unavailable(
        fmt::format("the lane ended before the server answered ({})",
                    why == 0 ? "end of stream" : std::strerror(why)));
  }
  if (missing_bytes != nullptr) *missing_bytes = frame.value;
  return FromFrame(frame);
}

grpc::Status GetOverLane(const BulkEndpoint& endpoint, const v1::BulkLane& lane, char* into,
                         std::chrono::milliseconds io_timeout) {
  Connection c;
  if (grpc::Status s = OpenLane(endpoint, lane, io_timeout, &c); !s.ok()) return s;
  const size_t got = bulk::ReceiveAll(c.fd(), into, lane.length());
  if (got != lane.length()) {
    return Connection::Unavailable(fmt::format(
        "the lane ended after {} of its {} bytes ({})", got, lane.length(),
        errno == 0 ? "end of stream" : std::strerror(errno)));
  }
  return grpc::Status::OK;
}

}  // namespace hgemm
