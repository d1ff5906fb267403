// LoneChunkOf: the upload fast path. A message that holds a chunk and nothing else (how every
// client sends a PartRequest or UploadMatrixRequest chunk: field 2's tag, its length, the bytes)
// is recognised in the message's received gRPC slices, and its bytes handed on as those slices
// (WireBytes), so that the upload queue copies them straight into the matrix: no protobuf
// string in between. Anything else (a header, unknown fields, a chunk field twice) is left to
// protobuf.
// Thread safety: stateless.
#ifndef HGEMM_SERVER_TRANSPORT_LONE_CHUNK_H_
#define HGEMM_SERVER_TRANSPORT_LONE_CHUNK_H_

#include <grpcpp/support/byte_buffer.h>

#include "server/core/wire_bytes.h"

namespace hgemm {

// The field number of the bytes LoneChunkOf finds: PartRequest.chunk, UploadMatrixRequest.chunk
// (each user checks its message's with a static_assert).
inline constexpr int kLoneChunkField = 2;

// True, with *chunk the payload (referencing `message`'s slices, which it keeps alive), when
// `message` is a serialized message of exactly one field, bytes field kLoneChunkField; false,
// and *chunk untouched, otherwise.
bool LoneChunkOf(const grpc::ByteBuffer& message, WireBytes* chunk);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_LONE_CHUNK_H_
