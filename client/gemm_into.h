// GemmInto: one GEMM whose C comes back into the caller's buffer (or stays on the server, or
// goes into a region), sent the way its size calls for; prepared once, then tried as often as a
// retry policy says (RetriedCall). The C ABI's hgemm_gemm and hgemm_gemm_keep_c.
//
// Mode::kAuto sends the largest payloads as parallel parts (GemmClient::ShouldSendParts, through
// Run), those above the unary limit on a one-GEMM GemmStream (ShouldStream), the rest as one
// unary call; kUnary and kStream force theirs. A GEMM naming a region always goes unary (only
// Gemm calls take regions). Where C comes back:
//   - unary: A and B leave from the caller's memory and C lands in c_into, with no copy
//     through the request or the response (GemmInPlace);
//   - stream: A and B are copied once into the request (its chunks are cut from it), C's chunks
//     land in c_into as they arrive;
//   - parts, or a unary call whose C goes to a region: A and B are copied once into the
//     request; C (parts) is copied once out of the response.
//
// Thread safety: Try may be called from several threads at once (it changes nothing).
#ifndef HGEMM_CLIENT_GEMM_INTO_H_
#define HGEMM_CLIENT_GEMM_INTO_H_

#include <grpcpp/grpcpp.h>

#include "client/gemm_client.h"
#include "proto/hgemm.pb.h"

namespace hgemm {

class GemmInto {
 public:
  enum class Mode { kAuto, kUnary, kStream };

  // `request` without the operands `operands` names (request.a and request.b unset for them);
  // `options` decides the route (unary limit, parallel parts). REQUIRES: `client`, the memory
  // `operands` and `c_into` name outlive this object and its tries; c_into holds
  // GemmClient::ResultBytes(request) bytes unless C stays on the server or goes to a region.
  GemmInto(const GemmClient& client, v1::GemmRequest request, OperandBytes operands, CBuffer c_into,
           Mode mode, const CallOptions& options);

  // One try with `options` (its timeout the try's deadline). OK: C is in c_into (or kept, or
  // in its region) and *response holds the rest (timing, execution, c_matrix; c empty). The
  // GEMM's status otherwise; INTERNAL when the server's C is not ResultBytes(request) bytes or
  // does not fit c_into (nothing written past it).
  grpc::Status Try(const CallOptions& options, v1::GemmResponse* response) const;

  // Whether it goes on a GemmStream.
  bool streamed() const { return route_ == Route::kStream; }
  // Whether a try may be repeated after any UNAVAILABLE (ShouldRetry): not when C_in is read
  // from the region C overwrites.
  bool idempotent() const;

 private:
  enum class Route { kInPlace, kUnary, kStream, kParts };

  const GemmClient& client_;
  v1::GemmRequest request_;
  OperandBytes operands_;  // the in-place route's; the others carry them in request_
  const CBuffer c_into_;
  Route route_;
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_GEMM_INTO_H_
