// ListenTcp: a listening TCP socket for the server's own listeners that are not gRPC's (the
// metrics endpoint, the bulk channel).
// Thread safety: a pure function.
#ifndef HGEMM_SERVER_TRANSPORT_TCP_LISTEN_H_
#define HGEMM_SERVER_TRANSPORT_TCP_LISTEN_H_

#include <string>

namespace hgemm {

// Listens on `address` (HOST:PORT, [V6]:PORT, or :PORT for every interface; port 0 picks a
// free one) with close-on-exec and SO_REUSEADDR. Returns the socket and sets *port to the
// bound port; -1 and the reason in *error if it can't be bound.
int ListenTcp(const std::string& address, int backlog, int* port, std::string* error);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_TCP_LISTEN_H_
