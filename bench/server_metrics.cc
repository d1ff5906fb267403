#include "bench/server_metrics.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

namespace hgemm::bench {
namespace {

// The value of label `name` in a series key as Scrape spells it (name{a="x",b="y"}).
std::string Label(const std::string& series, const std::string& name) {
  const std::string key = name + "=\"";
  size_t at = series.find("{" + key);
  if (at == std::string::npos) at = series.find("," + key);
  if (at == std::string::npos) return "";
  const size_t begin = at + 1 + key.size();
  return series.substr(begin, series.find('"', begin) - begin);
}

double ValueOr0(const Scrape& s, const std::string& series) {
  const double v = s.Get(series);
  return std::isnan(v) ? 0 : v;
}

// Σ over the series of `metric` whose labels satisfy `keep` of (after − before).
template <typename Keep>
double SumDelta(const Scrape& before, const Scrape& after, const std::string& metric, Keep keep) {
  double total = 0;
  for (const auto& [series, value] : after.Series(metric)) {
    if (keep(series)) total += value - ValueOr0(before, series);
  }
  return total;
}

}  // namespace

std::string ReadServerMetrics(const std::string& url, Scrape* scrape) {
  std::string host, path, body, error;
  int port = 0;
  if (std::string e = ParseHttpUrl(url, &host, &port, &path); !e.empty()) return e;
  const int code = HttpGet(host, port, path, &body, std::chrono::seconds(10), &error);
  if (code < 0) return fmt::format("GET {}: {}", url, error);
  if (code != 200) return fmt::format("GET {}: HTTP status {}", url, code);
  *scrape = ParseExposition(body);
  if (!scrape->errors.empty()) {
    return fmt::format("{}: not the Prometheus text format ({})", url, scrape->errors[0]);
  }
  return "";
}

ServerMetricsDelta DiffServerMetrics(const Scrape& before, const Scrape& after,
                                     const std::string& rpc, int64_t client_calls) {
  ServerMetricsDelta d;
  d.rpc = rpc;
  d.client_calls = client_calls;
  // A ring's GEMMs are entries of its ring, no RPC of their own.
  const bool ring = rpc == "ring";
  const std::string calls = ring ? "hgemm_ring_entries_total" : "hgemm_requests_total";
  auto of_rpc = [&](const std::string& s) { return ring || Label(s, "rpc") == rpc; };
  d.requests = std::llround(SumDelta(before, after, calls, of_rpc));
  d.ok_requests = std::llround(SumDelta(before, after, calls, [&](const std::string& s) {
    return of_rpc(s) && Label(s, "code") == "OK";
  }));
  const std::map<std::string, double*> stages = {{"queue_wait", &d.queue_ms},
                                                 {"host_to_device", &d.h2d_ms},
                                                 {"kernel", &d.kernel_ms},
                                                 {"device_to_host", &d.d2h_ms},
                                                 {"server_total", &d.total_ms}};
  for (const auto& [stage, mean_ms] : stages) {
    auto of_stage = [&, stage = stage](const std::string& s) { return Label(s, "stage") == stage; };
    const double count = SumDelta(before, after, "hgemm_gemm_stage_seconds_count", of_stage);
    const double sum = SumDelta(before, after, "hgemm_gemm_stage_seconds_sum", of_stage);
    *mean_ms = count > 0 ? sum / count * 1e3 : 0;
    if (stage == "server_total") d.gemms = std::llround(count);
  }
  auto all = [](const std::string&) { return true; };
  d.batches = std::llround(SumDelta(before, after, "hgemm_batch_members_count", all));
  d.batched_gemms = std::llround(SumDelta(before, after, "hgemm_batch_members_sum", all));
  return d;
}

std::string FormatServerMetricsRow(const ServerMetricsDelta& d) {
  std::string out = fmt::format(
      "  /metrics: {} {} calls ({} OK) {} the client's {}; {} GEMMs, mean ms: queue {:.3f} "
      "h2d {:.3f} kernel {:.3f} d2h {:.3f} server {:.3f}; {} batched launches ran {} of the "
      "GEMMs: {:.2f} GEMMs per launch\n",
      d.requests, d.rpc, d.ok_requests, d.Agrees() ? "=" : "!=", d.client_calls, d.gemms,
      d.queue_ms, d.h2d_ms, d.kernel_ms, d.d2h_ms, d.total_ms, d.batches, d.batched_gemms,
      d.GemmsPerLaunch());
  if (!d.Agrees()) {
    out += fmt::format(
        "  WARNING: the server counted {} {} calls, the client made {} (another client on the "
        "server, or calls lost on the way)\n",
        d.requests, d.rpc, d.client_calls);
  }
  return out;
}

}  // namespace hgemm::bench
