// PartChunkOf: the UploadPart fast path. A PartRequest that holds a chunk and nothing else (how
// every client sends one: field 2's tag, its length, the bytes) is recognised in the message's
// received gRPC slices, and its bytes handed on as those slices (WireBytes), so that the upload
// queue copies them straight into the matrix: no protobuf string in between (issue 27, fewer
// copies). Anything else (a header, unknown fields, a chunk field twice) is left to protobuf.
// Thread safety: stateless.
#ifndef HGEMM_SERVER_TRANSPORT_PART_CHUNK_H_
#define HGEMM_SERVER_TRANSPORT_PART_CHUNK_H_

#include <grpcpp/support/byte_buffer.h>

#include "server/core/wire_bytes.h"

namespace hgemm {

// True, with *chunk the payload (referencing `message`'s slices, which it keeps alive), when
// `message` is a serialized PartRequest of exactly one field, `chunk`; false, and *chunk
// untouched, otherwise.
bool PartChunkOf(const grpc::ByteBuffer& message, WireBytes* chunk);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_PART_CHUNK_H_
