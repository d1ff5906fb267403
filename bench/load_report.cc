#include "bench/load_report.h"

#include <fmt/format.h>

#include <algorithm>

namespace hgemm::bench {
namespace {

const PointStats* Match(const PointResult* echo, const std::string& shape) {
  if (echo == nullptr) return nullptr;
  for (const PointStats& s : echo->stats) {
    if (s.shape == shape) return &s;
  }
  return nullptr;
}

std::string ErrorCodes(const PointResult& p) {
  std::string out;
  for (auto [code, count] : p.error_codes) {
    out += fmt::format("{}{}:{}", out.empty() ? "" : " ", code, count);
  }
  return out;
}

// The target column: "service" (gRPC), "shm" or "ring" (the service through shared memory:
// unary calls or a submission ring) or "echo".
const char* TargetLabel(const PointResult& p) {
  return p.target == Target::kService && p.transport != Transport::kGrpc
             ? TransportName(p.transport)
             : TargetName(p.target);
}

// The mode column: "unary", "stream", or "partsN" for N parallel parts.
std::string ModeLabel(const PointResult& p) {
  return p.parallel_parts > 1 && p.target == Target::kService
             ? fmt::format("parts{}", p.parallel_parts)
             : ModeName(p.mode);
}

// Wire bytes of one GEMM over its median latency, in GB/s.
double GemmGbPerS(const PointStats& s) {
  return s.requests_per_s > 0 && s.p50_ms > 0
             ? s.payload_gb_per_s / s.requests_per_s / (s.p50_ms / 1000)
             : 0;
}

// The batch column: the calls' mean Execution.batch_size; for a ring point, whose completions
// carry none, the server's GEMMs per launch over the point (/metrics, when read), on the row of
// all shapes.
double BatchSize(const PointResult& p, const PointStats& s) {
  if (p.transport == Transport::kRing && p.server_metrics && &s == &p.stats[0]) {
    return p.server_metrics->GemmsPerLaunch();
  }
  return s.server.batch_size;
}

}  // namespace

std::string FormatTableHeader() {
  return fmt::format(
      "{:<7} {:<6} {:<4} {:>4} {:>6} {:<16} {:>7} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} "
      "{:>7} | {:>8} {:>7} {:>9} {:>7} {:>9} {:>9} {:>5} | {:>3} {:<6}\n",
      "target", "mode", "res", "conc", "rate", "shape", "reqs", "err", "req/s", "p50_ms", "p90_ms",
      "p99_ms", "GFLOP/s", "GB/s", "gemm_GB/s", "vs_echo", "queue_ms", "h2d_ms", "kernel_ms",
      "d2h_ms", "server_ms", "verify_ms", "batch", "win", "stable");
}

std::string FormatTableRows(const PointResult& p, const PointResult* echo) {
  std::string out;
  const std::string rate = p.rate_per_s > 0 ? fmt::format("{:.0f}", p.rate_per_s) : "-";
  for (const PointStats& s : p.stats) {
    const PointStats* e = p.target == Target::kService ? Match(echo, s.shape) : nullptr;
    const std::string ratio = e && e->payload_gb_per_s > 0
                                  ? fmt::format("{:.2f}", s.payload_gb_per_s / e->payload_gb_per_s)
                                  : "-";
    std::string server;
    if (p.target == Target::kService && s.server.count > 0) {
      server = fmt::format("{:>8.3f} {:>7.3f} {:>9.3f} {:>7.3f} {:>9.3f} {:>9.3f} {:>5.1f}",
                           s.server.queue_ms, s.server.h2d_ms, s.server.kernel_ms, s.server.d2h_ms,
                           s.server.total_ms, s.server.verify_ms, BatchSize(p, s));
    } else {
      server = fmt::format("{:>8} {:>7} {:>9} {:>7} {:>9} {:>9} {:>5}", "-", "-", "-", "-", "-",
                           "-", "-");
    }
    const std::string gflops = p.target == Target::kService ? fmt::format("{:.1f}", s.gflops) : "-";
    out += fmt::format(
        "{:<7} {:<6} {:<4} {:>4} {:>6} {:<16} {:>7} {:>5} {:>9.1f} {:>9.3f} {:>9.3f} {:>9.3f} "
        "{:>9} "
        "{:>8.3f} {:>9.3f} {:>7} | {} | {:>3} {:<6}\n",
        TargetLabel(p), ModeLabel(p), ResidentName(p.resident), p.concurrency, rate, s.shape,
        s.requests, s.errors, s.requests_per_s, s.p50_ms, s.p90_ms, s.p99_ms, gflops,
        s.payload_gb_per_s, GemmGbPerS(s), ratio, server, p.windows, p.stable ? "yes" : "no");
  }
  if (p.target == Target::kService && p.resident != Resident::kNone && p.upload_s > 0) {
    std::string where;
    for (const std::string& replica : p.upload_replicas)
      where += (where.empty() ? "" : ", ") + replica;
    out += fmt::format(
        "  resident operands uploaded in {:.3f} s before the warm-up (not measured){}\n",
        p.upload_s, where.empty() ? "" : ", to replicas " + where);
  }
  if (!p.stable && !p.window_requests_per_s.empty()) {
    std::string windows;
    for (double r : p.window_requests_per_s) windows += fmt::format(" {:.1f}", r);
    out += fmt::format("  not stable: req/s per window{}\n", windows);
  }
  if (!p.error_codes.empty()) {
    out += fmt::format("  errors (code:count) {}; first: {}\n", ErrorCodes(p), p.first_error);
  }
  if (p.server_metrics) out += FormatServerMetricsRow(*p.server_metrics);
  return out;
}

void WriteCsvHeader(std::ostream& out) {
  out << "device,backend,target,mode,resident,concurrency,rate_per_s,shape,requests,errors,seconds,"
         "requests_per_s,p50_ms,p90_ms,p99_ms,mean_ms,min_ms,max_ms,gflops,payload_gb_per_s,"
         "echo_payload_gb_per_s,ratio_to_echo,server_queue_ms,server_h2d_ms,server_kernel_ms,"
         "server_d2h_ms,server_total_ms,windows,stable,warmup_requests,error_codes,shapes,"
         "parallel_parts,gemm_gb_per_s,calls,client_cpu_ms,"
         "metrics_rpc,metrics_requests,metrics_ok,metrics_agree,metrics_gemms,metrics_queue_ms,"
         "metrics_h2d_ms,metrics_kernel_ms,metrics_d2h_ms,metrics_total_ms,server_verify_ms,"
         "server_batch_size\n";
}

void WriteCsvRows(std::ostream& out, const PointResult& p, const PointResult* echo,
                  const std::string& device, const std::string& backend) {
  auto quote = [](std::string s) {
    std::replace(s.begin(), s.end(), '"', '\'');
    return "\"" + s + "\"";
  };
  for (const PointStats& s : p.stats) {
    const PointStats* e = p.target == Target::kService ? Match(echo, s.shape) : nullptr;
    const bool server = p.target == Target::kService;
    out << fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{:.4f},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:."
        "6g},"
        "{:.6g},{},{},{},{},{},{},{},{},{},{},{},{}",
        quote(device), backend, TargetLabel(p), ModeLabel(p), ResidentName(p.resident),
        p.concurrency, p.rate_per_s, s.shape, s.requests, s.errors, s.seconds, s.requests_per_s,
        s.p50_ms, s.p90_ms, s.p99_ms, s.mean_ms, s.min_ms, s.max_ms, s.gflops, s.payload_gb_per_s,
        e ? fmt::format("{:.6g}", e->payload_gb_per_s) : "",
        e && e->payload_gb_per_s > 0
            ? fmt::format("{:.4f}", s.payload_gb_per_s / e->payload_gb_per_s)
            : "",
        server ? fmt::format("{:.6g}", s.server.queue_ms) : "",
        server ? fmt::format("{:.6g}", s.server.h2d_ms) : "",
        server ? fmt::format("{:.6g}", s.server.kernel_ms) : "",
        server ? fmt::format("{:.6g}", s.server.d2h_ms) : "",
        server ? fmt::format("{:.6g}", s.server.total_ms) : "", p.windows, p.stable ? 1 : 0,
        p.warmup_requests, quote(ErrorCodes(p)), quote(p.shapes));
    // The process's CPU per call and the server's metrics: on the all-shapes row only.
    const bool all_shapes = &s == &p.stats[0];
    const ServerMetricsDelta* m = all_shapes && p.server_metrics ? &*p.server_metrics : nullptr;
    out << fmt::format(",{},{:.6g},{},{}", p.parallel_parts, GemmGbPerS(s), p.calls,
                       all_shapes && s.requests > 0
                           ? fmt::format("{:.4g}", 1e3 * p.client_cpu_s / double(s.requests))
                           : "");
    if (m != nullptr) {
      out << fmt::format(",{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g}", m->rpc, m->requests,
                         m->ok_requests, m->Agrees() ? 1 : 0, m->gemms, m->queue_ms, m->h2d_ms,
                         m->kernel_ms, m->d2h_ms, m->total_ms);
    } else {
      out << ",,,,,,,,,,";
    }
    out << (server ? fmt::format(",{:.6g},{:.4g}\n", s.server.verify_ms, BatchSize(p, s)) : ",,\n");
  }
}

}  // namespace hgemm::bench
