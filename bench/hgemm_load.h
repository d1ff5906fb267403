// LoadGenerator: the core of hgemm_load (its driver; the options are in bench/load_options.h,
// the statistics in bench/load_stats.h, the callers in bench/load_callers.h and the table and
// CSV in bench/load_report.h). Drives an hgemm.v1.GemmService, or the EchoService
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
// Shared memory (Transport::kShm; a unix: target of a server with --allow_shared_memory, unary,
// resident operands none or B): before a point, A and B of every shape are copied once into one
// sealed memfd (client/shared_region.h), registered and named by every call; each worker
// registers a region of its own for C. Both are unregistered when the point ends. With
// Resident::kB, B is uploaded instead (as over gRPC, one upload per shape shared by all workers)
// and the region holds A only: the same-host form of the shared-B load that the server batches.
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
#include <memory>
#include <string>
#include <vector>

#include "bench/load_options.h"
#include "bench/load_stats.h"
#include "client/gemm_client.h"
#include "client/shared_region.h"
#include "proto/hgemm.grpc.pb.h"

namespace hgemm::bench {

namespace load_internal {
struct Payload;  // the operands of one shape, in the forms the callers send
class Caller;    // one worker's calls of one kind (service or echo, unary or stream)
}  // namespace load_internal

struct VerifyResult {
  int checked = 0;
  int failed = 0;
  double max_error = 0;
  std::vector<std::string> lines;  // one per call: shape, kernel, device, error
};

class LoadGenerator {
 public:
  // Generates the operands of every shape. REQUIRES: !options.shapes.empty().
  explicit LoadGenerator(LoadOptions options);
  ~LoadGenerator();

  const LoadOptions& options() const { return options_; }
  // The points from now on send their GEMMs as `parts` parallel parts (LoadOptions).
  void SetParallelParts(int parts) { options_.parallel_parts = parts; }

  // A channel to `target` made by hgemm::Connect with `connect` (TLS, token) and its own TCP
  // connection (a local subchannel pool), for both targets alike.
  static std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                                    ConnectOptions connect = {});

  // Sends `per_shape` GEMMs of each shape to the service at `target` in options().mode and
  // compares C with ReferenceGemm: all of C when m·n·k ≤ 2^27, else 16 random rows, within
  // kServiceTolerance (proto/numerics/error_stats.h) as in hgemm_client --check.
  // Resident modes upload the operands as RunPoint does; with kAll the kept C is downloaded
  // (DownloadMatrix) for the check. Everything uploaded or kept is released again.
  // Transport::kShm: through shared memory, as RunPoint.
  VerifyResult Verify(const std::string& target, int per_shape,
                      Transport transport = Transport::kGrpc);

  // One point of a sweep against `target` (an hgemm server for kService, an echo server for
  // kEcho): `concurrency` workers, closed loop (rate_per_s 0) or open loop at rate_per_s calls/s
  // over all workers.
  // Transport::kShm (kService only): through shared memory (above).
  PointResult RunPoint(Target kind, const std::string& target, int concurrency,
                       double rate_per_s = 0, Transport transport = Transport::kGrpc);

 private:
  using Payload = load_internal::Payload;
  using Caller = load_internal::Caller;
  class Recorder;
  // The request each shape's calls send (*requests, one per shape): the payload's own (bytes),
  // or one in *owned naming operands by handle: uploaded now for the service target (`uploaded`
  // collects them for ReleaseUploads), placeholders for the echo (which sends what remains).
  // Returns "" or what failed (and the gRPC code in *code).
  std::string PrepareRequests(Target kind, const GemmClient& client,
                              std::vector<const v1::GemmRequest*>* requests,
                              std::vector<std::unique_ptr<v1::GemmRequest>>* owned,
                              std::vector<std::string>* uploaded, int* code) const;
  void ReleaseUploads(const GemmClient& client, const std::vector<std::string>& handles) const;
  // Uploads one operand of `shape` (`which`: "A" or "B", rows×cols as stored) with `call`,
  // whose replica it then sets, so that the shape's other operand goes where this one lives.
  // Returns "" and the handle in *handle (also added to *uploaded), or what failed (and *code).
  std::string Upload(const GemmClient& client, const Shape& shape, const char* which, uint32_t rows,
                     uint32_t cols, const std::string& data, CallOptions* call,
                     std::vector<std::string>* uploaded, std::string* handle, int* code) const;
  // A and B of every shape in one region (Transport::kShm), registered while a point runs.
  struct SharedOperands {
    std::unique_ptr<SharedRegion> region;
    std::string handle;  // "" until registered
  };
  // The requests of Transport::kShm: each shape's A and B copied into shared->region,
  // registered, and named by {region, offset}; with Resident::kB, B uploaded instead (its
  // handle added to `uploaded`, for ReleaseUploads) and named by b_handle. Returns "" or what
  // failed (and *code).
  std::string PrepareSharedRequests(const GemmClient& client,
                                    std::vector<const v1::GemmRequest*>* requests,
                                    std::vector<std::unique_ptr<v1::GemmRequest>>* owned,
                                    SharedOperands* shared, std::vector<std::string>* uploaded,
                                    int* code) const;
  void ReleaseShared(const GemmClient& client, SharedOperands* shared) const;
  // A client over MakeChannel(target).
  static GemmClient MakeClient(const std::string& target, ConnectOptions connect = {});

  LoadOptions options_;                             // client_id filled in
  std::vector<std::unique_ptr<Payload>> payloads_;  // one per shape
};

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_HGEMM_LOAD_H_
