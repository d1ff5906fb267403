// GemmStream messages for the session tests, as the transport hands them to a StreamSession
// (server/transport/convert.h, ToStreamMessage): a header and a chunk. Test-only.
#ifndef HGEMM_SERVER_TESTING_STREAM_MESSAGES_H_
#define HGEMM_SERVER_TESTING_STREAM_MESSAGES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "server/session/stream_assembler.h"

namespace hgemm {

// A header announcing GEMM `id` of m×n×k, its operands in chunks (A resident when `a_handle`
// is set).
inline StreamMessage StreamHeader(uint64_t id, uint32_t m, uint32_t n, uint32_t k,
                                  const std::string& a_handle = "") {
  GemmSpec spec{
      .field_prefix = "header.",
      .m = m,
      .n = n,
      .k = k,
      .a = a_handle.empty() ? OperandSource::Arriving() : OperandSource::Resident(a_handle),
      .b = OperandSource::Arriving(),
      .c_in = OperandSource::Arriving()};
  return {StreamMessage::Header{id, std::move(spec)}};
}

// The header of `message`, to change. REQUIRES: `message` is a header.
inline StreamMessage::Header& HeaderOf(StreamMessage& message) {
  return std::get<StreamMessage::Header>(message.content);
}

// A chunk: `data` at byte `offset` of `operand` of GEMM `id`.
inline StreamMessage StreamChunk(uint64_t id, ChunkOperand operand, uint64_t offset,
                                 std::string data) {
  return {StreamMessage::Chunk{id, operand, offset, std::move(data)}};
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_STREAM_MESSAGES_H_
