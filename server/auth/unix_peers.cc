#include "server/auth/unix_peers.h"

#include <charconv>
#include <string>

namespace hgemm {
namespace {

constexpr std::string_view kFdPrefix = "fd:";

}  // namespace

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
