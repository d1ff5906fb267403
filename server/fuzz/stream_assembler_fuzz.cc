// libFuzzer target: a StreamAssembler fed a sequence of GemmStreamRequest messages, converted
// as the stream's reactor converts them (ToStreamMessage).
// Input: FuzzedDataProvider picks, per step, a header (gemm_id from a few, boundary
// dimensions, handles or none), a chunk (operand, an offset that is mostly the expected one,
// 1..4096 bytes), a Release of an answered GEMM, or a raw message parsed from fuzz bytes.
// Checked against a model in exact arithmetic: every chunk handed out lies inside its operand
// (2·rows·cols bytes), `last` comes exactly when both chunked operands are complete, no message
// shows a negative number. After an error the stream ends (as the service does).
#include <fuzzer/FuzzedDataProvider.h>

#include <fmt/format.h>

#include <map>

#include "server/core/status.h"
#include "server/fuzz/fuzz_util.h"
#include "server/session/stream_assembler.h"
#include "server/transport/convert.h"

namespace hgemm {
namespace {

struct Model {
  unsigned __int128 a_bytes = 0, b_bytes = 0, a_received = 0, b_received = 0;
};

}  // namespace
}  // namespace hgemm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hgemm;
  static const RequestRules* rules = [] {
    auto* r = new RequestRules;
    r->kernels = {{.name = "openblas_sgemm", .fp32_accumulation = true}};
    return r;
  }();
  FuzzedDataProvider in(data, size);
  const int64_t max_pending = in.ConsumeBool()
                                  ? int64_t{8} << 30
                                  : in.ConsumeIntegralInRange<int64_t>(0, int64_t{16} << 30);
  StreamAssembler assembler(*rules, max_pending);
  std::map<uint64_t, Model> pending;  // headers with chunks still to come
  std::vector<uint64_t> answered;     // complete; not yet released
  for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
    v1::GemmStreamRequest message;
    const uint64_t id = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 3)
                                         : in.ConsumeIntegral<uint64_t>();
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
      case 1:
      case 2: {
        v1::GemmHeader* h = message.mutable_header();
        h->set_gemm_id(id);
        h->set_m(fuzz::Dim(in));
        h->set_n(fuzz::Dim(in));
        h->set_k(fuzz::Dim(in));
        if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
          h->set_a_handle(in.ConsumeRandomLengthString(40));
        if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
          h->set_b_handle(in.ConsumeRandomLengthString(40));
        h->set_keep_c_resident(in.ConsumeBool());
        break;
      }
      case 3:
      case 4:
      case 5:
      case 6: {
        v1::MatrixChunk* c = message.mutable_chunk();
        c->set_gemm_id(id);
        c->set_operand(v1::Operand(in.ConsumeIntegralInRange<int>(0, 3)));
        auto it = pending.find(id);
        uint64_t offset = 0;
        if (it != pending.end()) {
          offset = uint64_t(c->operand() == v1::OPERAND_B ? it->second.b_received
                                                          : it->second.a_received);
        }
        if (in.ConsumeIntegralInRange<int>(0, 7) == 0) offset = in.ConsumeIntegral<uint64_t>();
        c->set_offset(offset);
        c->set_data(std::string(in.ConsumeIntegralInRange<size_t>(0, 4096), '\1'));
        break;
      }
      case 7:  // the service refuses a GEMM it was handed (e.g. an unknown handle)
        if (!pending.empty()) {
          auto it = pending.begin();
          assembler.Refuse(it->first);
          answered.push_back(it->first);
          pending.erase(it);
        }
        continue;
      case 8:
        if (!answered.empty()) {
          assembler.Release(answered.back());
          answered.pop_back();
        }
        continue;
      default:
        if (!message.ParseFromString(in.ConsumeRandomLengthString(256))) continue;
    }
    StreamEvent event;
    StreamMessage read = ToStreamMessage(message);
    absl::Status s = assembler.Consume(read, &event);
    if (fuzz::ShowsNegativeNumber(status::Message(s))) {
      fuzz::Fail("a message shows a wrapped negative number", status::Message(s));
    }
    if (!s.ok()) break;                                 // the stream ends
    if (event.header && !event.header->refused.ok()) {  // answered at once
      if (status::Message(event.header->refused).size() > 1024) fuzz::Fail("message too long", "");
      answered.push_back(event.header->gemm_id);
    } else if (event.header) {
      const AnnouncedGemm& g = *event.header;
      const v1::GemmHeader& h = message.header();
      if (h.m() == 0 || h.n() == 0 || h.k() == 0) fuzz::Fail("accepted a zero dimension", "");
      Model m{fuzz::Bytes(h.m(), h.k()), fuzz::Bytes(h.k(), h.n()), 0, 0};
      if (g.order.a.kind == OperandSource::Kind::kResident) m.a_received = m.a_bytes;
      if (g.order.b.kind == OperandSource::Kind::kResident) m.b_received = m.b_bytes;
      if (m.a_received < m.a_bytes || m.b_received < m.b_bytes) {
        pending[g.gemm_id] = m;
      } else {
        answered.push_back(g.gemm_id);
      }
    }
    if (event.chunk) {
      const OperandChunk& c = *event.chunk;
      auto it = pending.find(c.gemm_id);
      if (it == pending.end()) fuzz::Fail("chunk for a GEMM the model has no header for", "");
      Model& m = it->second;
      const bool is_a = c.operand == ChunkOperand::kA;
      unsigned __int128& received = is_a ? m.a_received : m.b_received;
      const unsigned __int128 total = is_a ? m.a_bytes : m.b_bytes;
      if (c.offset < 0 || (unsigned __int128)c.offset != received ||
          received + c.data.size() > total) {
        fuzz::Fail("chunk outside its operand",
                   fmt::format("gemm_id {} offset {} size {}", c.gemm_id, c.offset, c.data.size()));
      }
      if (!is_a && m.a_received < m.a_bytes) fuzz::Fail("B chunk before all of A", "");
      received += c.data.size();
      const bool complete = m.a_received == m.a_bytes && m.b_received == m.b_bytes;
      if (complete != c.last) fuzz::Fail("last flag differs from the model", "");
      if (complete) {
        pending.erase(it);
        answered.push_back(c.gemm_id);
      }
    }
  }
  return 0;
}
