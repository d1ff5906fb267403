#include "server/validation.h"

#include <gtest/gtest.h>

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
    grpc::Status s = ValidateGemmRequest(Request(m, n, k), Rules(), &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message().rfind(field, 0), 0u) << s.error_message();
  }
}

TEST(Validation, WrongByteLengthIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(4, 4, 4);
  r.mutable_a()->pop_back();
  grpc::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("a: 31 bytes"), std::string::npos) << s.error_message();
  r = Request(4, 4, 4);
  r.mutable_b()->append("xx");
  s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("b: 34 bytes"), std::string::npos) << s.error_message();
}

TEST(Validation, TooManyElementsIsResourceExhausted) {
  GemmJob job;
  v1::GemmRequest r;
  r.set_m(2048);
  r.set_n(1);
  r.set_k(1024);  // A has 2^21 elements > 2^20
  grpc::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("A (m x k)"), std::string::npos) << s.error_message();
}

TEST(Validation, UnknownKernelIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_kernel("nope");
  grpc::Status s = ValidateGemmRequest(r, Rules(), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("options.kernel: unknown kernel 'nope'"), std::string::npos);
}

TEST(Validation, KernelWithoutRequestedAccumulationIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_kernel("fp32only");
  r.mutable_options()->set_accumulation(v1::ACCUMULATION_FP16);
  EXPECT_EQ(ValidateGemmRequest(r, Rules(), &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r.mutable_options()->set_kernel("fast");
  ASSERT_TRUE(ValidateGemmRequest(r, Rules(), &job).ok());
  EXPECT_EQ(job.kernel, "fast");
  EXPECT_EQ(job.accumulation, Accumulation::kFp16);
}

TEST(Validation, UnknownAccumulationValueIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_accumulation(static_cast<v1::Accumulation>(42));
  EXPECT_EQ(ValidateGemmRequest(r, Rules(), &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(Validation, LongRequestIdIsInvalidArgument) {
  GemmJob job;
  v1::GemmRequest r = Request(2, 2, 2);
  r.mutable_options()->set_request_id(std::string(kMaxRequestIdBytes + 1, 'x'));
  EXPECT_EQ(ValidateGemmRequest(r, Rules(), &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace hgemm
