// Internal to the load generator (bench/hgemm_load.h): the operands of one shape in the forms
// the calls send (Payload), and the callers that make one worker's calls, one at a time: the
// service or the echo baseline, unary or on streams kept open for a whole point.
// Thread safety: a Caller belongs to one worker thread; Payloads are read-only once made.
#ifndef HGEMM_BENCH_LOAD_CALLERS_H_
#define HGEMM_BENCH_LOAD_CALLERS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/echo.grpc.pb.h"
#include "bench/load_options.h"
#include "bench/load_stats.h"
#include "client/gemm_client.h"
#include "proto/hgemm.grpc.pb.h"

namespace hgemm::bench::load_internal {

// The operands of one shape, in the message forms the callers send.
struct Payload {
  Shape shape;
  v1::GemmRequest gemm;  // m, n, k, a, b, options: all bytes (also the Verify reference)
  EchoRequest echo;      // payload = the operand bytes the service calls send, reply_bytes = C's
};

// Makes one call at a time for one worker: fills a Sample's code and server timing.
class Caller {
 public:
  // Releases the kept Cs still held.
  virtual ~Caller();
  // One GEMM: `request` is what goes on the wire (bytes or handles), `p` its shape and echo form.
  virtual void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) = 0;
  // After a successful service call: C (unless kept; in shared memory, a view of it there,
  // valid until the next call) and where it ran.
  virtual std::string_view reply() const { return reply_; }
  const v1::Execution& execution() const { return execution_; }
  const std::string& error() const { return error_; }
  // The handle of the last call's kept C (keep_c_resident), until the next kept C replaces it.
  const std::string& kept_c() const { return kept_c_; }
  // Between calls, outside the measured latency: releases the kept C that the last call's
  // replaced (a ring of one per worker: at most two kept Cs per worker exist at any time).
  void Tidy() { Release(&previous_c_); }

 protected:
  void SetError(int code, const std::string& message, Sample* s);
  void SetStatus(const grpc::Status& status, Sample* s);
  // C's bytes when it comes back; none (and a kept C of m×n) when keep_c_resident.
  void CheckSize(const Payload& p, const v1::GemmRequest& r, size_t got, Sample* s);
  void CheckKept(const Payload& p, const v1::GemmRequest& r, const v1::MatrixInfo& c, Sample* s);
  // Service callers: where kept Cs are released, as client `client_id`.
  void EnableRelease(const GemmClient& client, const std::string& client_id, double timeout_s);

  std::string reply_;
  v1::Execution execution_;
  std::string error_;

 private:
  void Release(std::string* handle);

  std::unique_ptr<GemmClient> releaser_;
  CallOptions release_options_;
  std::string kept_c_, previous_c_;
};

// The caller of `kind` in options.mode over `client` (which balances over one channel of the
// target, ChannelTo(""), and routes to replicas); stream callers keep their streams open until
// `stream_deadline`. Transport::kShm (kService, unary): C goes into a region of the caller's
// own, registered here for the caller's life (the requests name A and B in theirs);
// `shapes` sizes it. Transport::kRing: the same, through a submission ring of the caller's
// own (RingClient), attached for its life with A's and B's region and C's as slots, and a
// resident B's handle as a matrix slot.
std::unique_ptr<Caller> MakeCaller(Target kind, const LoadOptions& options,
                                   const GemmClient& client,
                                   std::chrono::system_clock::time_point stream_deadline,
                                   Transport transport = Transport::kGrpc);

}  // namespace hgemm::bench::load_internal

#endif  // HGEMM_BENCH_LOAD_CALLERS_H_
