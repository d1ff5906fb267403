// The reactor of one GemmStream call (the bidirectional stream of GEMMs; see GemmStreamRequest
// in proto/hgemm.proto), a part of GemmServiceImpl's transport over its StreamSession.
// Reads are sequential; each chunk is handed to the upload queue as it arrives, so operands
// reach the device while the rest of the stream is still on the wire; a GEMM is enqueued when
// its last chunk has been copied. Where the chunks go is allocated on an upload thread, never
// in a reaction. Completions arrive on scheduler threads; the write queue is drained one
// message at a time.
// Thread safety: gRPC and the service call in; the reactor serialises itself.
#ifndef HGEMM_SERVER_TRANSPORT_STREAM_REACTOR_H_
#define HGEMM_SERVER_TRANSPORT_STREAM_REACTOR_H_

#include <grpcpp/support/server_callback.h>

#include <string>

#include "proto/hgemm.grpc.pb.h"
#include "server/transport/call_services.h"

namespace hgemm {

// The reactor of a GemmStream call of `owner` (already identified). It deletes itself when
// the call is done. REQUIRES: `services`' pointees outlive the call.
grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>* NewGemmStreamReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_STREAM_REACTOR_H_
