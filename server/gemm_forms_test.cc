// Layouts and types end to end (issue 29): a real HgemmServer on 127.0.0.1 (CPU backend) and
// the real client library; every layout × dtype × C type on odd shapes against a float64
// reference, unary and streamed, resident operands of a dtype, and the refusals naming their
// fields.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "client/gemm_client.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

struct Form {
  bool transpose_a, transpose_b;
  v1::DataType dtype, c_dtype;
};

std::string Name(const Form& f) {
  return std::string(f.transpose_a ? "T" : "N") + (f.transpose_b ? "T" : "N") + " " +
         v1::DataType_Name(f.dtype) + " -> " + v1::DataType_Name(f.c_dtype);
}

// Every layout × input type × C type (UNSPECIFIED C means the inputs' type).
std::vector<Form> AllForms() {
  std::vector<Form> forms;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (v1::DataType ab : {v1::DATA_TYPE_FP16, v1::DATA_TYPE_BF16}) {
        for (v1::DataType c : {v1::DATA_TYPE_UNSPECIFIED, ab, v1::DATA_TYPE_FP32}) {
          forms.push_back({ta, tb, ab, c});
        }
      }
    }
  }
  return forms;
}

// What a correct C of the form may be off by, against float64 on its inputs as stored.
double Tolerance(const Form& f) {
  if (f.c_dtype == v1::DATA_TYPE_FP32) return kKernelTolerance.fp32_acc;
  return f.dtype == v1::DATA_TYPE_BF16 ? kKernelToleranceBf16 : kServiceTolerance.fp32_acc;
}

const std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> kOddShapes = {
    {1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {61, 127, 93}};

class GemmFormsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.service.stream_chunk_bytes = 4 << 10;  // C in several chunks
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>("127.0.0.1:" + std::to_string(server_->port()));
  }

  // The status of a unary request expected to be refused with INVALID_ARGUMENT: its message
  // must start with `field` and contain `words`.
  void ExpectRefused(const v1::GemmRequest& r, const std::string& field,
                     const std::string& words = "") {
    v1::GemmResponse response;
    grpc::Status s = client_->Gemm(r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(s.error_message().rfind(field + ":", 0), 0u) << s.error_message();
    EXPECT_NE(s.error_message().find(words), std::string::npos) << s.error_message();
  }

  std::mt19937_64 rng_{20261204};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(GemmFormsTest, UnaryEveryLayoutAndTypeMatchesFloat64) {
  for (const Form& f : AllForms()) {
    for (auto [m, n, k] : kOddShapes) {
      v1::GemmRequest r =
          FormRequest(m, n, k, f.transpose_a, f.transpose_b, f.dtype, f.c_dtype, rng_);
      v1::GemmResponse response;
      grpc::Status s = client_->Gemm(r, &response);
      ASSERT_TRUE(s.ok()) << Name(f) << ": " << s.error_message();
      EXPECT_LT(RelativeErrorOfC(r, response.c()), Tolerance(f))
          << Name(f) << " " << m << "x" << n << "x" << k;
    }
  }
}

TEST_F(GemmFormsTest, StreamedEveryLayoutAndTypeMatchesFloat64) {
  std::vector<v1::GemmRequest> requests;
  std::vector<Form> forms;
  for (const Form& f : AllForms()) {
    auto [m, n, k] = kOddShapes[requests.size() % kOddShapes.size()];
    requests.push_back(
        FormRequest(m + 40, n + 30, k + 20, f.transpose_a, f.transpose_b, f.dtype, f.c_dtype, rng_));
    forms.push_back(f);
  }
  std::vector<const v1::GemmRequest*> pointers;
  std::vector<StreamedGemm> results;
  for (const v1::GemmRequest& r : requests) pointers.push_back(&r);
  // One stream: the server's C buffers come from its pool, reused across these GEMMs.
  ASSERT_TRUE(client_->GemmStream(pointers, &results).ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << Name(forms[i]) << ": " << results[i].status.error_message();
    EXPECT_LT(RelativeErrorOfC(requests[i], results[i].response.c()), Tolerance(forms[i]))
        << Name(forms[i]);
  }
}

TEST_F(GemmFormsTest, ResidentOperandsCarryTheirDtype) {
  const uint32_t m = 19, n = 23, k = 29;
  // B of nn.Linear's layout (n×k) in bf16, resident; A inline, transposed (k×m).
  v1::GemmRequest r = FormRequest(m, n, k, true, true, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP32, rng_);
  v1::MatrixInfo b_info;
  ASSERT_TRUE(client_->UploadMatrix(n, k, r.b(), &b_info, 0, "W", {}, v1::DATA_TYPE_BF16).ok());
  EXPECT_EQ(b_info.dtype(), v1::DATA_TYPE_BF16);
  EXPECT_EQ(b_info.bytes(), 2u * n * k);
  v1::GemmRequest by_handle = r;
  by_handle.set_b_handle(b_info.handle());
  by_handle.set_keep_c_resident(true);
  v1::GemmResponse response;
  ASSERT_TRUE(client_->Gemm(by_handle, &response).ok());
  EXPECT_EQ(response.c_matrix().dtype(), v1::DATA_TYPE_FP32);
  EXPECT_EQ(response.c_matrix().bytes(), 4u * m * n);
  std::string c;
  ASSERT_TRUE(client_->DownloadMatrix(response.c_matrix().handle(), &c).ok());
  EXPECT_LT(RelativeErrorOfC(r, c), kKernelTolerance.fp32_acc);

  // The same B untransposed is k×n: the stored n×k matrix is refused by its shape.
  v1::GemmRequest wrong_layout = by_handle;
  wrong_layout.set_transpose_b(false);
  wrong_layout.set_keep_c_resident(false);
  ExpectRefused(wrong_layout, "b_handle", "k x n");

  // Mixing dtypes: the bf16 matrix in an fp16 GEMM, and an fp32 C as an operand.
  v1::GemmRequest fp16 = by_handle;
  fp16.set_dtype(v1::DATA_TYPE_FP16);
  fp16.clear_c_dtype();
  fp16.set_keep_c_resident(false);
  ExpectRefused(fp16, "b_handle", "mixing dtypes");
  v1::GemmRequest chained = FormRequest(m, 5, n, false, false, v1::DATA_TYPE_BF16,
                                        v1::DATA_TYPE_UNSPECIFIED, rng_);
  chained.set_a_handle(response.c_matrix().handle());
  ExpectRefused(chained, "a_handle", "mixing dtypes");

  // And on a stream: the refusal is that GEMM's `done`.
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&fp16}, &results).ok());
  EXPECT_EQ(results[0].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(results[0].status.error_message().find("mixing dtypes"), std::string::npos)
      << results[0].status.error_message();
}

TEST_F(GemmFormsTest, RefusalsNameTheirField) {
  v1::GemmRequest good = FormRequest(6, 5, 4, false, true, v1::DATA_TYPE_BF16,
                                     v1::DATA_TYPE_UNSPECIFIED, rng_);
  v1::GemmRequest r = good;
  r.set_dtype(v1::DATA_TYPE_FP32);
  ExpectRefused(r, "dtype", "DATA_TYPE_BF16");
  r = good;
  r.set_dtype(v1::DataType(7));
  ExpectRefused(r, "dtype", "7");
  r = good;
  r.set_c_dtype(v1::DATA_TYPE_FP16);  // bf16 inputs: C is bf16 or fp32
  ExpectRefused(r, "c_dtype");
  r = good;
  r.set_c_dtype(v1::DataType(9));
  ExpectRefused(r, "c_dtype", "9");
  r = good;
  r.mutable_options()->set_accumulation(v1::ACCUMULATION_FP16);
  ExpectRefused(r, "options.accumulation");
  r = good;
  r.mutable_a()->append(r.a());  // 4 bytes per element: fp32 data sent as bf16
  ExpectRefused(r, "a", "bf16");
  r = good;
  r.mutable_b()->pop_back();
  ExpectRefused(r, "b", "n x k, transpose_b");

  // On a stream, the header's fields.
  v1::GemmRequest streamed = good;
  streamed.set_c_dtype(v1::DataType(9));
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&streamed}, &results).ok());
  EXPECT_EQ(results[0].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(results[0].status.error_message().rfind("gemm_id 0: header.c_dtype:", 0), 0u)
      << results[0].status.error_message();

  // An upload of a type no operand has.
  v1::MatrixInfo info;
  grpc::Status s = client_->UploadMatrix(2, 2, std::string(16, '\0'), &info, 0, "", {},
                                         v1::DATA_TYPE_FP32);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("header.dtype:", 0), 0u) << s.error_message();
}

TEST_F(GemmFormsTest, ListKernelsSaysLayoutsAndTypes) {
  v1::ListKernelsResponse kernels;
  ASSERT_TRUE(client_->ListKernels(&kernels).ok());
  ASSERT_EQ(kernels.kernels_size(), 2);  // auto, openblas_sgemm
  for (const v1::KernelInfo& k : kernels.kernels()) {
    EXPECT_EQ(std::vector<std::string>(k.layouts().begin(), k.layouts().end()),
              (std::vector<std::string>{"NN", "NT", "TN", "TT"}))
        << k.name();
    ASSERT_EQ(k.types_size(), 4) << k.name();
    EXPECT_EQ(k.types(1).dtype(), v1::DATA_TYPE_FP16);
    EXPECT_EQ(k.types(1).c_dtype(), v1::DATA_TYPE_FP32);
    EXPECT_EQ(k.types(2).dtype(), v1::DATA_TYPE_BF16);
    EXPECT_EQ(k.types(2).c_dtype(), v1::DATA_TYPE_BF16);
  }
}

}  // namespace
}  // namespace hgemm
