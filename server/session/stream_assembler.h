// StreamAssembler: follows the GEMMs of one GemmStream call through their messages (each
// converted by the transport into a StreamMessage) and enforces the stream's order rules (see
// MatrixChunk in proto/hgemm.proto). It holds no operand bytes: each chunk comes back out,
// checked and with its place in the operand, for the caller to copy where the operand will
// live (the device) while later chunks are still arriving.
// Thread safety: none; one per stream, fed by the stream's (serialised) read path.
#ifndef HGEMM_SERVER_SESSION_STREAM_ASSEMBLER_H_
#define HGEMM_SERVER_SESSION_STREAM_ASSEMBLER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <absl/status/status.h>

#include "server/session/gemm_spec.h"
#include "server/session/validation.h"

namespace hgemm {

// Which operand a chunk holds (the wire's Operand); kUnknown for any other value.
enum class ChunkOperand { kUnknown, kA, kB, kCIn };

// One GemmStream message as read, unchecked: a GEMM's header or a chunk of one of its operands.
struct StreamMessage {
  struct Header {
    uint64_t gemm_id = 0;
    GemmSpec spec;  // its operands arrive in chunks unless resident; fields named "header.*"
  };
  struct Chunk {
    uint64_t gemm_id = 0;
    ChunkOperand operand = ChunkOperand::kUnknown;
    uint64_t offset = 0;  // as sent
    std::string data;     // the wire's bytes, moved here, never copied
  };
  // monostate: a message that holds neither (it breaks the order rules).
  std::variant<std::monostate, Header, Chunk> content;
};

// A GEMM announced by a header.
struct AnnouncedGemm {
  uint64_t gemm_id = 0;
  // Not OK: the header was refused (bad values, over the stream's pending bytes). Answer the
  // GEMM with this at once; the assembler drops the chunks the client still sends for it.
  absl::Status refused;
  // Validated unless refused (then only its job's request id may be set). The job's buffer
  // pointers are not set; operands arrive in chunks (OperandSource::kArriving) or are resident
  // (resolved by the caller); C goes to the host or stays resident.
  GemmOrder order;

  bool keep_c() const { return order.c.kind == ResultSink::Kind::kKeepResident; }
  // Bytes of A, B and C_in that come as chunks (0 for those given by handle, and for C_in
  // without beta).
  int64_t ChunkedABytes() const { return Chunked(order.a) ? order.job.shape.ABytes() : 0; }
  int64_t ChunkedBBytes() const { return Chunked(order.b) ? order.job.shape.BBytes() : 0; }
  int64_t ChunkedCInBytes() const { return Chunked(order.c_in) ? order.job.shape.CInBytes() : 0; }
  int64_t ChunkedBytes() const { return ChunkedABytes() + ChunkedBBytes() + ChunkedCInBytes(); }

 private:
  static bool Chunked(const OperandSource& source) {
    return source.kind == OperandSource::Kind::kArriving;
  }
};

// Bytes of one operand, in order: `data` belongs at byte `offset` of the operand.
struct OperandChunk {
  uint64_t gemm_id = 0;
  ChunkOperand operand = ChunkOperand::kUnknown;
  int64_t offset = 0;
  std::string data;
  bool last = false;  // the GEMM's operands have all arrived with this chunk
};

// What one message was: a header or a chunk.
struct StreamEvent {
  std::unique_ptr<AnnouncedGemm> header;
  std::unique_ptr<OperandChunk> chunk;
};

class StreamAssembler {
 public:
  // `max_pending_bytes` bounds the operand bytes of this stream's incomplete GEMMs.
  StreamAssembler(const RequestRules& rules, int64_t max_pending_bytes);

  // Consumes one message (its chunk data is moved into the event; a chunk of a refused GEMM
  // yields no event). Returns INVALID_ARGUMENT on a broken order rule (see MatrixChunk in the
  // .proto: a chunk out of order or for an unknown gemm_id, a gemm_id already in flight); then
  // the stream must end. A problem of one GEMM alone is not a broken rule: it comes back as a
  // header event with `refused` set.
  absl::Status Consume(StreamMessage& message, StreamEvent* event);

  // The caller refuses the announced GEMM `gemm_id` (e.g. an unknown handle) and answers it at
  // once: its pending bytes are freed and its remaining chunks will be dropped.
  void Refuse(uint64_t gemm_id);

  // The caller is done with `gemm_id` (answered): the id may be used again.
  void Release(uint64_t gemm_id);

  // GEMMs whose header arrived but not all of their operands.
  std::vector<uint64_t> Incomplete() const;

 private:
  // The chunked bytes of a GEMM's operands (0 for one by handle or absent) and how many of
  // each have arrived.
  struct Pending {
    int64_t a_bytes = 0, b_bytes = 0, c_bytes = 0;
    int64_t a_received = 0, b_received = 0, c_received = 0;
    int64_t Bytes() const { return a_bytes + b_bytes + c_bytes; }
  };

  // Refused GEMMs whose chunks are dropped; the oldest are forgotten past this many (their
  // late chunks then break the order rules), so a client can't grow the set without bound.
  static constexpr size_t kMaxDroppedIds = 4096;

  absl::Status ConsumeHeader(const StreamMessage::Header& header, StreamEvent* event);
  absl::Status ConsumeChunk(StreamMessage::Chunk& chunk, StreamEvent* event);
  // Refuses the header's GEMM with `why`.
  void RefuseHeader(std::unique_ptr<AnnouncedGemm> gemm, absl::Status why, StreamEvent* event);
  void DropChunksOf(uint64_t gemm_id);

  const RequestRules& rules_;
  const int64_t max_pending_bytes_;
  int64_t pending_bytes_ = 0;
  std::map<uint64_t, Pending> pending_;
  std::set<uint64_t> in_use_;           // pending or handed out and not yet released
  std::set<uint64_t> dropped_;          // refused: their chunks are dropped until the id is reused
  std::deque<uint64_t> dropped_order_;  // dropped_, oldest first
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_STREAM_ASSEMBLER_H_
