// What an hgemm server's own /metrics say about one load point (hgemm_load --metrics_url):
// two scrapes, before and after the point, and their difference for the RPC the point used.
// The counts include the point's warm-up and every call it made, so that they can be held
// against the calls the load generator made; they agree unless another client used the server
// meanwhile or calls were lost on the way.
// Thread safety: plain functions and values.
#ifndef HGEMM_BENCH_SERVER_METRICS_H_
#define HGEMM_BENCH_SERVER_METRICS_H_

#include <cstdint>
#include <string>

#include "client/metrics_scrape.h"

namespace hgemm::bench {

struct ServerMetricsDelta {
  std::string rpc;           // "Gemm" or "GemmStream", or "ring" (submission ring entries)
  int64_t client_calls = 0;  // the calls the load generator made (every outcome)
  // hgemm_requests_total{rpc} (for "ring": hgemm_ring_entries_total), every code
  int64_t requests = 0;
  int64_t ok_requests = 0;  // ... code="OK"
  // GEMMs the server timed (hgemm_gemm_stage_seconds_count of server_total, every backend and
  // kernel), and the mean of each stage over them: Δsum / Δcount, in milliseconds.
  int64_t gemms = 0;
  double queue_ms = 0, h2d_ms = 0, kernel_ms = 0, d2h_ms = 0, total_ms = 0;
  // Batched launches (hgemm_batch_members: Δcount) and the GEMMs they ran (Δsum); the other
  // gemms ran alone, one launch each.
  int64_t batches = 0;
  int64_t batched_gemms = 0;

  bool Agrees() const { return requests == client_calls; }
  // GEMMs per launch, batched or alone (1: none batched; 0: no GEMM), over the GEMMs that ran:
  // `gemms`, or for "ring" its OK entries (the server times a ring's GEMMs in no stage
  // histogram). A ring's completion carries no batch size: this is how a ring point shows its
  // batches.
  double GemmsPerLaunch() const {
    const int64_t ran = rpc == "ring" ? ok_requests : gemms;
    const int64_t launches = ran - batched_gemms + batches;
    return ran > 0 && launches > 0 ? double(ran) / double(launches) : 0;
  }
};

// GETs and parses `url` (http://HOST:PORT/metrics). Returns "" or what failed: the URL, the
// connection, an HTTP status other than 200, or text that is not the exposition format.
std::string ReadServerMetrics(const std::string& url, Scrape* scrape);

// after − before for `rpc` ("ring": the submission rings' entries), next to the `client_calls`
// the point made.
ServerMetricsDelta DiffServerMetrics(const Scrape& before, const Scrape& after,
                                     const std::string& rpc, int64_t client_calls);

// The table's line for a point: the server's count and stage means, and a warning when the
// server's count and the client's differ.
std::string FormatServerMetricsRow(const ServerMetricsDelta& d);

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_SERVER_METRICS_H_
