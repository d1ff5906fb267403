// StreamAssembler: rebuilds whole GEMMs from the messages of one GemmStream call and enforces
// the stream's order rules (see MatrixChunk in proto/hgemm.proto).
// Thread safety: none; one per stream, fed by the stream's (serialised) read path.
#ifndef HGEMM_SERVER_STREAM_ASSEMBLER_H_
#define HGEMM_SERVER_STREAM_ASSEMBLER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>

#include "proto/hgemm.pb.h"
#include "server/validation.h"

namespace hgemm {

// A GEMM whose operands have all arrived. job's buffer pointers are not set yet.
struct AssembledGemm {
  uint64_t gemm_id = 0;
  GemmJob job;
  std::string a, b;  // fp16 bytes, exactly 2·m·k and 2·k·n; empty for an operand by handle
  std::string a_handle, b_handle;  // resident operands, resolved by the caller
  bool keep_c = false;
  uint32_t c_ttl_seconds = 0;
};

class StreamAssembler {
 public:
  // `max_pending_bytes` bounds the operand bytes of this stream's incomplete GEMMs.
  StreamAssembler(const RequestRules& rules, int64_t max_pending_bytes);

  // Consumes one message (its chunk data may be moved out). Returns INVALID_ARGUMENT or
  // RESOURCE_EXHAUSTED on a broken rule; then the stream must end. On OK, `complete` is set
  // when this message finished a GEMM (a header whose operands are both handles does), and
  // left empty otherwise.
  grpc::Status Consume(v1::GemmStreamRequest& message, std::unique_ptr<AssembledGemm>* complete);

  // The caller is done with `gemm_id` (answered): the id may be used again.
  void Release(uint64_t gemm_id);

  // GEMMs whose header arrived but not all of their operands.
  std::vector<uint64_t> Incomplete() const;

 private:
  struct Pending {
    std::unique_ptr<AssembledGemm> gemm;
    int64_t a_received = 0;
    int64_t b_received = 0;
  };

  grpc::Status ConsumeHeader(const v1::GemmHeader& header, std::unique_ptr<AssembledGemm>* complete);
  grpc::Status ConsumeChunk(v1::MatrixChunk& chunk, std::unique_ptr<AssembledGemm>* complete);

  const RequestRules& rules_;
  const int64_t max_pending_bytes_;
  int64_t pending_bytes_ = 0;
  std::map<uint64_t, Pending> pending_;
  std::set<uint64_t> in_use_;  // pending or handed out and not yet released
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_STREAM_ASSEMBLER_H_
