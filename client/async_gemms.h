// AsyncGemms: the GEMMs a client started without waiting (GemmClient::GemmAsync), counted so that
// whoever owns the client can wait for them all before it goes away (gRPC may still run their
// completions on its threads until then). The C ABI's hgemm_gemm_async and
// hgemm_gemm_keep_c_async.
//
// Thread safety: Start and WaitIdle may be called from any thread at once.
#ifndef HGEMM_CLIENT_ASYNC_GEMMS_H_
#define HGEMM_CLIENT_ASYNC_GEMMS_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "client/gemm_client.h"
#include "client/gemm_into.h"
#include "proto/hgemm.pb.h"

namespace hgemm {

class AsyncGemms {
 public:
  // A started GEMM's outcome: its status and response as GemmAsync's (C is in c_into), and
  // whether it went on a GemmStream.
  using Done = std::function<void(const grpc::Status&, const v1::GemmResponse&, bool streamed)>;

  // Starts one GEMM as GemmAsync on `client`: on a one-GEMM GemmStream for Mode::kStream, or for
  // kAuto when GemmClient::ShouldStream says so, else unary (no parallel parts). A GEMM with
  // keep_c_resident whose answer names no kept C fails INTERNAL. `done` runs exactly once (as
  // GemmAsync's) and the GEMM counts as running until it has been destroyed.
  // REQUIRES: GemmAsync's; this object outlives the GEMM (WaitIdle).
  void Start(const GemmClient& client, v1::GemmRequest request, OperandBytes operands,
             CBuffer c_into, GemmInto::Mode mode, const CallOptions& options,
             std::shared_ptr<grpc::ClientContext> context, Done done);

  // Returns once no GEMM started here is running.
  void WaitIdle();

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t running_ = 0;  // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_ASYNC_GEMMS_H_
