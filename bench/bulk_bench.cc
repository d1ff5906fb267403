// bulk_bench: the bytes of one remote GEMM (A and B up, C down, fp16) between this process and
// a running hgemm_server, by the two ways GemmClient::Run can move them, side by side: gRPC
// parallel parts (UploadPart and ranged DownloadMatrix over `lanes` connections) and the bulk
// channel (OpenBulk, `lanes` TCP connections per operand). No GEMM runs: the bytes alone, to
// be read next to tcp_ceiling's raw-TCP time for the same shape.
//   bulk_bench --server=127.0.0.1:50051 --shape=8192x8192x8192 --lanes=1,4,8 --repeat=3
// The server needs --bulk_listen for the bulk rows. Prints one row per path and lane count:
// the median exchange, its GB/s (A + B + C bytes over the exchange's wall time), and the
// client's CPU per exchange (and the server's, given its pid on this host).
// --gemm adds, per path and lane count, where one whole remote GEMM's time goes: GemmClient::Run
// timed as a caller sees it, and the steps Run takes timed one by one (transient uploads, their
// bytes, the GEMM keeping C, C's bytes, C's release).
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/load_options.h"
#include "client/gemm_client.h"
#include "client/gemm_dims.h"

namespace hgemm {
namespace {

double CpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

// CPU milliseconds process `pid` has used (utime + stime of /proc/PID/stat); 0 when pid is 0.
double ProcessCpuMs(int pid) {
  if (pid == 0) return 0;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start at its closing parenthesis.
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) * 1e3 / double(sysconf(_SC_CLK_TCK));
}

// Runs work(0) .. work(n - 1) at once; the first failure, else OK.
grpc::Status Together(int n, const std::function<grpc::Status(int)>& work) {
  std::vector<grpc::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { statuses[i] = work(i); });
  for (std::thread& t : threads) t.join();
  for (const grpc::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return grpc::Status::OK;
}

// Bytes [begin, end) of `size` that connection `route` of `lanes` moves: even shares, as
// GemmClient::Run's parts split them (elements stay whole).
std::pair<uint64_t, uint64_t> Share(uint64_t size, int lanes, int route) {
  const uint64_t share = (size / lanes + 1) & ~uint64_t{1};
  const uint64_t begin = std::min(size, share * route);
  return {begin, route == lanes - 1 ? size : std::min(size, begin + share)};
}

void Check(const grpc::Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(fmt::format("{}: {}", what, s.error_message()));
}

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// A and B of `d` as new uploads (transient: released by the first GEMM that reads them, as
// GemmClient::Run makes them), filled from `a` and `b` by `path` over `lanes`: bulk, or gRPC
// parts with each connection sending its share of each operand, as Run's parts do. Returns
// the two handles; *create_ms (if not null): the time the two CreateUploads took.
std::vector<std::string> Send(const GemmClient& client, const std::string& path, int lanes,
                              const GemmDims& d, const std::string& a, const std::string& b,
                              bool transient, const CallOptions& options,
                              double* create_ms = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> handles;
  for (auto [rows, cols] : {std::pair{d.m, d.k}, std::pair{d.k, d.n}}) {
    v1::MatrixInfo info;
    Check(client.CreateUpload(rows, cols, v1::DATA_TYPE_FP16, transient, &info, options),
          "CreateUpload");
    handles.push_back(info.handle());
  }
  if (create_ms != nullptr) *create_ms = MsSince(start);
  const std::string* bytes[2] = {&a, &b};
  if (path == "bulk") {
    Check(Together(2,
                   [&](int i) {
                     return client.BulkPut(handles[i], 0, bytes[i]->data(), bytes[i]->size(), lanes,
                                           options);
                   }),
          "BulkPut");
    return handles;
  }
  Check(Together(lanes,
                 [&](int route) {
                   for (int i = 0; i < 2; ++i) {
                     const auto [begin, end] = Share(bytes[i]->size(), lanes, route);
                     if (begin == end) continue;
                     if (grpc::Status s =
                             client.UploadPart(handles[i], begin, bytes[i]->data() + begin,
                                               end - begin, route, options);
                         !s.ok()) {
                       return s;
                     }
                   }
                   return grpc::Status::OK;
                 }),
        "UploadPart");
  return handles;
}

// The bytes of `c_handle` into *c (its size) by `path` over `lanes`.
void Fetch(const GemmClient& client, const std::string& path, int lanes,
           const std::string& c_handle, std::string* c, const CallOptions& options) {
  if (path == "bulk") {
    Check(client.BulkGet(c_handle, 0, c->size(), c->data(), lanes, options), "BulkGet");
    return;
  }
  Check(Together(lanes,
                 [&](int route) {
                   const auto [begin, end] = Share(c->size(), lanes, route);
                   if (begin == end) return grpc::Status::OK;
                   return client.DownloadRange(c_handle, begin, end - begin, c->data() + begin,
                                               route, options);
                 }),
        "DownloadRange");
}

struct Exchange {
  double up_ms = 0, down_ms = 0, cpu_ms = 0, server_cpu_ms = 0;
};

// One GEMM's bytes: A and B into new uploads, C out of `c_handle`, by `path` over `lanes`.
Exchange Move(const GemmClient& client, const std::string& path, int lanes, const GemmDims& d,
              const std::string& a, const std::string& b, const std::string& c_handle,
              std::string* c, const CallOptions& options, int server_pid) {
  const double cpu_start = CpuMs(), server_cpu_start = ProcessCpuMs(server_pid);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> handles = Send(client, path, lanes, d, a, b, false, options);
  const auto uploaded = std::chrono::steady_clock::now();
  Fetch(client, path, lanes, c_handle, c, options);
  const auto done = std::chrono::steady_clock::now();
  for (const std::string& handle : handles) Check(client.ReleaseMatrix(handle, options), "Release");
  return {std::chrono::duration<double, std::milli>(uploaded - start).count(),
          std::chrono::duration<double, std::milli>(done - uploaded).count(), CpuMs() - cpu_start,
          ProcessCpuMs(server_pid) - server_cpu_start};
}

// One remote GEMM by the steps GemmClient::Run takes with parallel parts, each timed: A and B
// created as transient uploads, their bytes sent, the GEMM run keeping C as a transient matrix,
// C's bytes fetched, C released.
struct Steps {
  double create_ms = 0, put_ms = 0, gemm_ms = 0, get_ms = 0, release_ms = 0, server_ms = 0;
  double total() const { return create_ms + put_ms + gemm_ms + get_ms + release_ms; }
};

Steps RunSteps(const GemmClient& client, const std::string& path, int lanes, const GemmDims& d,
               const std::string& a, const std::string& b, std::string* c,
               const CallOptions& options) {
  Steps steps;
  auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> handles =
      Send(client, path, lanes, d, a, b, true, options, &steps.create_ms);
  steps.put_ms = MsSince(start) - steps.create_ms;
  start = std::chrono::steady_clock::now();
  v1::GemmRequest gemm;
  gemm.set_m(d.m);
  gemm.set_n(d.n);
  gemm.set_k(d.k);
  gemm.set_a_handle(handles[0]);
  gemm.set_b_handle(handles[1]);
  gemm.set_keep_c_resident(true);
  gemm.set_c_transient(true);
  v1::GemmResponse ran;
  Check(client.Gemm(gemm, &ran, options), "Gemm");
  steps.gemm_ms = MsSince(start);
  steps.server_ms = ran.timing().server_total_ms();
  const std::string c_handle = ran.c_matrix().handle();
  start = std::chrono::steady_clock::now();
  Fetch(client, path, lanes, c_handle, c, options);
  steps.get_ms = MsSince(start);
  start = std::chrono::steady_clock::now();
  Check(client.ReleaseMatrix(c_handle, options), "Release");
  steps.release_ms = MsSince(start);
  return steps;
}

// GemmClient::Run's wall time for one GEMM with parallel parts over `lanes` connections (bulk
// or gRPC), C landing in the buffer of the response before.
double RunMs(const GemmClient& client, const std::string& path, int lanes, const GemmDims& d,
             const std::string& a, const std::string& b, v1::GemmResponse* response) {
  v1::GemmRequest request;
  request.set_m(d.m);
  request.set_n(d.n);
  request.set_k(d.k);
  request.set_a(a);
  request.set_b(b);
  CallOptions options;
  options.client_id = "bulk_bench";
  options.parallel_parts = lanes;
  options.parallel_min_bytes = 0;
  options.bulk = path == "bulk";
  const auto start = std::chrono::steady_clock::now();
  Check(client.Run(request, response, options), "Run");
  return MsSince(start);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  std::string server = "127.0.0.1:50051", shape = "8192x8192x8192", lanes_list = "1,4,8";
  std::string paths = "grpc,bulk";
  int repeat = 3, server_pid = 0;
  ConnectOptions connect;
  CLI::App app{"bulk_bench: one GEMM's bytes by gRPC parts and by the bulk channel"};
  app.add_option("--server", server, "the server (with --bulk_listen for the bulk rows)")
      ->capture_default_str();
  app.add_option("--shape", shape, "MxNxK: A and B go up, C comes back (fp16)")
      ->capture_default_str();
  app.add_option("--lanes", lanes_list, "sweep of connections per transfer")->capture_default_str();
  app.add_option("--paths", paths, "grpc, bulk, or both")->capture_default_str();
  app.add_option("--repeat", repeat, "exchanges per point (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--tls_ca", connect.tls_ca,
                 "PEM CAs of a TLS server (gRPC and, with it, the bulk lanes are TLS)");
  app.add_option("--server_pid", server_pid,
                 "the server's process on this host: its CPU per exchange is reported too");
  bool gemm = false;
  app.add_flag("--gemm", gemm,
               "also a whole GEMM per path and lane count: Run's time and its steps' times");
  CLI11_PARSE(app, argc, argv);
  GemmDims d;
  std::vector<int> lanes;
  if (std::string e = ParseGemmDims(shape, &d); !e.empty()) throw std::runtime_error(e);
  if (std::string e = bench::ParseIntList(lanes_list, &lanes); !e.empty()) {
    throw std::runtime_error("--lanes: " + e);
  }
  connect.tls = !connect.tls_ca.empty();
  const GemmClient client(server, connect);
  CallOptions options;
  options.client_id = "bulk_bench";
  std::string a(d.ABytes(), '\1'), b(d.BBytes(), '\2'), c(d.CBytes(), '\0');
  // C's bytes come from a matrix uploaded once, outside the timing.
  v1::MatrixInfo c_info;
  Check(client.UploadMatrix(d.m, d.n, c, &c_info, 0, "bulk_bench C", options), "UploadMatrix");
  const double bytes = double(d.ABytes() + d.BBytes() + d.CBytes());
  std::printf("%-16s %-5s %5s %10s %10s %10s %8s %12s %12s\n", "shape", "path", "lanes", "up_ms",
              "down_ms", "total_ms", "GB/s", "client_cpu", "server_cpu");
  for (int n : lanes) {
    for (size_t at = 0; at < paths.size();) {
      const size_t comma = std::min(paths.find(',', at), paths.size());
      const std::string path = paths.substr(at, comma - at);
      at = comma + 1;
      std::vector<double> up, down, total, cpu, server_cpu;
      for (int r = 0; r < repeat; ++r) {
        const Exchange e = Move(client, path, n, d, a, b, c_info.handle(), &c, options, server_pid);
        up.push_back(e.up_ms);
        down.push_back(e.down_ms);
        total.push_back(e.up_ms + e.down_ms);
        cpu.push_back(e.cpu_ms);
        server_cpu.push_back(e.server_cpu_ms);
      }
      const double t = Median(total);
      std::printf("%-16s %-5s %5d %10.1f %10.1f %10.1f %8.2f %12.1f %12.1f\n", shape.c_str(),
                  path.c_str(), n, Median(up), Median(down), t, bytes / t / 1e6, Median(cpu),
                  Median(server_cpu));
      std::fflush(stdout);
    }
  }
  Check(client.ReleaseMatrix(c_info.handle(), options), "Release");
  if (!gemm) return 0;
  std::printf("\n%-16s %-5s %5s %9s %9s %9s %9s %9s %9s %9s %9s\n", "shape", "path", "lanes",
              "run_ms", "steps_ms", "create", "put", "gemm", "server", "get", "release");
  v1::GemmResponse response;
  for (int n : lanes) {
    for (size_t at = 0; at < paths.size();) {
      const size_t comma = std::min(paths.find(',', at), paths.size());
      const std::string path = paths.substr(at, comma - at);
      at = comma + 1;
      std::vector<double> run, total, create, put, gemm_ms, server_ms, get, release;
      for (int r = 0; r < repeat; ++r) {
        run.push_back(RunMs(client, path, n, d, a, b, &response));
        const Steps s = RunSteps(client, path, n, d, a, b, &c, options);
        total.push_back(s.total());
        create.push_back(s.create_ms);
        put.push_back(s.put_ms);
        gemm_ms.push_back(s.gemm_ms);
        server_ms.push_back(s.server_ms);
        get.push_back(s.get_ms);
        release.push_back(s.release_ms);
      }
      std::printf("%-16s %-5s %5d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", shape.c_str(),
                  path.c_str(), n, Median(run), Median(total), Median(create), Median(put),
                  Median(gemm_ms), Median(server_ms), Median(get), Median(release));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace hgemm

int main(int argc, char** argv) {
  try {
    return hgemm::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bulk_bench: %s\n", e.what());
    return 1;
  }
}
