#include "server/auth/unix_peers.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <string>

namespace hgemm {
namespace {

constexpr std::string_view kFdPrefix = "fd:";

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5; older kernels answer ENOPROTOOPT
#endif

}  // namespace

std::shared_ptr<const ProcessHandle> ProcessHandle::OfPeer(int socket_fd, pid_t pid) {
  // SO_PEERPIDFD names the process that connected even if it has exited and its pid was
  // reused since; pidfd_open(pid) leaves that (tiny) window open between connect and accept.
  int fd = -1;
  socklen_t size = sizeof(fd);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERPIDFD, &fd, &size) == 0 && fd >= 0) {
    return std::shared_ptr<const ProcessHandle>(new ProcessHandle(fd, pid));
  }
  return Open(pid);
}

std::shared_ptr<const ProcessHandle> ProcessHandle::Open(pid_t pid) {
  const int fd = int(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return nullptr;
  return std::shared_ptr<const ProcessHandle>(new ProcessHandle(fd, pid));
}

ProcessHandle::~ProcessHandle() { close(fd_); }

bool ProcessHandle::Alive() const {
  // Signal 0 checks only that the process exists; EPERM (another uid's process) says it does.
  return syscall(SYS_pidfd_send_signal, fd_, 0, nullptr, 0) == 0 || errno == EPERM;
}

std::string UnixPeers::PeerName(int fd) { return std::string(kFdPrefix) + std::to_string(fd); }

void UnixPeers::Add(int fd, const PeerCredentials& credentials) {
  std::lock_guard<std::mutex> lock(mu_);
  by_fd_[fd] = credentials;
}

std::optional<PeerCredentials> UnixPeers::Find(std::string_view peer) const {
  if (peer.substr(0, kFdPrefix.size()) != kFdPrefix) return std::nullopt;
  const std::string_view digits = peer.substr(kFdPrefix.size());
  int fd = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), fd);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

}  // namespace hgemm
