// LoadGenerator: the core of hgemm_load. Drives an hgemm.v1.GemmService, or the EchoService
// transport baseline (bench/echo.proto) with the same payload sizes, from a number of worker
// threads, and measures what a client sees: latency percentiles, requests/s, GFLOP/s and payload
// bytes/s (A + B + C), next to the server's own timing (queue, H2D, kernel, D2H).
//
// A sweep point runs `concurrency` workers. Closed loop (rate 0): each worker has one call in
// flight and sends the next as soon as one returns. Open loop (rate > 0): calls are scheduled at
// fixed intervals over all workers, `concurrency` caps the calls in flight, and latency runs from
// the scheduled send time (a late send counts against the server, no coordinated omission).
// A point is a warm-up (results dropped), then measurement windows until `stable_windows`
// consecutive windows agree within `stable_tolerance` on requests/s and p50 latency, or until
// `max_windows` or `max_point_s`, so a point always ends.
//
// Operands are random fp16 in [-1, 1), generated once per shape and reused by every call.
// Resident operands (LoadOptions::resident): before a service point's warm-up, B (or A and B) of
// each shape is uploaded once (UploadMatrix, shared by all workers) and calls name it by handle;
// with kAll, C stays on the server too (keep_c_resident) and each worker releases its previous
// kept C after the next reply, outside the measured latency. The uploads are released when the
// point ends. All calls carry LoadOptions::client_id as "x-client-id" (the owner of handles).
// Over several replicas (a multi-address target or a DNS name: see client/gemm_client.h), calls
// naming no handle are balanced; a shape's resident operands live on one replica (A where its
// first upload went, B with it; so different shapes may land on different replicas), and its
// calls go there: the unary callers through GemmClient, the stream callers on one stream per
// replica.
// Thread safety: one thread uses a LoadGenerator at a time; RunPoint starts and joins its own
// worker threads.
#ifndef HGEMM_BENCH_HGEMM_LOAD_H_
#define HGEMM_BENCH_HGEMM_LOAD_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/echo.grpc.pb.h"
#include "bench/server_metrics.h"
#include "client/gemm_client.h"
#include "proto/hgemm.grpc.pb.h"

namespace hgemm {
class GemmClient;
}  // namespace hgemm

namespace hgemm::bench {

namespace load_internal {
struct Payload;  // the operands of one shape, in the forms the callers send
class Caller;    // one worker's calls of one kind (service or echo, unary or stream)
}  // namespace load_internal

// One GEMM shape of the mix; `weight` is its share of the calls.
struct Shape {
  uint32_t m = 0, n = 0, k = 0;
  int weight = 1;

  int64_t ABytes() const { return 2 * int64_t(m) * k; }
  int64_t BBytes() const { return 2 * int64_t(k) * n; }
  int64_t RequestBytes() const { return ABytes() + BBytes(); }  // A + B
  int64_t ReplyBytes() const { return 2 * int64_t(m) * n; }     // C
  int64_t PayloadBytes() const { return RequestBytes() + ReplyBytes(); }
  double Flops() const { return 2.0 * m * n * k; }
  std::string Name() const;  // "256x256x256"
};

// Parses "256x256x256,2048x2048x2048:3" (MxNxK, optional ":weight", default 1).
// Returns "" or what is wrong.
std::string ParseShapes(const std::string& text, std::vector<Shape>* shapes);
// Parses "1,2,4" into positive numbers. Returns "" or what is wrong.
std::string ParseIntList(const std::string& text, std::vector<int>* values);
std::string ParseDoubleList(const std::string& text, std::vector<double>* values);

enum class Mode { kUnary, kStream };
enum class Target { kService, kEcho };
// Which operands live on the server: none (A and B sent, C returned), B (A sent, C returned),
// all (A and B by handle, C kept on the server: only handles cross the wire).
enum class Resident { kNone, kB, kAll };
const char* ModeName(Mode mode);
const char* TargetName(Target target);
const char* ResidentName(Resident resident);  // "none", "b", "all"
// Parses "none", "b" or "all". Returns false for anything else.
bool ParseResident(const std::string& text, Resident* resident);

// Operand bytes that actually cross the wire per GEMM with `resident` (handles not counted).
int64_t SentBytes(const Shape& shape, Resident resident);      // A + B, A, or 0
int64_t ReceivedBytes(const Shape& shape, Resident resident);  // C, C, or 0

struct LoadOptions {
  std::vector<Shape> shapes;
  // unary: one Gemm (Echo) call per GEMM. stream: one GemmStream (EchoStream) per worker, kept
  // open for the whole point, one GEMM in flight on it at a time.
  Mode mode = Mode::kUnary;
  std::string kernel = "auto";
  v1::Accumulation accumulation = v1::ACCUMULATION_UNSPECIFIED;
  // Workers per gRPC channel (each channel is its own TCP connection); 0: one channel for all.
  int workers_per_channel = 1;
  // Warm-up: at least this long and until every worker has completed a call.
  double warmup_s = 1.0;
  // A window lasts at least window_s and until it holds min_window_requests completions.
  double window_s = 1.0;
  int min_window_requests = 10;
  int stable_windows = 3;
  double stable_tolerance = 0.10;  // each window within ±10 % of the windows' mean
  int max_windows = 10;
  // Hard bound on one point (warm-up + windows); in-flight calls still finish after it.
  double max_point_s = 30;
  // Deadline of one call (unary) or of a point's streams on top of max_point_s.
  double call_timeout_s = 120;
  // Operand chunk size of stream mode (both targets).
  int64_t chunk_bytes = int64_t{1} << 20;
  // Reply chunk size the echo stream uses: set it to the server's stream_chunk_bytes.
  int64_t reply_chunk_bytes = int64_t{1} << 20;
  uint64_t seed = 20261203;
  // Resident operands (service target; the echo baseline then carries only the bytes the
  // service calls send and receive).
  Resident resident = Resident::kNone;
  // "x-client-id" of every service call (owner of the uploaded matrices when the server has no
  // authentication); "" → "hgemm_load-<pid>".
  std::string client_id;
  // TLS and token of the service's channels (the echo baseline is always plaintext).
  ConnectOptions connect;
};

// Means of the server-reported timing of successful calls, in milliseconds.
struct ServerBreakdown {
  int64_t count = 0;
  double queue_ms = 0, h2d_ms = 0, kernel_ms = 0, d2h_ms = 0, total_ms = 0;
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
  ServerBreakdown server;     // all zeros for the echo target
};

struct PointResult {
  Target target = Target::kService;
  Mode mode = Mode::kUnary;
  Resident resident = Resident::kNone;
  int concurrency = 0;
  double rate_per_s = 0;
  std::string shapes;   // the mix: "256x256x256", or "64x64x64:3,128x96x160"
  int windows = 0;      // measurement windows run
  bool stable = false;  // the last stable_windows windows agreed; stats are over them
  double elapsed_s = 0; // warm-up + windows
  int64_t warmup_requests = 0;
  int64_t calls = 0;  // every call of the point (warm-up, windows, the last ones), any outcome
  std::vector<double> window_requests_per_s;  // each window's successful calls/s, in order
  std::map<int, int64_t> error_codes;  // gRPC code (-1: wrong C size) → count, whole point
  std::string first_error;
  double upload_s = 0;  // uploading the resident operands before the warm-up (not measured)
  // The replicas holding them (distinct, sorted); none for a server without --advertise_address.
  std::vector<std::string> upload_replicas;
  std::vector<PointStats> stats;  // [0]: all shapes; then one per shape if the mix has > 1
  // The server's /metrics around the point (hgemm_load --metrics_url), when read.
  std::optional<ServerMetricsDelta> server_metrics;
};

struct VerifyResult {
  int checked = 0;
  int failed = 0;
  double max_error = 0;
  std::vector<std::string> lines;  // one per call: shape, kernel, device, error
};

// Percentile (0 < p ≤ 100) by nearest rank. REQUIRES: `sorted` ascending, non-empty.
double Percentile(const std::vector<double>& sorted, double p);

class LoadGenerator {
 public:
  // Generates the operands of every shape. REQUIRES: !options.shapes.empty().
  explicit LoadGenerator(LoadOptions options);
  ~LoadGenerator();

  const LoadOptions& options() const { return options_; }

  // A channel to `target` made by hgemm::Connect with `connect` (TLS, token) and its own TCP
  // connection (a local subchannel pool), for both targets alike.
  static std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                                    ConnectOptions connect = {});

  // Sends `per_shape` GEMMs of each shape to the service at `target` in options().mode and
  // compares C with ReferenceGemm: all of C when m·n·k ≤ 2^27, else 16 random rows. The
  // tolerance is 1e-3 (fp32 accumulation) or 2e-2 (fp16), as in hgemm_client --check.
  // Resident modes upload the operands as RunPoint does; with kAll the kept C is downloaded
  // (DownloadMatrix) for the check. Everything uploaded or kept is released again.
  VerifyResult Verify(const std::string& target, int per_shape);

  // One point of a sweep against `target` (an hgemm server for kService, an echo server for
  // kEcho): `concurrency` workers, closed loop (rate_per_s 0) or open loop at rate_per_s calls/s
  // over all workers.
  PointResult RunPoint(Target kind, const std::string& target, int concurrency,
                       double rate_per_s = 0);

 private:
  using Payload = load_internal::Payload;
  using Caller = load_internal::Caller;
  class Recorder;
  // `client` balances over one channel of the target (ChannelTo("")) and routes to replicas.
  std::unique_ptr<Caller> MakeCaller(Target kind, const GemmClient& client,
                                     std::chrono::system_clock::time_point stream_deadline) const;
  // The request each shape's calls send (*requests, one per shape): the payload's own (bytes),
  // or one in *owned naming operands by handle: uploaded now for the service target (`uploaded`
  // collects them for ReleaseUploads), placeholders for the echo (which sends what remains).
  // Returns "" or what failed (and the gRPC code in *code).
  std::string PrepareRequests(Target kind, const GemmClient& client,
                              std::vector<const v1::GemmRequest*>* requests,
                              std::vector<std::unique_ptr<v1::GemmRequest>>* owned,
                              std::vector<std::string>* uploaded, int* code) const;
  void ReleaseUploads(const GemmClient& client, const std::vector<std::string>& handles) const;
  // A client over MakeChannel(target).
  static GemmClient MakeClient(const std::string& target, ConnectOptions connect = {});

  LoadOptions options_;  // client_id filled in
  std::vector<std::unique_ptr<Payload>> payloads_;  // one per shape
};

// The readable table: a header, and rows for a point (with `echo`, the same point of the
// baseline, for the service row's "vs echo" column; may be null).
std::string FormatTableHeader();
std::string FormatTableRows(const PointResult& point, const PointResult* echo);

// CSV with the same columns (and the server_metrics of a point on its first row, when read);
// `device` and `backend` name where the service ran.
void WriteCsvHeader(std::ostream& out);
void WriteCsvRows(std::ostream& out, const PointResult& point, const PointResult* echo,
                  const std::string& device, const std::string& backend);

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_HGEMM_LOAD_H_
