#include "server/transport/metrics_http.h"

#include <poll.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

#include "server/transport/tcp_listen.h"

namespace hgemm {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kPollMs = 100;  // how often the thread looks at stopping_
constexpr int kIoTimeoutSeconds = 2;

std::string Reply(const char* status, const char* content_type, const std::string& body,
                  bool head) {
  std::string out = std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
                    "\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n\r\n";
  if (!head) out += body;
  return out;
}

}  // namespace

std::unique_ptr<MetricsHttpServer> MetricsHttpServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Collectable> source,
    std::string* error) {
  int port = 0;
  const int fd = ListenTcp(address, 64, &port, error);
  if (fd < 0) return nullptr;
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(fd, port, std::move(source)));
}

MetricsHttpServer::MetricsHttpServer(int fd, int port,
                                     std::shared_ptr<prometheus::Collectable> source)
    : fd_(fd), port_(port), source_(std::move(source)), thread_([this] { Serve(); }) {}

MetricsHttpServer::~MetricsHttpServer() {
  stopping_ = true;
  thread_.join();
  close(fd_);
}

void MetricsHttpServer::Serve() {
  while (!stopping_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMs) <= 0) continue;
    const int connection = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    close(connection);
  }
}

void MetricsHttpServer::Answer(int connection) {
  timeval timeout{kIoTimeoutSeconds, 0};
  setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const ssize_t n = recv(connection, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    request.append(buffer, n);
  }
  std::string response;
  try {
    response = Respond(request, *source_);
  } catch (const std::exception& e) {
    spdlog::error("metrics: {}", e.what());
    response = Reply("500 Internal Server Error", "text/plain", "metrics failed\n", false);
  }
  for (size_t sent = 0; sent < response.size();) {
    const ssize_t n =
        send(connection, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
}

std::string MetricsHttpServer::Respond(const std::string& request,
                                       const prometheus::Collectable& source) {
  const size_t line_end = request.find("\r\n");
  std::istringstream line(request.substr(0, line_end));
  std::string method, target, version, extra;
  line >> method >> target >> version;
  if (line_end == std::string::npos || method.empty() || target.empty() ||
      version.rfind("HTTP/1.", 0) != 0 || (line >> extra)) {
    return Reply("400 Bad Request", "text/plain", "bad request\n", false);
  }
  const bool head = method == "HEAD";
  const std::string path = target.substr(0, target.find('?'));
  if (path != "/metrics") return Reply("404 Not Found", "text/plain", "see /metrics\n", head);
  if (method != "GET" && !head) {
    return Reply("405 Method Not Allowed", "text/plain", "GET /metrics\n", false);
  }
  const std::string body = prometheus::TextSerializer().Serialize(source.Collect());
  return Reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", body, head);
}

}  // namespace hgemm
