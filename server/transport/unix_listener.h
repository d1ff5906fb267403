// UnixListener: a Unix-domain socket whose connections the server accepts itself, instead of
// gRPC, so that each one's peer credentials are known (SO_PEERCRED: uid, gid, pid). It records
// them in UnixPeers and hands the connection to the gRPC server (grpc::AddInsecureChannelFromFd),
// whose calls on it then have the peer name "fd:N" (see server/auth/unix_peers.h).
// Plaintext only: gRPC takes accepted connections with insecure credentials.
// Thread safety: one thread accepts; Start and the destructor are called by one owner.
#ifndef HGEMM_SERVER_TRANSPORT_UNIX_LISTENER_H_
#define HGEMM_SERVER_TRANSPORT_UNIX_LISTENER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <thread>

#include "server/auth/unix_peers.h"

namespace hgemm {

class UnixListener {
 public:
  // Binds `path` (a stale socket file there is replaced), gives it file mode `mode` (< 0: as
  // the umask leaves it), listens and starts accepting for `server`. nullptr with *error
  // (naming the path and the system call) if it cannot. REQUIRES: `server` started, and it
  // and `peers` outlive the listener.
  static std::unique_ptr<UnixListener> Start(const std::string& path, int mode,
                                             grpc::Server* server, UnixPeers* peers,
                                             std::string* error);
  // Stops accepting, closes the socket and removes its file; connections already handed to
  // gRPC stay with it.
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

 private:
  UnixListener(std::string path, int socket_fd, int wake_fd, grpc::Server* server,
               UnixPeers* peers);
  void AcceptLoop();

  const std::string path_;
  const int socket_fd_;
  const int wake_fd_;  // an eventfd: written once to stop AcceptLoop
  grpc::Server* const server_;
  UnixPeers* const peers_;
  std::thread thread_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_UNIX_LISTENER_H_
