// What a load point measured: one Sample per completed call, and their statistics per shape
// (PointStats) within a point's result (PointResult).
// Thread safety: plain values and pure functions.
#ifndef HGEMM_BENCH_LOAD_STATS_H_
#define HGEMM_BENCH_LOAD_STATS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/load_options.h"
#include "bench/server_metrics.h"

namespace hgemm::bench {

constexpr int kWrongReplySize = -1;  // a "status code" for a reply whose C has the wrong size

// One completed call.
struct Sample {
  double end_s = 0;       // since the point started
  double latency_ms = 0;  // send (or scheduled send) → reply complete
  int shape = 0;
  int code = 0;  // 0: OK; a gRPC status code; kWrongReplySize
  double queue_ms = 0, h2d_ms = 0, kernel_ms = 0, d2h_ms = 0, total_ms = 0;
  double verify_ms = 0;  // the server's Freivalds check (GemmOptions.verify)
  // GEMMs of the launch that ran it (Execution.batch_size: batched with others against the
  // same resident B); 0 when the server said none (a ring's completion, an older server).
  int batch_size = 0;
};

// Means of the server-reported timing of successful calls, in milliseconds.
struct ServerBreakdown {
  int64_t count = 0;
  double queue_ms = 0, h2d_ms = 0, kernel_ms = 0, d2h_ms = 0, total_ms = 0;
  double verify_ms = 0;
  double batch_size = 0;  // mean GEMMs per launch, as the calls saw it (1: none batched)
};

// The measured windows of one point, for all shapes together or for one shape of the mix.
struct PointStats {
  std::string shape;          // "256x256x256", or "mix" for all shapes of a mix together
  int64_t requests = 0;       // successful calls
  int64_t errors = 0;         // failed calls (any status but OK, or a C of the wrong size)
  double seconds = 0;         // length of the measured windows
  double requests_per_s = 0;  // successful calls / seconds
  double gflops = 0;          // 2·m·n·k of successful calls / seconds / 1e9 (0 for the echo)
  // Operand bytes sent and received (A + B + C less the resident ones) of successful calls /
  // seconds / 1e9; 0 when everything is resident.
  double payload_gb_per_s = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0;
  ServerBreakdown server;  // all zeros for the echo target
};

struct PointResult {
  Target target = Target::kService;
  Transport transport = Transport::kGrpc;  // of a service point
  Mode mode = Mode::kUnary;
  int parallel_parts = 1;  // LoadOptions::parallel_parts of the point
  Resident resident = Resident::kNone;
  int concurrency = 0;
  double rate_per_s = 0;
  std::string shapes;    // the mix: "256x256x256", or "64x64x64:3,128x96x160"
  int windows = 0;       // measurement windows run
  bool stable = false;   // the last stable_windows windows agreed; stats are over them
  double elapsed_s = 0;  // warm-up + windows
  int64_t warmup_requests = 0;
  int64_t calls = 0;  // every call of the point (warm-up, windows, the last ones), any outcome
  std::vector<double> window_requests_per_s;  // each window's successful calls/s, in order
  // This process's CPU time (user + system, all threads) over the windows the stats cover:
  // the client's own cost (stats[0].requests calls), without the warm-up or --verify.
  double client_cpu_s = 0;
  std::map<int, int64_t> error_codes;  // gRPC code (-1: wrong C size) → count, whole point
  std::string first_error;
  double upload_s = 0;  // uploading the resident operands before the warm-up (not measured)
  // The replicas holding them (distinct, sorted); none for a server without --advertise_address.
  std::vector<std::string> upload_replicas;
  std::vector<PointStats> stats;  // [0]: all shapes; then one per shape if the mix has > 1
  // The server's /metrics around the point (hgemm_load --metrics_url), when read.
  std::optional<ServerMetricsDelta> server_metrics;
};

// Statistics of the successful samples among `samples` (of one shape, or all if shape < 0)
// over `seconds` of measurement. The server breakdown only for `kind` kService (the echo
// reports no timing).
PointStats Summarize(const std::vector<Sample>& samples, int shape, double seconds,
                     const std::vector<Shape>& shapes, Target kind, Resident resident);

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_LOAD_STATS_H_
