// libFuzzer target: ValidateGemm of a GemmRequest or a GemmHeader, converted as the transport
// converts them (ToSpec).
// Input: byte 0 picks the mode. Even: the rest is a serialized GemmRequest (odd: GemmHeader),
// mutated as protobuf wire bytes (seeds: server/fuzz/corpus/validation). Mode bytes ≥ 0x80:
// the rest drives FuzzedDataProvider, which builds a request with boundary dimensions and an
// operand length that is exact, the int64-wrapped 2·m·k, or arbitrary.
// Checked: an accepted request has m, n, k ≥ 1, every matrix within the element limit and
// operands of exactly 2·rows·cols bytes (exact arithmetic; fp16 and bf16 alike), and a layout
// and types that its kernel takes; an accepted group (GemmRequest.group) has at most
// max_group_problems problems of m, n, k ≥ 1, each operand's elements summed over them within
// the limit and operands of exactly the summed bytes; no message shows a negative number.
#include <fuzzer/FuzzedDataProvider.h>

#include <fmt/format.h>

#include <string>
#include <tuple>

#include "server/core/status.h"
#include "server/fuzz/fuzz_util.h"
#include "server/session/validation.h"
#include "server/transport/convert.h"

namespace hgemm {
namespace {

const RequestRules& Rules(int which) {
  static const RequestRules* rules[2] = {
      [] {
        auto* r = new RequestRules;
        r->max_group_problems = 8;
        r->kernels = {{.name = "openblas_sgemm",
                       .fp32_accumulation = true,
                       .layouts = kAllLayoutBits,
                       .types = kAllTypesBits,
                       .grouped = true},
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

// Operand bytes of a rows x cols matrix into `*bytes`: exact, the int64-wrapped 2·rows·cols
// (up to 512 MiB), or arbitrary. A wrapped size comes from `*spare`, swapped in (true): the
// caller swaps it back after the input, so that the buffer lives across inputs and an input
// costs what its size changed by, not a fresh allocation and fill of ~277 MiB under ASan.
bool Operand(FuzzedDataProvider& in, uint32_t rows, uint32_t cols, std::string* bytes,
             std::string* spare) {
  const unsigned __int128 exact = fuzz::Bytes(rows, cols);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      if (exact <= (1u << 20)) {
        bytes->assign(size_t(exact), '\0');
        return false;
      }
      [[fallthrough]];
    case 1: {  // what 2·rows·cols wraps to, when that is small enough to send
      const int64_t wrapped = fuzz::WrappedBytes(rows, cols);
      if (wrapped >= 0 && wrapped <= (int64_t{1} << 29)) {
        spare->resize(size_t(wrapped));
        bytes->swap(*spare);
        return true;
      }
      [[fallthrough]];
    }
    default:
      bytes->assign(in.ConsumeIntegralInRange<size_t>(0, 4096), '\0');
      return false;
  }
}

// Where Operand's wrapped sizes live, reserved once: a resize within the capacity fills only
// the bytes it adds. Never freed (the fuzzer ends the process).
std::string* SpareOperand() {
  auto* spare = new std::string;
  spare->reserve(size_t{1} << 29);
  return spare;
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
    taken |=
        (job.kernel == "auto" || job.kernel == k.name) && (k.layouts & layout) && (k.types & types);
  }
  if (!taken) fuzz::Fail("accepted a layout or types no kernel takes", shape);
}

void CheckMessage(const absl::Status& s) {
  if (fuzz::ShowsNegativeNumber(status::Message(s))) {
    fuzz::Fail("a message shows a wrapped negative number", status::Message(s));
  }
  if (status::Message(s).size() > 2048)
    fuzz::Fail("message longer than 2 KiB", status::Message(s).substr(0, 200));
}

void CheckGroupAccepted(const v1::GemmRequest& r, const RequestRules& rules, const GemmJob& job) {
  const std::string what = fmt::format("group of {}", r.group_size());
  if (r.group_size() > rules.max_group_problems) fuzz::Fail("accepted too many problems", what);
  if (r.m() != 0 || r.n() != 0 || r.k() != 0 || r.batch() > 1) {
    fuzz::Fail("accepted a group with m, n, k or a batch", what);
  }
  if (job.shape.group.size() != size_t(r.group_size())) fuzz::Fail("group size differs", what);
  const unsigned __int128 limit = MaxElementsPerMatrix(rules);
  unsigned __int128 a = 0, b = 0, c = 0;
  for (int i = 0; i < r.group_size(); ++i) {
    const v1::GroupedProblem& p = r.group(i);
    if (p.m() == 0 || p.n() == 0 || p.k() == 0) fuzz::Fail("accepted a zero dimension", what);
    const ProblemDims& d = job.shape.group[i];
    if (d.m != p.m() || d.n != p.n() || d.k != p.k()) fuzz::Fail("problem differs", what);
    a += fuzz::Bytes(p.m(), p.k());
    b += fuzz::Bytes(p.k(), p.n());
    c += fuzz::Bytes(p.m(), p.n());
  }
  if (a / 2 > limit || b / 2 > limit || c / 2 > limit) {
    fuzz::Fail("accepted a group over the element limit", what);
  }
  if (a != r.a().size() || b != r.b().size()) {
    fuzz::Fail("accepted a group's operands of the wrong size",
               fmt::format("{}: {} and {} bytes", what, r.a().size(), r.b().size()));
  }
}

void Request(const v1::GemmRequest& r, const RequestRules& rules) {
  GemmOrder order;
  absl::Status s = ValidateGemm(ToSpec(r), rules, &order);
  const GemmJob& job = order.job;
  CheckMessage(s);
  if (!s.ok()) return;
  if (r.group_size() > 0) {
    CheckGroupAccepted(r, rules, job);
    return;
  }
  CheckAccepted(rules, r.m(), r.n(), r.k(), job);
  if (!r.has_a_handle() && fuzz::Bytes(r.m(), r.k()) != r.a().size()) {
    fuzz::Fail("accepted a of the wrong size",
               fmt::format("{}x{}x{}: {} bytes", r.m(), r.n(), r.k(), r.a().size()));
  }
  if (!r.has_b_handle() && fuzz::Bytes(r.k(), r.n()) != r.b().size()) {
    fuzz::Fail("accepted b of the wrong size",
               fmt::format("{}x{}x{}: {} bytes", r.m(), r.n(), r.k(), r.b().size()));
  }
}

void Header(const v1::GemmHeader& h, const RequestRules& rules) {
  GemmOrder order;
  absl::Status s = ValidateGemm(ToSpec(h), rules, &order);
  CheckMessage(s);
  if (s.ok()) CheckAccepted(rules, h.m(), h.n(), h.k(), order.job);
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
  if (mode & 1) {  // a group: boundary dimensions, operands of the summed sizes or arbitrary
    const int count = in.ConsumeIntegralInRange<int>(0, 10);
    for (int i = 0; i < count; ++i) {
      v1::GroupedProblem* p = r.add_group();
      p->set_m(fuzz::Dim(in));
      p->set_n(fuzz::Dim(in));
      p->set_k(fuzz::Dim(in));
      // Exact where small; a few bytes otherwise (ten problems' wrapped sizes would not fit
      // the fuzzer's memory).
      for (auto [rows, cols, bytes] :
           {std::tuple{p->m(), p->k(), r.mutable_a()}, std::tuple{p->k(), p->n(), r.mutable_b()}}) {
        const unsigned __int128 exact = fuzz::Bytes(rows, cols);
        bytes->append(in.ConsumeBool() && exact <= (1u << 16)
                          ? size_t(exact)
                          : in.ConsumeIntegralInRange<size_t>(0, 64),
                      '\0');
      }
    }
    if (in.ConsumeBool()) r.set_batch(in.ConsumeIntegralInRange<uint32_t>(0, 3));
    if (in.ConsumeBool()) r.set_m(fuzz::Dim(in));
    static const char* kKernels[] = {"", "auto", "openblas_sgemm", "both", "nope"};
    r.mutable_options()->set_kernel(kKernels[in.ConsumeIntegralInRange<int>(0, 4)]);
    Request(r, rules);
    return 0;
  }
  r.set_m(fuzz::Dim(in));
  r.set_n(fuzz::Dim(in));
  r.set_k(fuzz::Dim(in));
  static std::string* spare_a = SpareOperand();
  static std::string* spare_b = SpareOperand();
  bool lent_a = false, lent_b = false;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      r.set_a_handle("");
      break;
    case 1:
      r.set_a_handle(in.ConsumeRandomLengthString(64));
      break;
    default:
      lent_a = Operand(in, r.m(), r.k(), r.mutable_a(), spare_a);
  }
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      r.set_b_handle("");
      break;
    case 1:
      r.set_b_handle(in.ConsumeRandomLengthString(64));
      break;
    default:
      lent_b = Operand(in, r.k(), r.n(), r.mutable_b(), spare_b);
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
  if (lent_a) r.mutable_a()->swap(*spare_a);
  if (lent_b) r.mutable_b()->swap(*spare_b);
  return 0;
}
