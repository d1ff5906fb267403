// libFuzzer target: ValidateGemmRequest / ValidateGemmHeader.
// Input: byte 0 picks the mode. Even: the rest is a serialized GemmRequest (odd: GemmHeader),
// mutated as protobuf wire bytes (seeds: server/fuzz/corpus/validation). Mode bytes ≥ 0x80:
// the rest drives FuzzedDataProvider, which builds a request with boundary dimensions and an
// operand length that is exact, the int64-wrapped 2·m·k, or arbitrary.
// Checked: an accepted request has m, n, k ≥ 1, every matrix within the element limit and
// operands of exactly 2·rows·cols bytes (exact arithmetic; fp16 and bf16 alike), and a layout
// and types that its kernel takes; no message shows a negative number.
#include <fuzzer/FuzzedDataProvider.h>

#include <fmt/format.h>

#include "server/core/status.h"
#include "server/fuzz/fuzz_util.h"
#include "server/session/validation.h"

namespace hgemm {
namespace {

const RequestRules& Rules(int which) {
  static const RequestRules* rules[2] = {
      [] {
        auto* r = new RequestRules;
        r->kernels = {{.name = "openblas_sgemm",
                       .fp32_accumulation = true,
                       .layouts = kAllLayoutBits,
                       .types = kAllTypesBits},
                      {.name = "both", .fp16_accumulation = true, .fp32_accumulation = true}};
        return r;
      }(),
      [] {
        auto* r = new RequestRules;  // no element limit to speak of: the byte checks alone
        r->max_elements_per_matrix = INT64_MAX;
        r->kernels = {{.name = "openblas_sgemm", .fp32_accumulation = true}};
        return r;
      }()};
  return *rules[which & 1];
}

std::string Operand(FuzzedDataProvider& in, uint32_t rows, uint32_t cols) {
  const unsigned __int128 exact = fuzz::Bytes(rows, cols);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      if (exact <= (1u << 20)) return std::string(size_t(exact), '\0');
      [[fallthrough]];
    case 1: {  // what 2·rows·cols wraps to, when that is small enough to send
      const int64_t wrapped = fuzz::WrappedBytes(rows, cols);
      if (wrapped >= 0 && wrapped <= (int64_t{1} << 29)) return std::string(size_t(wrapped), '\0');
      [[fallthrough]];
    }
    default:
      return std::string(in.ConsumeIntegralInRange<size_t>(0, 4096), '\0');
  }
}

void CheckAccepted(const RequestRules& rules, uint32_t m, uint32_t n, uint32_t k,
                   const GemmJob& job) {
  const std::string shape = fmt::format("{}x{}x{}", m, n, k);
  if (m == 0 || n == 0 || k == 0) fuzz::Fail("accepted a zero dimension", shape);
  const unsigned __int128 limit = MaxElementsPerMatrix(rules);  // the flag, capped at 2^40
  if ((unsigned __int128)m * k > limit || (unsigned __int128)k * n > limit ||
      (unsigned __int128)m * n > limit) {
    fuzz::Fail("accepted a matrix over the element limit", shape);
  }
  if (job.shape.m != m || job.shape.n != n || job.shape.k != k) fuzz::Fail("shape differs", shape);
  if (job.shape.ab_type == ElementType::kFp32) fuzz::Fail("accepted fp32 operands", shape);
  if (job.accumulation == Accumulation::kFp16 &&
      (job.shape.ab_type != ElementType::kFp16 || job.shape.c_type != ElementType::kFp16)) {
    fuzz::Fail("accepted FP16 accumulation of another type", shape);
  }
  const unsigned layout = LayoutBit(job.transpose_a, job.transpose_b);
  const unsigned types = TypesBit(job.shape.ab_type, job.shape.c_type);
  bool taken = false;
  for (const KernelDescription& k : rules.kernels) {
    taken |= (job.kernel == "auto" || job.kernel == k.name) && (k.layouts & layout) &&
             (k.types & types);
  }
  if (!taken) fuzz::Fail("accepted a layout or types no kernel takes", shape);
}

void CheckMessage(const absl::Status& s) {
  if (fuzz::ShowsNegativeNumber(status::Message(s))) {
    fuzz::Fail("a message shows a wrapped negative number", status::Message(s));
  }
  if (status::Message(s).size() > 2048) fuzz::Fail("message longer than 2 KiB", status::Message(s).substr(0, 200));
}

void Request(const v1::GemmRequest& r, const RequestRules& rules) {
  GemmJob job;
  absl::Status s = ValidateGemmRequest(r, rules, &job);
  CheckMessage(s);
  if (!s.ok()) return;
  CheckAccepted(rules, r.m(), r.n(), r.k(), job);
  if (!r.has_a_handle() && fuzz::Bytes(r.m(), r.k()) != r.a().size()) {
    fuzz::Fail("accepted a of the wrong size", fmt::format("{}x{}x{}: {} bytes", r.m(), r.n(),
                                                           r.k(), r.a().size()));
  }
  if (!r.has_b_handle() && fuzz::Bytes(r.k(), r.n()) != r.b().size()) {
    fuzz::Fail("accepted b of the wrong size", fmt::format("{}x{}x{}: {} bytes", r.m(), r.n(),
                                                           r.k(), r.b().size()));
  }
}

void Header(const v1::GemmHeader& h, const RequestRules& rules) {
  GemmJob job;
  absl::Status s = ValidateGemmHeader(h, rules, &job);
  CheckMessage(s);
  if (s.ok()) CheckAccepted(rules, h.m(), h.n(), h.k(), job);
}

}  // namespace
}  // namespace hgemm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hgemm;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const RequestRules& rules = Rules(mode >> 1);
  if (mode < 0x80) {
    if (mode & 1) {
      v1::GemmHeader h;
      if (h.ParseFromArray(data + 1, int(size - 1))) Header(h, rules);
    } else {
      v1::GemmRequest r;
      if (r.ParseFromArray(data + 1, int(size - 1))) Request(r, rules);
    }
    return 0;
  }
  FuzzedDataProvider in(data + 1, size - 1);
  v1::GemmRequest r;
  r.set_m(fuzz::Dim(in));
  r.set_n(fuzz::Dim(in));
  r.set_k(fuzz::Dim(in));
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: r.set_a_handle(""); break;
    case 1: r.set_a_handle(in.ConsumeRandomLengthString(64)); break;
    default: r.set_a(Operand(in, r.m(), r.k()));
  }
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: r.set_b_handle(""); break;
    case 1: r.set_b_handle(in.ConsumeRandomLengthString(64)); break;
    default: r.set_b(Operand(in, r.k(), r.n()));
  }
  static const char* kKernels[] = {"", "auto", "openblas_sgemm", "both", "nope"};
  r.mutable_options()->set_kernel(kKernels[in.ConsumeIntegralInRange<int>(0, 4)]);
  r.mutable_options()->set_accumulation(v1::Accumulation(in.ConsumeIntegralInRange<int>(-1, 3)));
  r.mutable_options()->set_request_id(in.ConsumeRandomLengthString(200));
  Request(r, rules);
  v1::GemmHeader h;
  h.set_m(r.m());
  h.set_n(r.n());
  h.set_k(r.k());
  *h.mutable_options() = r.options();
  Header(h, rules);
  return 0;
}
