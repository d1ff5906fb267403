#include "server/transport/unix_listener.h"

#include <grpcpp/server_posix.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace hgemm {
namespace {

std::string SystemError(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

}  // namespace

std::unique_ptr<UnixListener> UnixListener::Start(const std::string& path, int mode,
                                                  grpc::Server* server, UnixPeers* peers,
                                                  std::string* error) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    *error = "unix socket path '" + path + "' is empty or longer than " +
             std::to_string(sizeof(address.sun_path) - 1) + " bytes";
    return nullptr;
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = SystemError("socket for", path);
    return nullptr;
  }
  struct stat existing;
  if (lstat(path.c_str(), &existing) == 0 && S_ISSOCK(existing.st_mode)) unlink(path.c_str());
  const char* failed = nullptr;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    failed = "bind";
  } else if (mode >= 0 && chmod(path.c_str(), mode_t(mode)) != 0) {
    failed = "chmod (--unix_socket_mode)";
  } else if (listen(fd, SOMAXCONN) != 0) {
    failed = "listen";
  }
  const int wake = failed ? -1 : eventfd(0, EFD_CLOEXEC);
  if (!failed && wake < 0) failed = "eventfd for";
  if (failed) {
    *error = SystemError(failed, path);
    close(fd);
    return nullptr;
  }
  std::unique_ptr<UnixListener> listener(new UnixListener(path, fd, wake, server, peers));
  listener->thread_ = std::thread([l = listener.get()] { l->AcceptLoop(); });
  return listener;
}

UnixListener::UnixListener(std::string path, int socket_fd, int wake_fd, grpc::Server* server,
                           UnixPeers* peers)
    : path_(std::move(path)),
      socket_fd_(socket_fd),
      wake_fd_(wake_fd),
      server_(server),
      peers_(peers) {}

UnixListener::~UnixListener() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("cannot stop accepting on {}: {}", path_, std::strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
  close(socket_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void UnixListener::AcceptLoop() {
  pollfd fds[2] = {{.fd = socket_fd_, .events = POLLIN, .revents = 0},
                   {.fd = wake_fd_, .events = POLLIN, .revents = 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::critical("poll on {}: {}; no more connections accepted there", path_,
                       std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    // Non-blocking: gRPC's endpoints expect it.
    const int fd = accept4(socket_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        spdlog::warn("accept on {}: {}", path_, std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // e.g. out of descriptors
      }
      continue;
    }
    ucred credentials{};
    socklen_t size = sizeof(credentials);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
      spdlog::warn("SO_PEERCRED of a connection on {}: {}; refused", path_, std::strerror(errno));
      close(fd);
      continue;
    }
    peers_->Add(fd, {.uid = credentials.uid,
                     .gid = credentials.gid,
                     .pid = credentials.pid,
                     .process = ProcessHandle::OfPeer(fd, credentials.pid)});
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns fd now
  }
}

}  // namespace hgemm
