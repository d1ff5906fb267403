// hgemm_load: load generator for hgemm-serve (docs/load_generator.md).
//
//   hgemm_load --server=127.0.0.1:50051 --shapes=256x256x256 --concurrency=1,4,16,64 --baseline
//   hgemm_load --server=... --shapes=2048x2048x2048 --mode=stream --rate=50,100,200 --csv=out.csv
//   hgemm_load --server=... --shapes=128x8192x8192 --resident=b     (B uploaded once, A sent)
//   hgemm_load --server=... --shapes=4096x4096x4096 --resident=all  (only handles on the wire)
//   hgemm_load --server=... --metrics_url=http://127.0.0.1:9090/metrics  (the server's counts too)
//   hgemm_load --server=127.0.0.1:50051 --shm_server=unix:/run/hgemm/hgemm.sock
//   --transport=grpc,shm,ring
//                      (each point over gRPC and through shared memory, same host, one run;
//                      with --resident=b, B uploaded once and A and C in shared memory)
// Exit status: 0; 1 bad flags or no server; 3 the correctness guard failed (nothing measured);
// 4 a point completed no successful call.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>

#include "bench/echo_service.h"
#include "bench/hgemm_load.h"
#include "bench/load_report.h"
#include "bench/server_metrics.h"
#include "client/connect_flags.h"

namespace {

using hgemm::bench::LoadGenerator;
using hgemm::bench::LoadOptions;
using hgemm::bench::PointResult;
using hgemm::bench::Target;
using hgemm::bench::Transport;

int Fail(const std::string& message) {
  std::fprintf(stderr, "hgemm_load: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  LoadOptions o;
  std::string server = "127.0.0.1:50051", shapes = "256x256x256", concurrency = "1,2,4,8,16,32,64";
  std::string parallel_parts = "1";
  std::string rates, mode = "unary", accumulation = "default", csv_path, echo_server, metrics_url;
  double stable_percent = 10, wait_for_server_s = 30;
  int verify = 2;
  bool baseline = false, csv_append = false;
  std::string resident = "none", transport = "grpc", shm_server;
  bool resident_b = false, resident_all = false;

  CLI::App app{"hgemm_load: throughput and latency of an hgemm-serve server under load"};
  app.add_option("--server", server, "hgemm server (HOST:PORT or a gRPC target)")
      ->capture_default_str();
  app.add_option("--shapes", shapes, "shape mix: MxNxK[:weight],...")->capture_default_str();
  app.add_option("--transport", transport,
                 "grpc (operands and C in the messages), shm (A, B and C in shared memory, named "
                 "by unary Gemm calls over --shm_server), ring (the same regions named by a "
                 "submission ring per worker, AttachRing over --shm_server), or a list such as "
                 "grpc,shm,ring: every point each way")
      ->check([](const std::string& list) {
        std::vector<std::string> names;
        for (size_t at = 0; at <= list.size();) {
          const size_t comma = std::min(list.find(',', at), list.size());
          const std::string name = list.substr(at, comma - at);
          if (name != "grpc" && name != "shm" && name != "ring") {
            return "unknown transport '" + name + "' (grpc, shm, ring)";
          }
          at = comma + 1;
        }
        return std::string();
      })
      ->capture_default_str();
  app.add_option("--shm_server", shm_server,
                 "the server's unix: socket for --transport=shm (default: --server if it is one; "
                 "the server needs --allow_shared_memory)");
  app.add_option("--mode", mode, "unary (Gemm per call) or stream (one GemmStream per worker)")
      ->check(CLI::IsMember({"unary", "stream"}))
      ->capture_default_str();
  app.add_option("--concurrency", concurrency,
                 "closed loop: sweep of workers, one call in flight each; with --rate: the largest "
                 "value caps calls in flight")
      ->capture_default_str();
  app.add_option("--parallel_parts", parallel_parts,
                 "unary mode: sweep of parallel parts per GEMM (each a connection of its own: "
                 "A, B and C travel as parts, see GemmClient::Run); 1: one Gemm call")
      ->capture_default_str();
  app.add_option("--rate", rates, "open loop: sweep of calls/s over all workers (e.g. 50,100,200)");
  auto* resident_option =
      app.add_option("--resident", resident,
                     "operands kept on the server: none; b (B uploaded once per shape, A sent, C "
                     "returned; over shm and ring A and C in shared memory); all (A and B "
                     "uploaded, C kept and released after the next reply; gRPC only)")
          ->check(CLI::IsMember({"none", "b", "all"}))
          ->capture_default_str();
  auto* resident_b_flag = app.add_flag("--resident-b", resident_b, "same as --resident=b");
  auto* resident_all_flag = app.add_flag("--resident-all", resident_all, "same as --resident=all");
  resident_b_flag->excludes(resident_option)->excludes(resident_all_flag);
  resident_all_flag->excludes(resident_option);
  app.add_option("--client_id", o.client_id,
                 "x-client-id of every call (owner of the resident matrices; default "
                 "hgemm_load-<pid>)");
  app.add_option("--kernel", o.kernel, "kernel variant (GemmOptions.kernel)")
      ->capture_default_str();
  // --verify is the client-side correctness guard below.
  app.add_flag("--server_verify", o.verify,
               "ask the server to check every C by Freivalds' method (GemmOptions.verify; its "
               "cost is the verify_ms column)");
  app.add_option("--server_verify_repetitions", o.verify_repetitions,
                 "repetitions of that check (0: the server's default)")
      ->check(CLI::Range(0, 8))
      ->capture_default_str();
  std::string dtype = "fp16", c_dtype;
  app.add_flag("--transpose_a", o.form.transpose_a, "A stored k x m (C = A^T B)");
  app.add_flag("--transpose_b", o.form.transpose_b, "B stored n x k (C = A B^T)");
  app.add_option("--dtype", dtype, "element type of A and B: fp16 or bf16")
      ->check(CLI::IsMember({"fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--c_dtype", c_dtype, "element type of C: that of A and B (default) or fp32")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  app.add_option("--accumulation", accumulation, "default (server's), fp32 or fp16")
      ->check(CLI::IsMember({"default", "fp32", "fp16"}))
      ->capture_default_str();
  app.add_option("--workers_per_channel", o.workers_per_channel,
                 "workers sharing one channel (= one TCP connection); 0: one channel for all")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--warmup_s", o.warmup_s,
                 "warm-up of each point (and until each worker has a reply)")
      ->capture_default_str();
  app.add_option("--window_s", o.window_s, "measurement window length")->capture_default_str();
  app.add_option("--min_window_requests", o.min_window_requests,
                 "a window lasts until it has this many replies")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--stable_windows", o.stable_windows, "consecutive windows that must agree")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--stable_percent", stable_percent, "how close (req/s and p50) they must be, in %")
      ->capture_default_str();
  app.add_option("--max_windows", o.max_windows, "windows per point at most")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--max_point_s", o.max_point_s, "seconds per point at most (warm-up + windows)")
      ->capture_default_str();
  app.add_option("--timeout_s", o.call_timeout_s, "deadline of one call")->capture_default_str();
  app.add_option("--chunk_bytes", o.chunk_bytes, "operand chunk size in stream mode")
      ->check(CLI::Range(int64_t{1} << 10, int64_t{64} << 20))
      ->capture_default_str();
  app.add_flag("--baseline", baseline,
               "also run every point against a gRPC byte echo (bench/echo.proto)");
  app.add_option("--echo_server", echo_server,
                 "address of a running echo_server for --baseline (default: one in this process)");
  app.add_option("--verify", verify,
                 "correctness guard: GEMMs per shape checked against the CPU "
                 "reference before measuring (0: skip)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  app.add_option("--csv", csv_path, "write the results as CSV to this file");
  app.add_flag("--csv_append", csv_append, "append to --csv (header only if the file is empty)");
  app.add_option("--wait_for_server_s", wait_for_server_s,
                 "how long to wait for the server to answer")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the random operands")->capture_default_str();
  hgemm::ConnectFlags connect_flags;
  connect_flags.Add(&app);
  app.add_option("--metrics_url", metrics_url,
                 "the server's /metrics (http://HOST:PORT/metrics, its --metrics_listen): read "
                 "before and after each point for the server's call count and stage means");
  CLI11_PARSE(app, argc, argv);
  if (std::string e = connect_flags.Apply(&o.connect); !e.empty()) return Fail(e);

  if (std::string e = hgemm::bench::ParseShapes(shapes, &o.shapes); !e.empty())
    return Fail("--shapes: " + e);
  std::vector<int> levels;
  if (std::string e = hgemm::bench::ParseIntList(concurrency, &levels); !e.empty()) {
    return Fail("--concurrency: " + e);
  }
  std::vector<int> parts_list;
  if (std::string e = hgemm::bench::ParseIntList(parallel_parts, &parts_list); !e.empty()) {
    return Fail("--parallel_parts: " + e);
  }
  if (mode != "unary" && (parts_list.size() > 1 || parts_list[0] > 1)) {
    return Fail("--parallel_parts goes with --mode=unary");
  }
  o.parallel_parts = *std::max_element(parts_list.begin(), parts_list.end());  // for --verify
  std::vector<double> rate_list;
  if (!rates.empty()) {
    if (std::string e = hgemm::bench::ParseDoubleList(rates, &rate_list); !e.empty())
      return Fail("--rate: " + e);
  }
  if (resident_b) resident = "b";
  if (resident_all) resident = "all";
  hgemm::bench::ParseResident(resident, &o.resident);
  o.mode = mode == "stream" ? hgemm::bench::Mode::kStream : hgemm::bench::Mode::kUnary;
  if (!c_dtype.empty() && c_dtype != dtype && c_dtype != "fp32") {
    return Fail("--c_dtype=" + c_dtype + " with --dtype=" + dtype +
                ": C is the inputs' type or fp32");
  }
  o.form.bf16 = dtype == "bf16";
  o.form.c_fp32 = c_dtype == "fp32";
  for (hgemm::bench::Shape& shape : o.shapes) shape.c_fp32 = o.form.c_fp32;
  o.accumulation = accumulation == "fp16"   ? hgemm::v1::ACCUMULATION_FP16
                   : accumulation == "fp32" ? hgemm::v1::ACCUMULATION_FP32
                                            : hgemm::v1::ACCUMULATION_UNSPECIFIED;
  o.stable_tolerance = stable_percent / 100.0;
  std::vector<Transport> transports;
  if (transport.find("grpc") != std::string::npos) transports.push_back(Transport::kGrpc);
  if (transport.find("shm") != std::string::npos) transports.push_back(Transport::kShm);
  if (transport.find("ring") != std::string::npos) transports.push_back(Transport::kRing);
  if (shm_server.empty() && server.rfind("unix:", 0) == 0) shm_server = server;
  const bool same_host =
      transport.find("shm") != std::string::npos || transport.find("ring") != std::string::npos;
  if (same_host) {
    if (shm_server.rfind("unix:", 0) != 0) {
      return Fail(
          "--transport=shm and ring need the server's Unix socket: "
          "--shm_server=unix:PATH (or a unix: --server)");
    }
    if (o.mode != hgemm::bench::Mode::kUnary || o.resident == hgemm::bench::Resident::kAll) {
      return Fail("--transport=shm and ring take --mode=unary and --resident=none or b");
    }
  }
  // Where the service points of a transport go.
  auto target_of = [&](Transport t) { return t == Transport::kGrpc ? server : shm_server; };

  // Where the service runs (and its reply chunk size, which the echo stream copies).
  hgemm::v1::ServerInfo info;
  {
    auto stub = hgemm::v1::GemmService::NewStub(LoadGenerator::MakeChannel(server, o.connect));
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(int64_t(wait_for_server_s * 1000)));
    grpc::Status s = stub->GetServerInfo(&context, hgemm::v1::GetServerInfoRequest(), &info);
    if (!s.ok()) return Fail(fmt::format("no answer from {}: {}", server, s.error_message()));
  }
  std::string device = info.devices_size() > 0 ? info.devices(0).name() : "unknown";
  if (info.backend() == "cpu")
    device = fmt::format("CPU ({} hardware threads)", std::thread::hardware_concurrency());
  if (info.limits().stream_chunk_bytes() > 0)
    o.reply_chunk_bytes = int64_t(info.limits().stream_chunk_bytes());
  std::printf("server %s: hgemm-serve %s, backend %s, %d device(s)\n", server.c_str(),
              info.version().c_str(), info.backend().c_str(), info.devices_size());
  for (const auto& d : info.devices()) {
    std::printf("  device %d: %s, %d streams/workers\n", d.id(), d.name().c_str(), d.streams());
  }
  std::printf(
      "shapes %s, mode %s, resident %s, %s, warm-up %.1f s, windows %.1f s (≥ %d replies), stable: "
      "%d "
      "within %.0f %% (at most %d windows, %.0f s per point), %s\n",
      shapes.c_str(), mode.c_str(), resident.c_str(),
      rate_list.empty() ? "closed loop" : "open loop (fixed rate)", o.warmup_s, o.window_s,
      o.min_window_requests, o.stable_windows, stable_percent, o.max_windows, o.max_point_s,
      o.workers_per_channel == 0
          ? "one channel for all workers"
          : fmt::format("one channel per {} worker(s)", o.workers_per_channel).c_str());

  if (same_host) {
    std::printf(
        "transport %s: shared memory over %s (%s in one region per point, C in "
        "one per worker; ring: a submission ring per worker)\n",
        transport.c_str(), shm_server.c_str(),
        o.resident == hgemm::bench::Resident::kB ? "A (B resident)" : "A and B");
  }
  LoadGenerator generator(o);
  if (o.resident != hgemm::bench::Resident::kNone) {
    std::printf(
        "resident operands (%s) owned by client id %s; quota %.1f GiB per client, "
        "default TTL %u s, LRU eviction %s\n",
        o.resident == hgemm::bench::Resident::kAll ? "A and B uploaded per point, C kept"
        : !same_host                               ? "B uploaded per point, A sent"
        : transport.find("grpc") == std::string::npos
            ? "B uploaded per point, A and C in shared memory"
            : "B uploaded per point, A sent (shm, ring: A and C in shared memory)",
        generator.options().client_id.c_str(),
        double(info.limits().resident_quota_bytes()) / (1 << 30),
        info.limits().resident_default_ttl_seconds(),
        info.limits().resident_lru_eviction() ? "on" : "off");
  }

  std::unique_ptr<hgemm::bench::EchoServer> local_echo;
  if (baseline && echo_server.empty()) {
    local_echo = hgemm::bench::EchoServer::Start({.listen_address = "127.0.0.1:0"});
    if (!local_echo) return Fail("cannot start the in-process echo server");
    echo_server = fmt::format("127.0.0.1:{}", local_echo->port());
  }
  if (baseline) {
    std::printf("baseline: gRPC byte echo at %s (%s)\n", echo_server.c_str(),
                local_echo ? "in this process" : "separate process");
  }

  for (Transport t : transports) {
    if (verify <= 0) break;
    hgemm::bench::VerifyResult v = generator.Verify(target_of(t), verify, t);
    const char* name = hgemm::bench::TransportName(t);
    for (const std::string& line : v.lines) std::printf("verify (%s): %s\n", name, line.c_str());
    std::printf("verify (%s): %d of %d GEMMs correct, largest relative error %.2e\n", name,
                v.checked - v.failed, v.checked, v.max_error);
    if (v.failed > 0) {
      std::fprintf(stderr, "hgemm_load: the correctness guard failed; nothing measured\n");
      return 3;
    }
  }

  hgemm::Scrape before;
  if (!metrics_url.empty()) {
    if (std::string e = hgemm::bench::ReadServerMetrics(metrics_url, &before); !e.empty()) {
      return Fail("--metrics_url: " + e);
    }
    std::printf(
        "server metrics: %s, read before and after each point (all of its calls, warm-up "
        "included)\n",
        metrics_url.c_str());
  }

  std::ofstream csv;
  if (!csv_path.empty()) {
    bool header = true;
    if (csv_append) {
      std::ifstream existing(csv_path);
      header = !existing || existing.peek() == std::ifstream::traits_type::eof();
    }
    csv.open(csv_path, csv_append ? std::ios::app : std::ios::trunc);
    if (!csv) return Fail("cannot write " + csv_path);
    if (header) hgemm::bench::WriteCsvHeader(csv);
  }

  std::printf("\n%s", hgemm::bench::FormatTableHeader().c_str());
  std::fflush(stdout);
  int status = 0;
  const size_t per_parts = rate_list.empty() ? levels.size() : rate_list.size();
  const size_t points = per_parts * parts_list.size();
  for (size_t point = 0; point < points; ++point) {
    const size_t i = point % per_parts;
    generator.SetParallelParts(parts_list[point / per_parts]);
    const double rate = rate_list.empty() ? 0 : rate_list[i];
    const int workers =
        rate_list.empty() ? levels[i] : *std::max_element(levels.begin(), levels.end());
    std::vector<PointResult> services;  // one per transport
    for (Transport t : transports) {
      // The server's counters around the point (not around its echo baseline).
      bool have_before = false;
      if (!metrics_url.empty()) {
        const std::string e = hgemm::bench::ReadServerMetrics(metrics_url, &before);
        if (!e.empty())
          std::fprintf(stderr, "hgemm_load: %s; no server counts for this point\n", e.c_str());
        have_before = e.empty();
      }
      PointResult service = generator.RunPoint(Target::kService, target_of(t), workers, rate, t);
      if (hgemm::Scrape after; have_before) {
        if (std::string e = hgemm::bench::ReadServerMetrics(metrics_url, &after); e.empty()) {
          service.server_metrics =
              hgemm::bench::DiffServerMetrics(before, after,
                                              t == Transport::kRing                   ? "ring"
                                              : o.mode == hgemm::bench::Mode::kStream ? "GemmStream"
                                                                                      : "Gemm",
                                              service.calls);
        } else {
          std::fprintf(stderr, "hgemm_load: %s; no server counts for this point\n", e.c_str());
        }
      }
      services.push_back(std::move(service));
    }
    std::optional<PointResult> echo;
    if (baseline) echo = generator.RunPoint(Target::kEcho, echo_server, workers, rate);
    const PointResult* echo_ptr = echo ? &*echo : nullptr;
    for (const PointResult& service : services) {
      std::printf("%s", hgemm::bench::FormatTableRows(service, echo_ptr).c_str());
      if (csv.is_open()) hgemm::bench::WriteCsvRows(csv, service, echo_ptr, device, info.backend());
      if (service.stats[0].requests == 0) status = 4;
    }
    if (echo) std::printf("%s", hgemm::bench::FormatTableRows(*echo, nullptr).c_str());
    std::fflush(stdout);
    if (csv.is_open()) {
      if (echo) hgemm::bench::WriteCsvRows(csv, *echo, nullptr, device, info.backend());
      csv.flush();
    }
    if (echo && echo->stats[0].requests == 0) status = 4;
  }
  if (!csv_path.empty()) std::printf("wrote %s\n", csv_path.c_str());
  return status;
}
