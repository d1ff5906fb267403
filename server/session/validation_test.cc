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

v1::GemmRequest Request(uint32_t m, uint32_t n, uint32_t k) {
  v1::GemmRequest r;
  r.set_m(m);
  r.set_n(n);
  r.set_k(k);
  r.set_a(std::string(2 * m * k, '\1'));
  r.set_b(std::string(2 * k * n, '\1'));
  return r;
}

TEST(Validation, AcceptsWellFormedRequest) {
  GemmJob job;
  v1::GemmRequest r = Request(3, 5, 7);
  r.mutable_options()->set_request_id("abc");
  ASSERT_TRUE(ValidateGemmRequest(r, Rules(), &job).ok());
  EXPECT_EQ(job.shape.m, 3);
  EXPECT_EQ(job.shape.n, 5);
  EXPECT_EQ(job.shape.k, 7);
  EXPECT_EQ(job.kernel, "auto");
  EXPECT_EQ(job.accumulation, Accumulation::kFp32);
  EXPECT_EQ(job.request_id, "abc");
}

TEST(Validation, ZeroDimensionNamesTheField) {
  for (auto [m, n, k, field] : {std::tuple{0u, 1u, 1u, "m:"}, std::tuple{1u, 0u, 1u, "n:"},
                                std::tuple{1u, 1u, 0u, "k:"}}) {
    GemmJob job;
    absl::Status s = ValidateGemmRequest(Request(m, n, k), Rules(), &job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().rfind(field, 0), 0u) << s.message();
  }
}

TEST(Validation, WrongByteLengthIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(4, 4, 4);
  r.mutable_a()->pop_back();
  absl::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a: 31 bytes"), std::string::npos) << s.message();
  r = Request(4, 4, 4);
  r.mutable_b()->append("xx");
  s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("b: 34 bytes"), std::string::npos) << s.message();
}

TEST(Validation, TooManyElementsIsResourceExhausted) {
  GemmJob job;
  v1::GemmRequest r;
  r.set_m(2048);
  r.set_n(1);
  r.set_k(1024);  // A has 2^21 elements > 2^20
  absl::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("A (m x k)"), std::string::npos) << s.message();
}

TEST(Validation, UnknownKernelIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_kernel("nope");
  absl::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.kernel: unknown kernel 'nope'"), std::string::npos);
}

TEST(Validation, KernelWithoutRequestedAccumulationIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_kernel("fp32only");
  r.mutable_options()->set_accumulation(v1::ACCUMULATION_FP16);
  EXPECT_EQ(ValidateGemmRequest(r, Rules(), &job).code(), absl::StatusCode::kInvalidArgument);
  r.mutable_options()->set_kernel("fast");
  ASSERT_TRUE(ValidateGemmRequest(r, Rules(), &job).ok());
  EXPECT_EQ(job.kernel, "fast");
  EXPECT_EQ(job.accumulation, Accumulation::kFp16);
}

TEST(Validation, UnknownAccumulationValueIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_accumulation(static_cast<v1::Accumulation>(42));
  EXPECT_EQ(ValidateGemmRequest(r, Rules(), &job).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Validation, LongRequestIdIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_request_id(std::string(kMaxRequestIdBytes + 1, 'x'));
  EXPECT_EQ(ValidateGemmRequest(r, Rules(), &job).code(), absl::StatusCode::kInvalidArgument);
}

// Issue 12, items 1 and 3: 2·m·k used to wrap in int64, so this passed validation and the
// worker threw; and 2³²−1 cubed was reported as "exactly -17179869182" bytes.
TEST(Validation, HugeDimensionsAreResourceExhaustedWithExactCounts) {
  for (uint32_t d : {3037000500u, 4294967295u}) {
    GemmJob job;
    v1::GemmRequest r;
    r.set_m(d);
    r.set_n(d);
    r.set_k(d);
    r.set_a(std::string(290948384, '\1'));  // what 2·m·k wraps to for d = 3037000500
    r.set_b(std::string(290948384, '\1'));
    RequestRules rules = Rules();
    rules.max_elements_per_matrix = std::numeric_limits<int64_t>::max();  // capped at 2^40
    absl::Status s = ValidateGemmRequest(r, rules, &job);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << d;
    const std::string elements = std::to_string(uint64_t{d} * d);
    EXPECT_NE(s.message().find("= " + elements + " elements"), std::string::npos)
        << s.message();
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
  v1::GemmRequest r = Request(4, 4, 4);
  r.set_a_handle("");
  absl::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("a_handle: empty", 0), 0u) << s.message();
  r = Request(4, 4, 4);
  r.set_b_handle("");
  s = ValidateGemmRequest(r, Rules(), &job);
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
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_accumulation(v1::ACCUMULATION_FP16);
  absl::Status s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("FP16"), std::string::npos) << s.message();
  r.mutable_options()->set_accumulation(v1::ACCUMULATION_FP32);
  EXPECT_TRUE(ValidateGemmRequest(r, rules, &job).ok());
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
  v1::GemmRequest r = Request(3, 5, 7);
  r.set_transpose_a(true);
  r.set_transpose_b(true);
  r.set_dtype(v1::DATA_TYPE_BF16);
  r.set_c_dtype(v1::DATA_TYPE_FP32);
  ASSERT_TRUE(ValidateGemmRequest(r, FormRules(), &job).ok());
  EXPECT_TRUE(job.transpose_a);
  EXPECT_TRUE(job.transpose_b);
  EXPECT_EQ(job.shape.ab_type, ElementType::kBf16);
  EXPECT_EQ(job.shape.c_type, ElementType::kFp32);
  EXPECT_EQ(job.shape.ABytes(), 2 * 3 * 7);
  EXPECT_EQ(job.shape.CBytes(), 4 * 3 * 5);  // fp32 C
  r.clear_c_dtype();
  ASSERT_TRUE(ValidateGemmRequest(r, FormRules(), &job).ok());
  EXPECT_EQ(job.shape.c_type, ElementType::kBf16);  // unspecified: the inputs' type
}

TEST(Validation, KernelsThatLackTheLayoutOrTypesAreRefused) {
  GemmJob job;
  v1::GemmRequest r = Request(4, 4, 4);
  r.set_transpose_b(true);
  r.mutable_options()->set_kernel("fast");  // NN only
  absl::Status s = ValidateGemmRequest(r, FormRules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("transpose_b: kernel 'fast' takes layouts NN, not NT", 0), 0u)
      << s.message();
  r.set_transpose_b(false);
  r.set_c_dtype(v1::DATA_TYPE_FP32);
  s = ValidateGemmRequest(r, FormRules(), &job);
  EXPECT_EQ(s.message().rfind("c_dtype: kernel 'fast' takes types fp16, not fp16->fp32", 0), 0u)
      << s.message();
  r.mutable_options()->clear_kernel();  // auto: some kernel takes it
  EXPECT_TRUE(ValidateGemmRequest(r, FormRules(), &job).ok());
  s = ValidateGemmRequest(r, Rules(), &job);  // none does
  EXPECT_EQ(s.message().rfind("c_dtype: no kernel of this server takes fp16->fp32", 0), 0u)
      << s.message();
}

TEST(Validation, HeaderFieldsArePrefixed) {
  GemmJob job;
  v1::GemmHeader h;
  h.set_m(2);
  h.set_n(2);
  h.set_k(2);
  h.set_dtype(v1::DataType(5));
  absl::Status s = ValidateGemmHeader(h, FormRules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("header.dtype: enum value 5 is not", 0), 0u) << s.message();
  h.set_dtype(v1::DATA_TYPE_BF16);
  h.set_transpose_a(true);
  ASSERT_TRUE(ValidateGemmHeader(h, FormRules(), &job).ok());
  EXPECT_TRUE(job.transpose_a);
  EXPECT_EQ(job.shape.BBytes(), 8);
}

TEST(Validation, ScalesDefaultToOpAB) {
  GemmJob job;
  v1::GemmRequest r = Request(3, 5, 7);
  r.set_c_in("ignored: beta is 0");  // never read, so never size-checked
  ASSERT_TRUE(ValidateGemmRequest(r, Rules(), &job).ok());
  EXPECT_EQ(job.alpha, 1.0f);
  EXPECT_EQ(job.beta, 0.0f);
  EXPECT_FALSE(job.Scaled());
  EXPECT_FALSE(job.shape.c_input);
  EXPECT_EQ(job.shape.Bytes(), 2 * (3 * 7 + 7 * 5 + 3 * 5));
}

TEST(Validation, ScalesNeedAKernelThatTakesThem) {
  RequestRules rules = Rules();
  v1::GemmRequest r = Request(3, 5, 7);
  r.set_alpha(0);  // alpha 0 is expressible: the field has presence
  GemmJob job;
  absl::Status s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("alpha: no kernel of this server takes alpha/beta", 0), 0u)
      << s.message();

  rules.kernels[1].scaled_types = kTypesFp16Bit;  // "fp32only"
  ASSERT_TRUE(ValidateGemmRequest(r, rules, &job).ok());
  EXPECT_EQ(job.alpha, 0.0f);
  EXPECT_TRUE(job.Scaled());
  r.mutable_options()->set_kernel("fast");
  s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("alpha: kernel 'fast' takes alpha/beta for none", 0), 0u)
      << s.message();
  r.mutable_options()->set_kernel("fp32only");
  r.set_beta(-2);
  r.set_c_in(std::string(2 * 3 * 5, '\1'));
  ASSERT_TRUE(ValidateGemmRequest(r, rules, &job).ok());
  EXPECT_TRUE(job.shape.c_input);
  EXPECT_EQ(job.shape.Bytes(), 2 * (3 * 7 + 7 * 5 + 2 * 3 * 5));

  // FP16 accumulation takes no scales, even on a kernel that has it.
  r.mutable_options()->set_kernel("fast");
  r.mutable_options()->set_accumulation(v1::ACCUMULATION_FP16);
  s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("options.accumulation:", 0), 0u) << s.message();
}

// Scale factors print as floats, so that an integral one can't read as a wrapped size.
TEST(Validation, ScaleFactorsPrintAsFloats) {
  RequestRules rules = Rules();
  GemmJob job;
  v1::GemmRequest r = Request(3, 5, 7);
  r.set_beta(-1608507300.0f);
  absl::Status s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: -1608507300.0 needs a C input", 0), 0u) << s.message();
  r.set_beta(-249909.12f);
  s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: -249909.12 needs a C input", 0), 0u) << s.message();
  r.set_beta(-1e30f);
  s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: -1e+30 needs a C input", 0), 0u) << s.message();
}

TEST(Validation, BetaNeedsACInputOfCsSize) {
  RequestRules rules = Rules();
  rules.kernels[1].scaled_types = kAllTypesBits;
  GemmJob job;
  v1::GemmRequest r = Request(3, 5, 7);
  r.set_beta(1);
  absl::Status s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("beta: 1.0 needs a C input", 0), 0u) << s.message();
  r.set_c_in(std::string(2 * 3 * 5 - 1, '\1'));
  s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("c_in: 29 bytes", 0), 0u) << s.message();
  r.set_c_in_handle("");
  s = ValidateGemmRequest(r, rules, &job);
  EXPECT_EQ(s.message().rfind("c_in_handle: empty", 0), 0u) << s.message();
  r.set_c_in_handle("h");
  EXPECT_TRUE(ValidateGemmRequest(r, rules, &job).ok());  // its shape is checked when resolved

  // A header always has a C input: OPERAND_C chunks unless c_in_handle.
  v1::GemmHeader header;
  header.set_m(3);
  header.set_n(5);
  header.set_k(7);
  header.set_beta(0.5f);
  ASSERT_TRUE(ValidateGemmHeader(header, rules, &job).ok());
  EXPECT_TRUE(job.shape.c_input);
  header.set_alpha(std::numeric_limits<float>::infinity());
  s = ValidateGemmHeader(header, rules, &job);
  EXPECT_EQ(s.message().rfind("header.alpha: inf is not a finite number", 0), 0u) << s.message();
}

TEST(Validation, BatchSizesTheOperandsAndKeepsThemInTheLimit) {
  GemmJob job;
  v1::GemmRequest r = Request(3, 5, 7);
  r.set_batch(4);
  r.set_a(std::string(4 * 2 * 3 * 7, '\1'));
  r.set_b(std::string(4 * 2 * 7 * 5, '\1'));
  ASSERT_TRUE(ValidateGemmRequest(r, Rules(), &job).ok());
  EXPECT_EQ(job.shape.batch, 4);
  EXPECT_EQ(job.shape.ABytes(), 4 * 2 * 3 * 7);
  EXPECT_EQ(job.shape.CBytes(), 4 * 2 * 3 * 5);
  EXPECT_EQ(job.shape.Flops(), 4 * 2 * 3 * 5 * 7);

  r.set_batch(0);  // 0 is one GEMM, as 1: the buffers are now four times too long
  absl::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.message().rfind("a: 168 bytes", 0), 0u) << s.message();

  // 2^20 elements per matrix (Rules()): 16 A's of 256x256 are 2^20, 17 are over.
  r = Request(256, 1, 256);
  r.set_batch(17);
  s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message().rfind("batch: 17 matrices A of 65536 elements each are 1114112", 0), 0u)
      << s.message();
  r.set_batch(16);
  r.set_a(std::string(16 * 2 * 256 * 256, '\1'));
  r.set_b(std::string(16 * 2 * 256, '\1'));
  EXPECT_TRUE(ValidateGemmRequest(r, Rules(), &job).ok());

  v1::GemmHeader header;
  header.set_m(2);
  header.set_n(2);
  header.set_k(2);
  header.set_batch(3);
  header.set_a_handle("h");
  s = ValidateGemmHeader(header, Rules(), &job);
  EXPECT_EQ(s.message().rfind("header.a_handle: holds one matrix", 0), 0u) << s.message();
}

// A grouped request of fp16 problems (m, n, k each), operands of the right sizes.
v1::GemmRequest GroupedRequest(const std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>& problems) {
  v1::GemmRequest r;
  for (auto [m, n, k] : problems) {
    v1::GroupedProblem* p = r.add_group();
    p->set_m(m);
    p->set_n(n);
    p->set_k(k);
    r.mutable_a()->append(2 * m * k, '\1');
    r.mutable_b()->append(2 * k * n, '\1');
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
  ASSERT_TRUE(ValidateGemmRequest(GroupedRequest({{3, 5, 7}, {1, 2, 9}}), GroupedRules(), &job).ok());
  ASSERT_EQ(job.shape.group.size(), 2u);
  EXPECT_EQ(job.shape.group[1].k, 9);
  EXPECT_EQ(job.shape.m, 0);
  EXPECT_EQ(job.shape.ABytes(), 2 * (3 * 7 + 1 * 9));
  EXPECT_EQ(job.shape.BBytes(), 2 * (7 * 5 + 9 * 2));
  EXPECT_EQ(job.shape.CBytes(), 2 * (3 * 5 + 1 * 2));
  EXPECT_EQ(job.shape.Flops(), 2 * (3 * 5 * 7 + 1 * 2 * 9));
}

TEST(Validation, GroupRefusalsNameTheirField) {
  const v1::GemmRequest good = GroupedRequest({{3, 5, 7}, {1, 2, 9}});
  auto refused = [](const v1::GemmRequest& r, const RequestRules& rules, absl::StatusCode code,
                    const std::string& prefix) {
    GemmJob job;
    absl::Status s = ValidateGemmRequest(r, rules, &job);
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_EQ(s.message().rfind(prefix, 0), 0u) << s.message();
  };
  v1::GemmRequest r = good;
  r.set_m(3);
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "m: 3 with a group");
  r = good;
  r.set_batch(2);
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "batch: 2 with a group");
  r = good;
  r.mutable_group(1)->set_n(0);
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "group[1].n: must be at least 1");
  r = good;
  r.mutable_a()->pop_back();
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "a: 59 bytes");
  r = good;
  r.mutable_b()->append("xx");
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "b: 108 bytes");
  r = good;
  r.set_beta(2);
  r.set_c_in(std::string(2 * 15, '\1'));  // C_0 only: C_1 missing
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "c_in: 30 bytes");
  r = good;
  r.set_b_handle("m-1");
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "b_handle: a grouped GEMM");
  r = good;
  r.mutable_c_region()->set_region("r-1");
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "c_region: a grouped GEMM");
  r = good;
  r.set_keep_c_resident(true);
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "keep_c_resident:");
  r = good;
  r.mutable_options()->set_kernel("fast");
  refused(r, GroupedRules(), absl::StatusCode::kInvalidArgument, "options.kernel: 'fast' takes no");
  refused(good, Rules(), absl::StatusCode::kInvalidArgument, "options.kernel: 'auto' takes no");
  refused(GroupedRequest({{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}}), GroupedRules(),
          absl::StatusCode::kResourceExhausted, "group has 4 problems");
  // Each problem within the limit of 2^20 elements, the sum over the group past it.
  r = GroupedRequest({});
  for (int i = 0; i < 2; ++i) {
    v1::GroupedProblem* p = r.add_group();
    p->set_m(1024);
    p->set_n(1);
    p->set_k(600);
  }
  refused(r, GroupedRules(), absl::StatusCode::kResourceExhausted,
          "group: the A matrices of problems 0..1 have 1228800 elements");
  // One problem past it, with dimensions whose products overflow 32 bits.
  r.mutable_group(0)->set_m(4000000000u);
  r.mutable_group(0)->set_k(4000000000u);
  refused(r, GroupedRules(), absl::StatusCode::kResourceExhausted, "group[0]: A (m x k)");
}

}  // namespace
}  // namespace hgemm
