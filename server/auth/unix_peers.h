// UnixPeers: the kernel's word (SO_PEERCRED) on who is at the other end of each connection to
// the server's own Unix-socket listeners (server/transport/unix_listener.h), by the peer name
// gRPC gives the calls on it: "fd:N", N the connection's file descriptor.
//
// Why this table: gRPC 1.51 exposes no socket or credentials of a call, and names every Unix
// peer "unix:". Connections the server accepts itself and hands to gRPC (AddInsecureChannelFromFd)
// are named by their descriptor, which is unique among open connections; a descriptor number
// reused by a later connection is overwritten by that connection's credentials when it is
// accepted, before any call can arrive on it.
// Thread safety: thread-safe.
#ifndef HGEMM_SERVER_AUTH_UNIX_PEERS_H_
#define HGEMM_SERVER_AUTH_UNIX_PEERS_H_

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace hgemm {

// A pidfd: a reference to one process that, unlike its pid, can never name another process
// once that one has exited. Closed on destruction. Thread safety: immutable.
class ProcessHandle {
 public:
  // The process at the other end of the connected Unix socket `socket_fd` (SO_PEERPIDFD where
  // the kernel has it, else pidfd_open of its SO_PEERCRED `pid`); null if the kernel offers
  // neither or the process is gone.
  static std::shared_ptr<const ProcessHandle> OfPeer(int socket_fd, pid_t pid);
  // Of process `pid` (pidfd_open); null if there is none. For tests and the fallback above.
  static std::shared_ptr<const ProcessHandle> Open(pid_t pid);
  ~ProcessHandle();
  ProcessHandle(const ProcessHandle&) = delete;
  ProcessHandle& operator=(const ProcessHandle&) = delete;

  pid_t pid() const { return pid_; }
  // False once the process has exited (then its pid may already name another process).
  bool Alive() const;

 private:
  ProcessHandle(int fd, pid_t pid) : fd_(fd), pid_(pid) {}
  const int fd_;
  const pid_t pid_;
};

struct PeerCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;  // when it connected
  // The process `pid` named when it connected (null: the kernel has no pidfds).
  std::shared_ptr<const ProcessHandle> process;
};

class UnixPeers {
 public:
  // The peer name gRPC gives calls on connection `fd` ("fd:N").
  static std::string PeerName(int fd);

  // Records the credentials of the connection on `fd` (replacing those of an earlier one).
  void Add(int fd, const PeerCredentials& credentials);
  // The credentials of the connection a call with `peer` (ServerContext::peer()) came over;
  // nullopt for peers that are not such connections.
  std::optional<PeerCredentials> Find(std::string_view peer) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<int, PeerCredentials> by_fd_;  // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_AUTH_UNIX_PEERS_H_
