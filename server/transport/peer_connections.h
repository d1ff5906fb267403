// OpenTcpConnections: how many TCP connections peers hold open to a local port, as the kernel
// lists them (/proc/self/net/tcp and tcp6: the process's network namespace).
// Used on shutdown to let clients read the last answers before the process closes its sockets.
// Thread safety: a plain function; it reads files only.
#ifndef HGEMM_SERVER_TRANSPORT_PEER_CONNECTIONS_H_
#define HGEMM_SERVER_TRANSPORT_PEER_CONNECTIONS_H_

namespace hgemm {

// Connections in state ESTABLISHED whose local port is `port` (IPv4 and IPv6): the accepted
// side of every connection to a listener on that port that the peer has not closed yet (once
// the peer closes, the kernel moves it to CLOSE_WAIT). 0 where /proc is not readable.
int OpenTcpConnections(int port);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_PEER_CONNECTIONS_H_
