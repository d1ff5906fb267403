#include "server/session/validation.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace hgemm {
namespace {

RequestRules Rules() {
  RequestRules rules;
  rules.max_elements_per_matrix = 1 << 20;
  rules.kernels = {{.name = "fast", .fp16_accumulation = true, .fp32_accumulation = true},
                   {.name = "fp32only", .fp16_accumulation = false, .fp32_accumulation = true}};
  return rules;
}

// An inline operand of `bytes` bytes: validation counts them and never reads them.
OperandSource InlineBytes(int64_t bytes) {
  OperandSource source = OperandSource::Inline({});
  source.bytes = bytes;
  return source;
}

// A unary request of fp16 operands of the right sizes, as the transport converts it.
GemmSpec Request(uint32_t m, uint32_t n, uint32_t k) {
  return {.m = m,
          .n = n,
          .k = k,
          .a = InlineBytes(int64_t{2} * m * k),
          .b = InlineBytes(int64_t{2} * k * n)};
}

// A stream's header of an m×n×k GEMM whose operands arrive in chunks.
GemmSpec Header(uint32_t m, uint32_t n, uint32_t k) {
  return {.field_prefix = "header.",
          .m = m,
          .n = n,
          .k = k,
          .a = OperandSource::Arriving(),
          .b = OperandSource::Arriving(),
          .c_in = OperandSource::Arriving()};
}

// ValidateGemm's job, whatever the outcome.
absl::Status Validate(const GemmSpec& spec, const RequestRules& rules, GemmJob* job) {
  GemmOrder order;
  absl::Status s = ValidateGemm(spec, rules, &order);
  *job = order.job;
  return s;
}

// The wire's enum values, as the transport converts them.
const WireEnum<Accumulation> kFp16Accumulation = WireEnum<Accumulation>::Of(1, Accumulation::kFp16);
const WireEnum<Accumulation> kFp32Accumulation = WireEnum<Accumulation>::Of(2, Accumulation::kFp32);
const WireEnum<ElementType> kBf16 = WireEnum<ElementType>::Of(2, ElementType::kBf16);
const WireEnum<ElementType> kFp32 = WireEnum<ElementType>::Of(3, ElementType::kFp32);

TEST(Validation, AcceptsWellFormedRequest) {
  GemmJob job;
  GemmSpec r = Request(3, 5, 7);
  r.options.request_id = "abc";
  ASSERT_TRUE(Validate(r, Rules(), &job).ok());
  EXPECT_EQ(job.shape.m, 3);
  EXPECT_EQ(job.shape.n, 5);
  EXPECT_EQ(job.shape.k, 7);
  EXPECT_EQ(job.kernel, "auto");
  EXPECT_EQ(job.accumulation, Accumulation::kFp32);
  EXPECT_EQ(job.request_id, "abc");
}

TEST(Validation, ZeroDimensionNamesTheField) {
  for (auto [m, n, k, field] :
       {std::tuple{0u, 1u, 1u, "m:"}, std::tuple{1u, 0u, 1u, "n:"}, std::tuple{1u, 1u, 0u, "k:"}}) {
    GemmJob job;
    absl::Status s = Validate(Request(m, n, k), Rules(), &job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().rfind(field, 0), 0u) << s.message();
  }
}

TEST(Validation, WrongByteLengthIsInvalidArgument) {
  GemmJob job;
  GemmSpec r = Request(4, 4, 4);
  r.a.bytes -= 1;
  absl::Status s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a: 31 bytes"), std::string::npos) << s.message();
  r = Request(4, 4, 4);
  r.b.bytes += 2;
  s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("b: 34 bytes"), std::string::npos) << s.message();
}

TEST(Validation, TooManyElementsIsResourceExhausted) {
  GemmJob job;
  GemmSpec r{.m = 2048, .n = 1, .k = 1024};  // A has 2^21 elements > 2^20
  absl::Status s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("A (m x k)"), std::string::npos) << s.message();
}

TEST(Validation, UnknownKernelIsInvalidArgument) {
  GemmJob job;
  GemmSpec r = Request(2, 2, 2);
  r.options.kernel = "nope";
  absl::Status s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.kernel: unknown kernel 'nope'"), std::string::npos);
}

TEST(Validation, KernelWithoutRequestedAccumulationIsInvalidArgument) {
  GemmJob job;
  GemmSpec r = Request(2, 2, 2);
  r.options.kernel = "fp32only";
  r.options.accumulation = kFp16Accumulation;
  EXPECT_EQ(Validate(r, Rules(), &job).code(), absl::StatusCode::kInvalidArgument);
  r.options.kernel = "fast";
  ASSERT_TRUE(Validate(r, Rules(), &job).ok());
  EXPECT_EQ(job.kernel, "fast");
  EXPECT_EQ(job.accumulation, Accumulation::kFp16);
}

TEST(Validation, UnknownAccumulationValueIsInvalidArgument) {
  GemmJob job;
  GemmSpec r = Request(2, 2, 2);
  r.options.accumulation = WireEnum<Accumulation>::Unknown(42);
  absl::Status s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "options.accumulation: unknown value 42");
}

TEST(Validation, LongRequestIdIsInvalidArgument) {
  GemmJob job;
  GemmSpec r = Request(2, 2, 2);
  r.options.request_id = std::string(kMaxRequestIdBytes + 1, 'x');
  EXPECT_EQ(Validate(r, Rules(), &job).code(), absl::StatusCode::kInvalidArgument);
}

// 2·m·k must not wrap in int64 (this would pass validation and the worker throw), and 2³²−1
// cubed must not be reported as "exactly -17179869182" bytes.
TEST(Validation, HugeDimensionsAreResourceExhaustedWithExactCounts) {
  for (uint32_t d : {3037000500u, 4294967295u}) {
    GemmJob job;
    GemmSpec r{.m = d,
               .n = d,
               .k = d,
               .a = InlineBytes(290948384),  // what 2·m·k wraps to for d = 3037000500
               .b = InlineBytes(290948384)};
    RequestRules rules = Rules();
    rules.max_elements_per_matrix = std::numeric_limits<int64_t>::max();  // capped at 2^40
    absl::Status s = Validate(r, rules, &job);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << d;
    const std::string elements = std::to_string(uint64_t{d} * d);
    EXPECT_NE(s.message().find("= " + elements + " elements"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(std::to_string(kMaxElementsPerMatrix)), std::string::npos)
        << s.message();
    EXPECT_EQ(s.message().find('-'), std::string::npos) << s.message();
  }
}

TEST(Validation, LimitIsCappedSoSizesFitInt64) {
  RequestRules rules;
  rules.max_elements_per_matrix = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(MaxElementsPerMatrix(rules), kMaxElementsPerMatrix);
  rules.max_elements_per_matrix = -5;
  EXPECT_EQ(MaxElementsPerMatrix(rules), 1);
  GemmShape shape;
  rules.max_elements_per_matrix = kMaxElementsPerMatrix;
  ASSERT_TRUE(ValidateShape(1u << 20, 1u << 20, 1u << 20, rules, &shape).ok());
  EXPECT_EQ(shape.Bytes(), 3 * (int64_t{2} << 40));
  EXPECT_EQ(shape.Flops(), int64_t{2} << 60);
}

// Item 10: an empty handle skipped the length check and the resolver, and the job read A from
// an empty string.
TEST(Validation, EmptyHandleIsInvalidArgument) {
  GemmJob job;
  GemmSpec r = Request(4, 4, 4);
  r.a = OperandSource::Resident("");
  absl::Status s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("a_handle: empty", 0), 0u) << s.message();
  r = Request(4, 4, 4);
  r.b = OperandSource::Resident("");
  s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("b_handle: empty", 0), 0u) << s.message();
}

// Item 6: "auto" with an accumulation no kernel has is refused, not silently run otherwise.
TEST(Validation, AutoRefusesAccumulationNoKernelHas) {
  RequestRules rules = Rules();
  rules.kernels = {{.name = "fp32only", .fp16_accumulation = false, .fp32_accumulation = true}};
  EXPECT_FALSE(AutoSupports(rules, Accumulation::kFp16));
  EXPECT_TRUE(AutoSupports(rules, Accumulation::kFp32));
  GemmJob job;
  GemmSpec r = Request(2, 2, 2);
  r.options.accumulation = kFp16Accumulation;
  absl::Status s = Validate(r, rules, &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("FP16"), std::string::npos) << s.message();
  r.options.accumulation = kFp32Accumulation;
  EXPECT_TRUE(Validate(r, rules, &job).ok());
}

RequestRules FormRules() {
  RequestRules rules = Rules();
  rules.kernels.push_back({.name = "any_form",
                           .fp32_accumulation = true,
                           .layouts = kAllLayoutBits,
                           .types = kAllTypesBits});
  return rules;
}

TEST(Validation, FillsLayoutAndTypes) {
  GemmJob job;
  GemmSpec r = Request(3, 5, 7);
  r.transpose_a = true;
  r.transpose_b = true;
  r.dtype = kBf16;
  r.c_dtype = kFp32;
  ASSERT_TRUE(Validate(r, FormRules(), &job).ok());
  EXPECT_TRUE(job.transpose_a);
  EXPECT_TRUE(job.transpose_b);
  EXPECT_EQ(job.shape.ab_type, ElementType::kBf16);
  EXPECT_EQ(job.shape.c_type, ElementType::kFp32);
  EXPECT_EQ(job.shape.ABytes(), 2 * 3 * 7);
  EXPECT_EQ(job.shape.CBytes(), 4 * 3 * 5);  // fp32 C
  r.c_dtype = WireEnum<ElementType>::Unset();
  ASSERT_TRUE(Validate(r, FormRules(), &job).ok());
  EXPECT_EQ(job.shape.c_type, ElementType::kBf16);  // unspecified: the inputs' type
}

TEST(Validation, KernelsThatLackTheLayoutOrTypesAreRefused) {
  GemmJob job;
  GemmSpec r = Request(4, 4, 4);
  r.transpose_b = true;
  r.options.kernel = "fast";  // NN only
  absl::Status s = Validate(r, FormRules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("transpose_b: kernel 'fast' takes layouts NN, not NT", 0), 0u)
      << s.message();
  r.transpose_b = false;
  r.c_dtype = kFp32;
  s = Validate(r, FormRules(), &job);
  EXPECT_EQ(s.message().rfind("c_dtype: kernel 'fast' takes types fp16, not fp16->fp32", 0), 0u)
      << s.message();
  r.options.kernel.clear();  // auto: some kernel takes it
  EXPECT_TRUE(Validate(r, FormRules(), &job).ok());
  s = Validate(r, Rules(), &job);  // none does
  EXPECT_EQ(s.message().rfind("c_dtype: no kernel of this server takes fp16->fp32", 0), 0u)
      << s.message();
}

TEST(Validation, HeaderFieldsArePrefixed) {
  GemmJob job;
  GemmSpec h = Header(2, 2, 2);
  h.dtype = WireEnum<ElementType>::Unknown(5);
  absl::Status s = Validate(h, FormRules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("header.dtype: enum value 5 is not", 0), 0u) << s.message();
  h.dtype = kFp32;  // a wire value, but no type of A and B
  s = Validate(h, FormRules(), &job);
  EXPECT_EQ(s.message().rfind("header.dtype: enum value 3 is not", 0), 0u) << s.message();
  h.dtype = kBf16;
  h.options.kernel = "nope";
  s = Validate(h, FormRules(), &job);
  EXPECT_EQ(s.message().rfind("header.options.kernel: unknown kernel", 0), 0u) << s.message();
  h.options.kernel.clear();
  h.transpose_a = true;
  ASSERT_TRUE(Validate(h, FormRules(), &job).ok());
  EXPECT_TRUE(job.transpose_a);
  EXPECT_EQ(job.shape.BBytes(), 8);
  // The dimensions are named bare, a header's too.
  h.m = 0;
  s = Validate(h, FormRules(), &job);
  EXPECT_EQ(s.message(), "m: must be at least 1");
}

TEST(Validation, ScalesDefaultToOpAB) {
  GemmJob job;
  GemmSpec r = Request(3, 5, 7);
  r.c_in = InlineBytes(18);  // never read, so never size-checked
  ASSERT_TRUE(Validate(r, Rules(), &job).ok());
  EXPECT_EQ(job.alpha, 1.0f);
  EXPECT_EQ(job.beta, 0.0f);
  EXPECT_FALSE(job.Scaled());
  EXPECT_FALSE(job.shape.c_input);
  EXPECT_EQ(job.shape.Bytes(), 2 * (3 * 7 + 7 * 5 + 3 * 5));
}

TEST(Validation, ScalesNeedAKernelThatTakesThem) {
  RequestRules rules = Rules();
  GemmSpec r = Request(3, 5, 7);
  r.alpha = 0;  // alpha 0 is expressible: the field has presence
  GemmJob job;
  absl::Status s = Validate(r, rules, &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("alpha: no kernel of this server takes alpha/beta", 0), 0u)
      << s.message();

  rules.kernels[1].scaled_types = kTypesFp16Bit;  // "fp32only"
  ASSERT_TRUE(Validate(r, rules, &job).ok());
  EXPECT_EQ(job.alpha, 0.0f);
  EXPECT_TRUE(job.Scaled());
  r.options.kernel = "fast";
  s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("alpha: kernel 'fast' takes alpha/beta for none", 0), 0u)
      << s.message();
  r.options.kernel = "fp32only";
  r.beta = -2;
  r.c_in = InlineBytes(2 * 3 * 5);
  ASSERT_TRUE(Validate(r, rules, &job).ok());
  EXPECT_TRUE(job.shape.c_input);
  EXPECT_EQ(job.shape.Bytes(), 2 * (3 * 7 + 7 * 5 + 2 * 3 * 5));

  // FP16 accumulation takes no scales, even on a kernel that has it.
  r.options.kernel = "fast";
  r.options.accumulation = kFp16Accumulation;
  s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("options.accumulation:", 0), 0u) << s.message();
}

// Scale factors print as floats, so that an integral one can't read as a wrapped size.
TEST(Validation, ScaleFactorsPrintAsFloats) {
  RequestRules rules = Rules();
  GemmJob job;
  GemmSpec r = Request(3, 5, 7);
  r.beta = -1608507300.0f;
  absl::Status s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: -1608507300.0 needs a C input", 0), 0u) << s.message();
  r.beta = -249909.12f;
  s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: -249909.12 needs a C input", 0), 0u) << s.message();
  r.beta = -1e30f;
  s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: -1e+30 needs a C input", 0), 0u) << s.message();
}

TEST(Validation, BetaNeedsACInputOfCsSize) {
  RequestRules rules = Rules();
  rules.kernels[1].scaled_types = kAllTypesBits;
  GemmJob job;
  GemmSpec r = Request(3, 5, 7);
  r.beta = 1;
  absl::Status s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: 1.0 needs a C input", 0), 0u) << s.message();
  r.c_in = InlineBytes(2 * 3 * 5 - 1);
  s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("c_in: 29 bytes", 0), 0u) << s.message();
  r.c_in = OperandSource::Resident("");
  s = Validate(r, rules, &job);
  EXPECT_EQ(s.message().rfind("c_in_handle: empty", 0), 0u) << s.message();
  r.c_in = OperandSource::Resident("h");
  EXPECT_TRUE(Validate(r, rules, &job).ok());  // its shape is checked when resolved

  // A header always has a C input: OPERAND_C chunks unless c_in_handle.
  GemmSpec header = Header(3, 5, 7);
  header.beta = 0.5f;
  ASSERT_TRUE(Validate(header, rules, &job).ok());
  EXPECT_TRUE(job.shape.c_input);
  header.alpha = std::numeric_limits<float>::infinity();
  s = Validate(header, rules, &job);
  EXPECT_EQ(s.message().rfind("header.alpha: inf is not a finite number", 0), 0u) << s.message();
}

TEST(Validation, BatchSizesTheOperandsAndKeepsThemInTheLimit) {
  GemmJob job;
  GemmSpec r = Request(3, 5, 7);
  r.batch = 4;
  r.a = InlineBytes(4 * 2 * 3 * 7);
  r.b = InlineBytes(4 * 2 * 7 * 5);
  ASSERT_TRUE(Validate(r, Rules(), &job).ok());
  EXPECT_EQ(job.shape.batch, 4);
  EXPECT_EQ(job.shape.ABytes(), 4 * 2 * 3 * 7);
  EXPECT_EQ(job.shape.CBytes(), 4 * 2 * 3 * 5);
  EXPECT_EQ(job.shape.Flops(), 4 * 2 * 3 * 5 * 7);

  r.batch = 0;  // 0 is one GEMM, as 1: the buffers are now four times too long
  absl::Status s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.message().rfind("a: 168 bytes", 0), 0u) << s.message();

  // 2^20 elements per matrix (Rules()): 16 A's of 256x256 are 2^20, 17 are over.
  r = Request(256, 1, 256);
  r.batch = 17;
  s = Validate(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message().rfind("batch: 17 matrices A of 65536 elements each are 1114112", 0), 0u)
      << s.message();
  r.batch = 16;
  r.a = InlineBytes(16 * 2 * 256 * 256);
  r.b = InlineBytes(16 * 2 * 256);
  EXPECT_TRUE(Validate(r, Rules(), &job).ok());

  GemmSpec header = Header(2, 2, 2);
  header.batch = 3;
  header.a = OperandSource::Resident("h");
  s = Validate(header, Rules(), &job);
  EXPECT_EQ(s.message().rfind("header.a_handle: holds one matrix", 0), 0u) << s.message();
}

TEST(Validation, OrderTakesTheSpecsSourcesAndSink) {
  using Kind = OperandSource::Kind;
  RequestRules rules = Rules();
  rules.kernels[1].scaled_types = kAllTypesBits;
  GemmSpec r = Request(3, 5, 7);
  r.b = OperandSource::Resident("m-1");
  r.c_in = OperandSource::Region("r-1", 64);  // beta 0: never read
  r.c = ResultSink::Region("r-2", 128);
  GemmOrder order;
  ASSERT_TRUE(ValidateGemm(r, rules, &order).ok());
  EXPECT_EQ(order.a.kind, Kind::kInline);
  EXPECT_EQ(order.a.bytes, 2 * 3 * 7);
  EXPECT_EQ(order.b.kind, Kind::kResident);
  EXPECT_EQ(order.b.handle, "m-1");
  EXPECT_EQ(order.c_in.kind, Kind::kNone);
  EXPECT_EQ(order.c.kind, ResultSink::Kind::kRegion);
  EXPECT_EQ(order.c.region, "r-2");
  EXPECT_EQ(order.c.offset, 128u);

  r.beta = 1;
  r.c = ResultSink::Host();
  r.keep_c_resident = true;
  r.c_ttl_seconds = 30;
  r.c_transient = true;
  ASSERT_TRUE(ValidateGemm(r, rules, &order).ok());
  EXPECT_EQ(order.c_in.kind, Kind::kRegion);
  EXPECT_EQ(order.c_in.handle, "r-1");
  EXPECT_EQ(order.c_in.offset, 64u);
  EXPECT_EQ(order.c.kind, ResultSink::Kind::kKeepResident);
  EXPECT_EQ(order.c.ttl_seconds, 30u);
  EXPECT_TRUE(order.c.transient);

  r.c = ResultSink::Region("r-2", 0);
  absl::Status s = ValidateGemm(r, rules, &order);
  EXPECT_EQ(s.message(), "c_region: C goes either to a region or stays resident, not both");
}

// A grouped request of fp16 problems (m, n, k each), operands of the right sizes.
GemmSpec GroupedRequest(const std::vector<GemmSpec::Problem>& problems) {
  GemmSpec r{.group = problems, .a = InlineBytes(0), .b = InlineBytes(0)};
  for (const GemmSpec::Problem& p : problems) {
    r.a.bytes += int64_t{2} * p.m * p.k;
    r.b.bytes += int64_t{2} * p.k * p.n;
  }
  return r;
}

RequestRules GroupedRules() {
  RequestRules rules = Rules();
  rules.kernels[1].grouped = true;  // "fp32only" takes groups (and alpha/beta), "fast" does not
  rules.kernels[1].scaled_types = kTypesFp16Bit;
  rules.max_group_problems = 3;
  return rules;
}

TEST(Validation, GroupSizesTheOperandsFromItsProblems) {
  GemmJob job;
  ASSERT_TRUE(Validate(GroupedRequest({{3, 5, 7}, {1, 2, 9}}), GroupedRules(), &job).ok());
  ASSERT_EQ(job.shape.group.size(), 2u);
  EXPECT_EQ(job.shape.group[1].k, 9);
  EXPECT_EQ(job.shape.m, 0);
  EXPECT_EQ(job.shape.ABytes(), 2 * (3 * 7 + 1 * 9));
  EXPECT_EQ(job.shape.BBytes(), 2 * (7 * 5 + 9 * 2));
  EXPECT_EQ(job.shape.CBytes(), 2 * (3 * 5 + 1 * 2));
  EXPECT_EQ(job.shape.Flops(), 2 * (3 * 5 * 7 + 1 * 2 * 9));
}

TEST(Validation, GroupRefusalsNameTheirField) {
  const GemmSpec good = GroupedRequest({{3, 5, 7}, {1, 2, 9}});
  auto refused = [](const GemmSpec& r, const RequestRules& rules, absl::StatusCode code,
                    const std::string& prefix) {
    GemmJob job;
    absl::Status s = Validate(r, rules, &job);
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_EQ(s.message().rfind(prefix, 0), 0u) << s.message();
  };
  GemmSpec r = good;
  r.m = 3;
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "m: 3 with a group");
  r = good;
  r.batch = 2;
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "batch: 2 with a group");
  r = good;
  r.group[1].n = 0;
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "group[1].n: must be at least 1");
  r = good;
  r.a.bytes -= 1;
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "a: 59 bytes");
  r = good;
  r.b.bytes += 2;
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "b: 108 bytes");
  r = good;
  r.beta = 2;
  r.c_in = InlineBytes(2 * 15);  // C_0 only: C_1 missing
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "c_in: 30 bytes");
  r = good;
  r.b = OperandSource::Resident("m-1");
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "b_handle: a grouped GEMM");
  r = good;
  r.c = ResultSink::Region("r-1", 0);
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "c_region: a grouped GEMM");
  r = good;
  r.keep_c_resident = true;
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "keep_c_resident:");
  r = good;
  r.options.kernel = "fast";
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "options.kernel: 'fast' takes no");
  refused(good, Rules(), absl::StatusCode::kInvalidArgument, "options.kernel: 'auto' takes no");
  refused(GroupedRequest({{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}}), GroupedRules(),
          absl::StatusCode::kResourceExhausted, "group has 4 problems");
  // Each problem within the limit of 2^20 elements, the sum over the group past it.
  r = GroupedRequest({});
  r.group.assign(2, {.m = 1024, .n = 1, .k = 600});
  refused(r, GroupedRules(), absl::StatusCode::kResourceExhausted,
          "group: the A matrices of problems 0..1 have 1228800 elements");
  // One problem past it, with dimensions whose products overflow 32 bits.
  r.group[0].m = 4000000000u;
  r.group[0].k = 4000000000u;
  refused(r, GroupedRules(), absl::StatusCode::kResourceExhausted, "group[0]: A (m x k)");
}

}  // namespace
}  // namespace hgemm
