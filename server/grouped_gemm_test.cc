// Grouped GEMM end to end: a real HgemmServer on 127.0.0.1 (CPU backend) and the real
// client library; groups of odd shapes in every layout × dtype × C type, with alpha/beta and
// C_in, against a float64 reference; every refusal names its field, and the server keeps
// serving after them.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "client/gemm_client.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

using Problems = std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>;

const Problems kOddProblems = {{7, 5, 3}, {1, 1, 1}, {33, 17, 65}, {61, 2, 93}, {3, 40, 1}};
constexpr int64_t kMaxGroupProblems = 8;

class GroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.service.rules.max_group_problems = kMaxGroupProblems;
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>("127.0.0.1:" + std::to_string(server_->port()));
  }

  // A unary request expected to be refused with `code`: its message must start with `prefix`.
  void ExpectRefused(const v1::GemmRequest& r, grpc::StatusCode code, const std::string& prefix) {
    v1::GemmResponse response;
    grpc::Status s = client_->Gemm(r, &response);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_EQ(s.error_message().rfind(prefix, 0), 0u) << s.error_message();
  }

  std::mt19937_64 rng_{20261205};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(GroupedGemmTest, EveryFormAndScaleMatchesFloat64) {
  const std::vector<std::pair<std::optional<float>, float>> scales = {
      {std::nullopt, 0}, {0.5f, -1.5f}, {2.5f, 0}, {std::nullopt, 1}};
  int run = 0;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (v1::DataType ab : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_BF16}) {
        for (v1::DataType c_type : {v1::DATA_TYPE_UNSPECIFIED, v1::DATA_TYPE_FP32}) {
          auto [alpha, beta] = scales[run++ % scales.size()];
          v1::GemmRequest r = GroupRequest(kOddProblems, ta, tb, ab, c_type, rng_);
          if (alpha) r.set_alpha(*alpha);
          r.set_beta(beta);
          if (beta != 0) SetRandomCIn(&r, rng_);
          const std::string name = std::string(ta ? "T" : "N") + (tb ? "T " : "N ") +
                                   v1::DataType_Name(ab) + " -> " + v1::DataType_Name(c_type) +
                                   " beta " + std::to_string(beta);
          v1::GemmResponse response;
          grpc::Status s = client_->Gemm(r, &response);
          ASSERT_TRUE(s.ok()) << name << ": " << s.error_message();
          EXPECT_EQ(response.m(), 0u);
          const double tolerance = c_type == v1::DATA_TYPE_FP32 ? kKernelTolerance.fp32_acc
                                   : ab == v1::DATA_TYPE_BF16   ? kKernelToleranceBf16
                                                                : kServiceTolerance.fp32_acc;
          // RelativeErrorOfC also fails a C of the wrong size (not the problems' C_i packed).
          EXPECT_LT(RelativeErrorOfC(r, response.c()), tolerance) << name;
          EXPECT_GT(response.timing().tflops(), 0) << name;
        }
      }
    }
  }
}

// Each problem's C is where the packing says: a group's C_i are bit-identical to the same
// problems sent one by one.
TEST_F(GroupedGemmTest, EachProblemsCIsThatOfItsOwnGemm) {
  const v1::GemmRequest group =
      GroupRequest(kOddProblems, false, true, v1::DATA_TYPE_FP16, v1::DATA_TYPE_FP32, rng_);
  v1::GemmResponse grouped;
  ASSERT_TRUE(client_->Gemm(group, &grouped).ok());
  std::string one_by_one;
  size_t a_offset = 0, b_offset = 0;
  for (auto [m, n, k] : kOddProblems) {
    v1::GemmRequest one;
    one.set_m(m);
    one.set_n(n);
    one.set_k(k);
    one.set_transpose_b(true);
    one.set_c_dtype(v1::DATA_TYPE_FP32);
    one.set_a(group.a().substr(a_offset, 2 * m * k));
    one.set_b(group.b().substr(b_offset, 2 * k * n));
    a_offset += 2 * m * k;
    b_offset += 2 * k * n;
    v1::GemmResponse response;
    ASSERT_TRUE(client_->Gemm(one, &response).ok());
    one_by_one += response.c();
  }
  EXPECT_EQ(grouped.c(), one_by_one);
}

TEST_F(GroupedGemmTest, RefusalsNameTheirFieldAndTheServerKeepsServing) {
  const v1::GemmRequest good = GroupRequest({{6, 5, 4}, {3, 2, 7}}, false, false,
                                            v1::DATA_TYPE_FP16, v1::DATA_TYPE_UNSPECIFIED, rng_);
  const auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  v1::GemmRequest r = good;
  r.set_m(6);  // mixing a single shape with a group
  ExpectRefused(r, kInvalid, "m: 6 with a group");
  r = good;
  r.set_batch(3);  // mixing a batch with a group
  ExpectRefused(r, kInvalid, "batch: 3 with a group");
  r = good;
  r.mutable_group(1)->set_k(0);
  ExpectRefused(r, kInvalid, "group[1].k: must be at least 1");
  r = good;
  r.mutable_a()->resize(2 * 6 * 4);  // A_1 missing
  ExpectRefused(r, kInvalid, "a: 48 bytes; the 2 problems' matrices");
  r = good;
  r.mutable_b()->append(2, '\0');
  ExpectRefused(r, kInvalid, "b: 70 bytes; the 2 problems' matrices");
  r = good;
  r.set_beta(1);  // beta without C_in
  ExpectRefused(r, kInvalid, "beta:");
  SetRandomCIn(&r, rng_);
  r.mutable_c_in()->resize(2 * 6 * 5);  // C_in_0 only
  ExpectRefused(r, kInvalid, "c_in: 60 bytes");
  r = good;
  r.set_a_handle("m-00000000000000000000000000000000");
  ExpectRefused(r, kInvalid, "a_handle: a grouped GEMM takes its operands inline");
  r = good;
  r.set_keep_c_resident(true);
  ExpectRefused(r, kInvalid, "keep_c_resident: a grouped GEMM");
  r = good;
  r.mutable_options()->set_kernel("no_such_kernel");
  ExpectRefused(r, kInvalid, "options.kernel: unknown kernel");
  r = good;
  r.set_dtype(v1::DATA_TYPE_FP32);
  ExpectRefused(r, kInvalid, "dtype:");

  // Too many problems, a problem past the limit per matrix (2^28 elements by default), the
  // group's sum past it: refused before any byte is looked at.
  Problems many(kMaxGroupProblems + 1, {1, 1, 1});
  ExpectRefused(
      GroupRequest(many, false, false, v1::DATA_TYPE_FP16, v1::DATA_TYPE_UNSPECIFIED, rng_),
      grpc::StatusCode::RESOURCE_EXHAUSTED, "group has 9 problems; this server takes at most 8");
  r = v1::GemmRequest();
  for (auto [m, n, k] : {std::tuple{1u << 14, 1u, 1u << 14}, std::tuple{1u, 1u, 1u}}) {
    v1::GroupedProblem* p = r.add_group();
    p->set_m(m);
    p->set_n(n);
    p->set_k(k);
  }
  ExpectRefused(r, grpc::StatusCode::RESOURCE_EXHAUSTED,
                "group: the A matrices of problems 0..1 have 268435457 elements");
  r.mutable_group(1)->set_m(4294967295u);
  r.mutable_group(1)->set_n(4294967295u);
  ExpectRefused(r, grpc::StatusCode::RESOURCE_EXHAUSTED, "group[1]: A (m x k)");

  v1::GemmResponse response;
  ASSERT_TRUE(client_->Gemm(good, &response).ok());
  EXPECT_LT(RelativeErrorOfC(good, response.c()), kServiceTolerance.fp32_acc);
}

// GemmClient::GemmGrouped packs the problems' operands and splits C back per problem; it
// refuses an empty group and an operand of the wrong size before any call.
TEST_F(GroupedGemmTest, ClientPacksOperandsAndSplitsC) {
  v1::GemmRequest r =
      GroupRequest(kOddProblems, true, false, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP32, rng_);
  r.set_alpha(-2);
  r.set_beta(0.5f);
  SetRandomCIn(&r, rng_);
  std::vector<GroupedOperands> problems;
  size_t a_offset = 0, b_offset = 0, c_offset = 0;
  for (auto [m, n, k] : kOddProblems) {
    problems.push_back({.m = m,
                        .n = n,
                        .k = k,
                        .a = std::string_view(r.a()).substr(a_offset, 2 * m * k),
                        .b = std::string_view(r.b()).substr(b_offset, 2 * k * n),
                        .c_in = std::string_view(r.c_in()).substr(c_offset, 4 * m * n)});
    a_offset += 2 * m * k;
    b_offset += 2 * k * n;
    c_offset += 4 * m * n;
  }
  std::vector<std::string> c;
  v1::GemmResponse response;
  ASSERT_TRUE(client_->GemmGrouped(r, problems, &c, &response).ok());
  ASSERT_EQ(c.size(), kOddProblems.size());
  std::string packed;
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].size(), 4 * std::get<0>(kOddProblems[i]) * std::get<1>(kOddProblems[i])) << i;
    packed += c[i];
  }
  EXPECT_LT(RelativeErrorOfC(r, packed), kKernelTolerance.fp32_acc);
  EXPECT_TRUE(response.c().empty());
  EXPECT_EQ(response.execution().backend(), "cpu");

  const uint64_t admitted = [&] {
    v1::ServerInfo info;
    EXPECT_TRUE(client_->GetServerInfo(&info).ok());
    return info.load().admitted_total();
  }();
  grpc::Status s = client_->GemmGrouped(r, {}, &c);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  problems[2].b = problems[2].b.substr(2);
  s = client_->GemmGrouped(r, problems, &c);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("problems[2].b:", 0), 0u) << s.error_message();
  v1::ServerInfo info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.load().admitted_total(), admitted);  // neither was sent
}

TEST_F(GroupedGemmTest, ListKernelsAndLimitsSayGroupsAreTaken) {
  v1::ListKernelsResponse kernels;
  ASSERT_TRUE(client_->ListKernels(&kernels).ok());
  ASSERT_GE(kernels.kernels_size(), 2);
  for (const v1::KernelInfo& k : kernels.kernels()) EXPECT_TRUE(k.grouped()) << k.name();
  v1::ServerInfo info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.limits().max_group_problems(), uint32_t(kMaxGroupProblems));
}

}  // namespace
}  // namespace hgemm
