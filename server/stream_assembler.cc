#include "server/stream_assembler.h"

#include <fmt/format.h>

#include <cstring>

#include "server/status_util.h"

namespace hgemm {

StreamAssembler::StreamAssembler(const RequestRules& rules, int64_t max_pending_bytes)
    : rules_(rules), max_pending_bytes_(max_pending_bytes) {}

grpc::Status StreamAssembler::Consume(v1::GemmStreamRequest& message,
                                      std::unique_ptr<AssembledGemm>* complete) {
  complete->reset();
  switch (message.message_case()) {
    case v1::GemmStreamRequest::kHeader:
      return ConsumeHeader(message.header(), complete);
    case v1::GemmStreamRequest::kChunk:
      return ConsumeChunk(*message.mutable_chunk(), complete);
    default:
      return status::InvalidArgument("message", "neither a header nor a chunk");
  }
}

grpc::Status StreamAssembler::ConsumeHeader(const v1::GemmHeader& header,
                                            std::unique_ptr<AssembledGemm>* complete) {
  const uint64_t id = header.gemm_id();
  if (in_use_.count(id)) {
    return status::InvalidArgument(
        "header.gemm_id", fmt::format("{} is already in flight on this stream", id));
  }
  auto gemm = std::make_unique<AssembledGemm>();
  gemm->gemm_id = id;
  grpc::Status s = ValidateGemmHeader(header, rules_, &gemm->job);
  if (!s.ok()) {
    return grpc::Status(s.error_code(), fmt::format("gemm_id {}: {}", id, s.error_message()));
  }
  gemm->a_handle = header.a_handle();
  gemm->b_handle = header.b_handle();
  gemm->keep_c = header.keep_c_resident();
  gemm->c_ttl_seconds = header.c_ttl_seconds();
  const GemmShape& shape = gemm->job.shape;
  const int64_t operand_bytes = (gemm->a_handle.empty() ? 2 * shape.m * shape.k : 0) +
                                (gemm->b_handle.empty() ? 2 * shape.k * shape.n : 0);
  if (pending_bytes_ + operand_bytes > max_pending_bytes_) {
    return status::OverLimit(fmt::format(
        "gemm_id {}: its operands ({} bytes) would put this stream's incomplete GEMMs over {} bytes",
        id, operand_bytes, max_pending_bytes_));
  }
  in_use_.insert(id);
  if (operand_bytes == 0) {  // both operands resident: nothing to wait for
    *complete = std::move(gemm);
    return grpc::Status::OK;
  }
  pending_bytes_ += operand_bytes;
  Pending& p = pending_[id];
  // An operand given by handle counts as received.
  if (!gemm->a_handle.empty()) p.a_received = 2 * shape.m * shape.k;
  if (!gemm->b_handle.empty()) p.b_received = 2 * shape.k * shape.n;
  p.gemm = std::move(gemm);
  return grpc::Status::OK;
}

grpc::Status StreamAssembler::ConsumeChunk(v1::MatrixChunk& chunk,
                                           std::unique_ptr<AssembledGemm>* complete) {
  const uint64_t id = chunk.gemm_id();
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    return status::InvalidArgument(
        "chunk.gemm_id", fmt::format("{} has no header on this stream (or is already complete)", id));
  }
  Pending& p = it->second;
  AssembledGemm& gemm = *p.gemm;
  const GemmShape& shape = gemm.job.shape;
  const int64_t a_bytes = 2 * shape.m * shape.k, b_bytes = 2 * shape.k * shape.n;

  std::string* operand;
  int64_t* received;
  int64_t total;
  const char* name;
  switch (chunk.operand()) {
    case v1::OPERAND_A:
      if (!gemm.a_handle.empty()) {
        return status::InvalidArgument(
            "chunk.operand", fmt::format("gemm_id {}: A chunk for an A given by handle", id));
      }
      operand = &gemm.a, received = &p.a_received, total = a_bytes, name = "A";
      break;
    case v1::OPERAND_B:
      if (p.a_received < a_bytes) {
        return status::InvalidArgument(
            "chunk.operand", fmt::format("gemm_id {}: B chunk before all of A ({} of {} bytes)", id,
                                         p.a_received, a_bytes));
      }
      if (!gemm.b_handle.empty()) {
        return status::InvalidArgument(
            "chunk.operand", fmt::format("gemm_id {}: B chunk for a B given by handle", id));
      }
      operand = &gemm.b, received = &p.b_received, total = b_bytes, name = "B";
      break;
    default:
      return status::InvalidArgument("chunk.operand",
                                     fmt::format("gemm_id {}: must be OPERAND_A or OPERAND_B", id));
  }
  const std::string& data = chunk.data();
  const int64_t size = data.size();
  if (size == 0) {
    return status::InvalidArgument("chunk.data", fmt::format("gemm_id {}: empty chunk", id));
  }
  if (int64_t(chunk.offset()) != *received) {
    return status::InvalidArgument(
        "chunk.offset", fmt::format("gemm_id {}: {} chunk at offset {}, expected {} (chunks must "
                                    "be contiguous and in order)",
                                    id, name, chunk.offset(), *received));
  }
  if (*received + size > total) {
    return status::InvalidArgument(
        "chunk.data", fmt::format("gemm_id {}: {} chunk ends at byte {}, past the operand's {} bytes",
                                  id, name, *received + size, total));
  }
  if (*received == 0 && size == total) {
    *operand = std::move(*chunk.mutable_data());  // one chunk holds it all: no copy
  } else {
    if (*received == 0) operand->resize(total);
    std::memcpy(operand->data() + *received, data.data(), size);
  }
  *received += size;

  if (p.a_received == a_bytes && p.b_received == b_bytes) {
    pending_bytes_ -= int64_t(gemm.a.size() + gemm.b.size());
    *complete = std::move(p.gemm);
    pending_.erase(it);
  }
  return grpc::Status::OK;
}

void StreamAssembler::Release(uint64_t gemm_id) { in_use_.erase(gemm_id); }

std::vector<uint64_t> StreamAssembler::Incomplete() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : pending_) ids.push_back(id);
  return ids;
}

}  // namespace hgemm
