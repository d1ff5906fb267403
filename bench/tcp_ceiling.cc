// tcp_ceiling: the raw-TCP ceiling of a GEMM's bytes over N sockets, next to which
// hgemm_load / hgemm_client's wire GB/s are read. In one process on 127.0.0.1: each of N
// connections sends its share of A + B (2·(m·k + k·n) bytes) and gets its share of C (2·m·n)
// back; one exchange is timed from the first byte sent to the last byte received. cpu_ms: the
// CPU time (user + system, both ends, since both are this process) of the median exchange, to
// hold a transport's client + server CPU per GEMM against.
//   tcp_ceiling --shape=2048x2048x2048 --sockets=1,2,4,8 --repeat=5
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_dims.h"

namespace {

double CpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

void Check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(errno)));
}

void SendAll(int fd, const char* data, uint64_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::send(fd, data, std::min<uint64_t>(bytes, 1 << 22), MSG_NOSIGNAL);
    Check(n > 0, "send");
    data += n;
    bytes -= n;
  }
}

void ReceiveAll(int fd, char* data, uint64_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, data, std::min<uint64_t>(bytes, 1 << 22), 0);
    Check(n > 0, "recv");
    data += n;
    bytes -= n;
  }
}

// Share `i` of `parts` of `bytes`.
uint64_t Share(uint64_t bytes, int parts, int i) {
  return bytes / parts + (uint64_t(i) < bytes % parts ? 1 : 0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "2048x2048x2048", sockets_list = "1,2,4,8";
  int repeat = 5;
  CLI::App app{"tcp_ceiling: a GEMM's bytes over N plain TCP connections on 127.0.0.1"};
  app.add_option("--shape", shape, "MxNxK: A and B go up, C comes back (fp16)")
      ->capture_default_str();
  app.add_option("--sockets", sockets_list, "sweep of connections")->capture_default_str();
  app.add_option("--repeat", repeat, "exchanges per point (the median is reported)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  hgemm::GemmDims dims;
  if (std::string e = hgemm::ParseGemmDims(shape, &dims); !e.empty()) {
    std::fprintf(stderr, "tcp_ceiling: --shape: %s\n", e.c_str());
    return 2;
  }
  const uint64_t up = uint64_t(dims.ABytes() + dims.BBytes()), down = uint64_t(dims.CBytes());
  std::vector<int> counts;
  for (size_t at = 0; at < sockets_list.size();) {
    const size_t comma = std::min(sockets_list.find(',', at), sockets_list.size());
    counts.push_back(std::stoi(sockets_list.substr(at, comma - at)));
    at = comma + 1;
  }
  std::vector<char> send_buffer(std::max(up, down), 'x');
  std::vector<char> received_up(up), received_down(down);  // the server's A + B, the client's C
  std::printf("%-16s %7s %10s %10s %10s %10s\n", "shape", "sockets", "MiB", "p50_ms", "GB/s",
              "cpu_ms");
  for (int n : counts) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    Check(listener >= 0, "socket");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    Check(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0, "bind");
    Check(::listen(listener, n) == 0, "listen");
    Check(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0,
          "getsockname");
    std::vector<int> clients(n), servers(n);
    for (int i = 0; i < n; ++i) {
      clients[i] = ::socket(AF_INET, SOCK_STREAM, 0);
      Check(::connect(clients[i], reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0,
            "connect");
      servers[i] = ::accept(listener, nullptr, nullptr);
      Check(servers[i] >= 0, "accept");
      const int one = 1;
      ::setsockopt(clients[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ::setsockopt(servers[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    std::vector<std::pair<double, double>> exchanges;  // (ms, CPU ms)
    for (int r = 0; r < repeat; ++r) {
      const double cpu_start = CpuMs();
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> threads;
      uint64_t up_at = 0, down_at = 0;
      for (int i = 0; i < n; ++i) {
        const uint64_t up_share = Share(up, n, i), down_share = Share(down, n, i);
        // The server side: receive the share of A and B, send the share of C.
        threads.emplace_back([&, i, up_at, down_at, up_share, down_share] {
          ReceiveAll(servers[i], received_up.data() + up_at, up_share);
          SendAll(servers[i], send_buffer.data() + down_at, down_share);
        });
        // The client side: send, then receive.
        threads.emplace_back([&, i, up_at, down_at, up_share, down_share] {
          SendAll(clients[i], send_buffer.data() + up_at, up_share);
          ReceiveAll(clients[i], received_down.data() + down_at, down_share);
        });
        up_at += up_share;
        down_at += down_share;
      }
      for (std::thread& t : threads) t.join();
      exchanges.push_back(
          {std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
               .count(),
           CpuMs() - cpu_start});
    }
    std::sort(exchanges.begin(), exchanges.end());
    const auto [p50, cpu_ms] = exchanges[exchanges.size() / 2];
    std::printf("%-16s %7d %10.1f %10.3f %10.2f %10.1f\n", shape.c_str(), n,
                (up + down) / 1048576.0, p50, (up + down) / p50 / 1e6, cpu_ms);
    for (int i = 0; i < n; ++i) {
      ::close(clients[i]);
      ::close(servers[i]);
    }
    ::close(listener);
  }
  return 0;
}
