#include "server/session/stream_assembler.h"

#include <fmt/format.h>

#include "server/core/status.h"

namespace hgemm {

StreamAssembler::StreamAssembler(const RequestRules& rules, int64_t max_pending_bytes)
    : rules_(rules), max_pending_bytes_(max_pending_bytes) {}

absl::Status StreamAssembler::Consume(StreamMessage& message, StreamEvent* event) {
  *event = StreamEvent{};
  if (const auto* header = std::get_if<StreamMessage::Header>(&message.content)) {
    return ConsumeHeader(*header, event);
  }
  if (auto* chunk = std::get_if<StreamMessage::Chunk>(&message.content)) {
    return ConsumeChunk(*chunk, event);
  }
  return status::InvalidArgument("message", "neither a header nor a chunk");
}

absl::Status StreamAssembler::ConsumeHeader(const StreamMessage::Header& header,
                                            StreamEvent* event) {
  const uint64_t id = header.gemm_id;
  if (in_use_.count(id)) {
    return status::InvalidArgument("header.gemm_id",
                                   fmt::format("{} is already in flight on this stream", id));
  }
  dropped_.erase(id);  // a new GEMM takes the id: chunks from here on are its own
  in_use_.insert(id);
  auto gemm = std::make_unique<AnnouncedGemm>();
  gemm->gemm_id = id;
  absl::Status s = ValidateGemm(header.spec, rules_, &gemm->order);
  if (!s.ok()) {
    RefuseHeader(std::move(gemm), status::WithContext(fmt::format("gemm_id {}", id), s), event);
    return absl::OkStatus();
  }
  const int64_t chunked_bytes = gemm->ChunkedBytes();
  if (pending_bytes_ + chunked_bytes > max_pending_bytes_) {
    RefuseHeader(
        std::move(gemm),
        status::OverLimit(
            "max_stream_pending_bytes",
            fmt::format("gemm_id {}: its operands ({} bytes) would put this stream's incomplete "
                        "GEMMs over {} bytes (--max_stream_pending_bytes)",
                        id, chunked_bytes, max_pending_bytes_)),
        event);
    return absl::OkStatus();
  }
  if (chunked_bytes > 0) {
    pending_bytes_ += chunked_bytes;
    pending_[id] = Pending{.a_bytes = gemm->ChunkedABytes(),
                           .b_bytes = gemm->ChunkedBBytes(),
                           .c_bytes = gemm->ChunkedCInBytes()};
  }
  event->header = std::move(gemm);
  return absl::OkStatus();
}

void StreamAssembler::RefuseHeader(std::unique_ptr<AnnouncedGemm> gemm, absl::Status why,
                                   StreamEvent* event) {
  gemm->refused = std::move(why);
  DropChunksOf(gemm->gemm_id);
  event->header = std::move(gemm);
}

void StreamAssembler::Refuse(uint64_t gemm_id) {
  if (auto it = pending_.find(gemm_id); it != pending_.end()) {
    pending_bytes_ -= it->second.Bytes();
    pending_.erase(it);
  }
  DropChunksOf(gemm_id);
}

void StreamAssembler::DropChunksOf(uint64_t gemm_id) {
  if (!dropped_.insert(gemm_id).second) return;
  dropped_order_.push_back(gemm_id);
  if (dropped_order_.size() > kMaxDroppedIds) {
    dropped_.erase(dropped_order_.front());
    dropped_order_.pop_front();
  }
}

absl::Status StreamAssembler::ConsumeChunk(StreamMessage::Chunk& chunk, StreamEvent* event) {
  const uint64_t id = chunk.gemm_id;
  auto it = pending_.find(id);
  if (it == pending_.end() && dropped_.count(id)) return absl::OkStatus();  // refused: dropped
  if (it == pending_.end()) {
    return status::InvalidArgument(
        "chunk.gemm_id",
        fmt::format("{} has no header on this stream (or is already complete)", id));
  }
  Pending& p = it->second;
  int64_t* received;
  int64_t total;
  const char* name;
  switch (chunk.operand) {
    case ChunkOperand::kA:
      if (p.a_bytes == 0) {
        return status::InvalidArgument(
            "chunk.operand", fmt::format("gemm_id {}: A chunk for an A given by handle", id));
      }
      received = &p.a_received, total = p.a_bytes, name = "A";
      break;
    case ChunkOperand::kB:
      if (p.a_received < p.a_bytes) {
        return status::InvalidArgument(
            "chunk.operand", fmt::format("gemm_id {}: B chunk before all of A ({} of {} bytes)", id,
                                         p.a_received, p.a_bytes));
      }
      if (p.b_bytes == 0) {
        return status::InvalidArgument(
            "chunk.operand", fmt::format("gemm_id {}: B chunk for a B given by handle", id));
      }
      received = &p.b_received, total = p.b_bytes, name = "B";
      break;
    case ChunkOperand::kCIn:
      if (p.a_received < p.a_bytes || p.b_received < p.b_bytes) {
        return status::InvalidArgument(
            "chunk.operand", fmt::format("gemm_id {}: C_in chunk before all of A and B", id));
      }
      if (p.c_bytes == 0) {
        return status::InvalidArgument(
            "chunk.operand",
            fmt::format("gemm_id {}: C_in chunk for a GEMM that reads none (beta 0, or "
                        "c_in_handle)",
                        id));
      }
      received = &p.c_received, total = p.c_bytes, name = "C_in";
      break;
    default:  // ChunkOperand::kUnknown
      return status::InvalidArgument(
          "chunk.operand",
          fmt::format("gemm_id {}: must be OPERAND_A, OPERAND_B or OPERAND_C", id));
  }
  const int64_t size = int64_t(chunk.data.size());
  if (size == 0) {
    return status::InvalidArgument("chunk.data", fmt::format("gemm_id {}: empty chunk", id));
  }
  if (int64_t(chunk.offset) != *received) {
    return status::InvalidArgument(
        "chunk.offset", fmt::format("gemm_id {}: {} chunk at offset {}, expected {} (chunks must "
                                    "be contiguous and in order)",
                                    id, name, chunk.offset, *received));
  }
  if (*received + size > total) {
    return status::InvalidArgument(
        "chunk.data",
        fmt::format("gemm_id {}: {} chunk ends at byte {}, past the operand's {} bytes", id, name,
                    *received + size, total));
  }
  auto out = std::make_unique<OperandChunk>();
  out->gemm_id = id;
  out->operand = chunk.operand;
  out->offset = *received;
  out->data = std::move(chunk.data);
  *received += size;
  if (p.a_received == p.a_bytes && p.b_received == p.b_bytes && p.c_received == p.c_bytes) {
    out->last = true;
    pending_bytes_ -= p.Bytes();
    pending_.erase(it);
  }
  event->chunk = std::move(out);
  return absl::OkStatus();
}

void StreamAssembler::Release(uint64_t gemm_id) { in_use_.erase(gemm_id); }

std::vector<uint64_t> StreamAssembler::Incomplete() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : pending_) ids.push_back(id);
  return ids;
}

}  // namespace hgemm
