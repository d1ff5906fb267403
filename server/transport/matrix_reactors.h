// The reactors of UploadMatrix (a client-streaming upload of a resident matrix), UploadPart (one
// part of an upload by parts) and DownloadMatrix (a server-streaming read of one, or of a byte
// range), parts of GemmServiceImpl's transport. An
// upload's bookkeeping is its UploadSession's; the device work of both (allocating the matrix,
// reading it back) runs on upload threads, never in a reaction.
// Thread safety: gRPC and the service call in; each reactor serialises itself.
#ifndef HGEMM_SERVER_TRANSPORT_MATRIX_REACTORS_H_
#define HGEMM_SERVER_TRANSPORT_MATRIX_REACTORS_H_

#include <grpcpp/support/server_callback.h>

#include <string>

#include "proto/hgemm.grpc.pb.h"
#include "server/transport/call_services.h"

namespace hgemm {

// The reactor of an UploadMatrix call of `owner` (already identified), raw:
// UploadMatrixRequest messages in, a serialized MatrixInfo in `response`. It deletes itself
// when the call is done. REQUIRES: `services`' pointees outlive the call.
grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadMatrixReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner,
    grpc::ByteBuffer* response);

// The reactor of an UploadPart call of `owner` (already identified), raw: PartRequest messages
// in, a serialized PartResponse in `response`. It deletes itself when the call is done.
// REQUIRES: `services`' pointees outlive the call.
grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadPartReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner,
    grpc::ByteBuffer* response);

// The reactor of a DownloadMatrix call of `owner` (already identified). It deletes itself when
// the call is done. REQUIRES: `services`' pointees outlive the call.
grpc::ServerWriteReactor<v1::ResultChunk>* NewDownloadMatrixReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner,
    const v1::DownloadMatrixRequest& request);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_MATRIX_REACTORS_H_
