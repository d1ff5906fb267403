#include "server/transport/peer_connections.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace hgemm {
namespace {

// A listening socket on 127.0.0.1 (or [::1]) with a free port, closed on destruction.
class Listener {
 public:
  explicit Listener(int family) : family_(family), fd_(socket(family, SOCK_STREAM, 0)) {
    sockaddr_storage address = Loopback(0);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(fd_, 4) != 0)
      return;
    socklen_t length = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&address)->sin_port
                                    : reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  }
  ~Listener() { close(fd_); }

  int port() const { return port_; }  // 0: could not listen
  int Connect() const {
    const int fd = socket(family_, SOCK_STREAM, 0);
    sockaddr_storage address = Loopback(port_);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  }
  int Accept() const { return accept(fd_, nullptr, nullptr); }

 private:
  sockaddr_storage Loopback(int port) const {
    sockaddr_storage address{};
    if (family_ == AF_INET) {
      auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
      v4->sin_family = AF_INET;
      v4->sin_port = htons(port);
      v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else {
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(port);
      v6->sin6_addr = in6addr_loopback;
    }
    return address;
  }

  const int family_;
  const int fd_;
  int port_ = 0;
};

// OpenTcpConnections(port) once it equals `expected`, or after 5 s: a FIN on loopback is
// normally handled before close() returns, but the kernel may defer it.
int SettlesTo(int port, int expected) {
  int count = OpenTcpConnections(port);
  for (int i = 0; i < 500 && count != expected; ++i) {
    usleep(10'000);
    count = OpenTcpConnections(port);
  }
  return count;
}

void CountsTheAcceptedSideUntilThePeerCloses(int family) {
  Listener listener(family);
  if (listener.port() == 0) GTEST_SKIP() << "no loopback for family " << family;
  EXPECT_EQ(OpenTcpConnections(listener.port()), 0);
  const int first = listener.Connect(), second = listener.Connect();
  const int accepted_first = listener.Accept(), accepted_second = listener.Accept();
  ASSERT_GE(accepted_first, 0);
  ASSERT_GE(accepted_second, 0);
  // Only the accepted sides have the listener's port as their local port.
  EXPECT_EQ(OpenTcpConnections(listener.port()), 2);
  close(first);  // the accepted side goes to CLOSE_WAIT
  EXPECT_EQ(SettlesTo(listener.port(), 1), 1);
  close(second);
  EXPECT_EQ(SettlesTo(listener.port(), 0), 0);
  close(accepted_first);
  close(accepted_second);
}

TEST(OpenTcpConnections, Ipv4) { CountsTheAcceptedSideUntilThePeerCloses(AF_INET); }
TEST(OpenTcpConnections, Ipv6) { CountsTheAcceptedSideUntilThePeerCloses(AF_INET6); }

}  // namespace
}  // namespace hgemm
