// Layouts and types end to end: a real HgemmServer on 127.0.0.1 (CPU backend) and
// the real client library; every layout × dtype × C type on odd shapes against a float64
// reference, unary and streamed, with alpha/beta and a C input (inline, streamed, a kept C by
// handle), strided-batched, resident operands of a dtype, and the refusals naming their fields.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
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
    requests.push_back(FormRequest(m + 40, n + 30, k + 20, f.transpose_a, f.transpose_b, f.dtype,
                                   f.c_dtype, rng_));
    forms.push_back(f);
  }
  std::vector<const v1::GemmRequest*> pointers;
  std::vector<StreamedGemm> results;
  for (const v1::GemmRequest& r : requests) pointers.push_back(&r);
  // One stream: the server's C buffers come from its pool, reused across these GEMMs.
  ASSERT_TRUE(client_->GemmStream(pointers, &results).ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok())
        << Name(forms[i]) << ": " << results[i].status.error_message();
    EXPECT_LT(RelativeErrorOfC(requests[i], results[i].response.c()), Tolerance(forms[i]))
        << Name(forms[i]);
  }
}

TEST_F(GemmFormsTest, ResidentOperandsCarryTheirDtype) {
  const uint32_t m = 19, n = 23, k = 29;
  // B of nn.Linear's layout (n×k) in bf16, resident; A inline, transposed (k×m).
  v1::GemmRequest r =
      FormRequest(m, n, k, true, true, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP32, rng_);
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
  v1::GemmRequest chained =
      FormRequest(m, 5, n, false, false, v1::DATA_TYPE_BF16, v1::DATA_TYPE_UNSPECIFIED, rng_);
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
  v1::GemmRequest good =
      FormRequest(6, 5, 4, false, true, v1::DATA_TYPE_BF16, v1::DATA_TYPE_UNSPECIFIED, rng_);
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
  grpc::Status s =
      client_->UploadMatrix(2, 2, std::string(16, '\0'), &info, 0, "", {}, v1::DATA_TYPE_FP32);
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

// alpha/beta with a C input: C = alpha·op(A)·op(B) + beta·C_in.
struct Scale {
  std::optional<float> alpha;  // unset: the wire's default (1)
  float beta;
};

std::string Name(const Form& f, const Scale& scale) {
  return Name(f) + " alpha " + (scale.alpha ? std::to_string(*scale.alpha) : "unset") + " beta " +
         std::to_string(scale.beta);
}

const std::vector<Scale> kScales = {{2.5f, 0}, {0.5f, -1.5f}, {std::nullopt, 1}, {0, 2}};

// `r` with `scale` and, when beta ≠ 0, a random inline C_in.
v1::GemmRequest Scaled(v1::GemmRequest r, const Scale& scale, std::mt19937_64& rng) {
  if (scale.alpha) r.set_alpha(*scale.alpha);
  r.set_beta(scale.beta);
  if (scale.beta != 0) SetRandomCIn(&r, rng);
  return r;
}

TEST_F(GemmFormsTest, UnaryScaledEveryLayoutAndTypeMatchesFloat64) {
  for (const Form& f : AllForms()) {
    for (const Scale& scale : kScales) {
      for (auto [m, n, k] : {kOddShapes[1], kOddShapes[3]}) {
        v1::GemmRequest r =
            Scaled(FormRequest(m, n, k, f.transpose_a, f.transpose_b, f.dtype, f.c_dtype, rng_),
                   scale, rng_);
        v1::GemmResponse response;
        grpc::Status s = client_->Gemm(r, &response);
        ASSERT_TRUE(s.ok()) << Name(f, scale) << ": " << s.error_message();
        EXPECT_LT(RelativeErrorOfC(r, response.c()), Tolerance(f))
            << Name(f, scale) << " " << m << "x" << n << "x" << k;
      }
    }
  }
}

TEST_F(GemmFormsTest, StreamedScaledMatchesFloat64) {
  std::vector<v1::GemmRequest> requests;
  std::vector<std::string> names;
  for (const Form& f : AllForms()) {
    const Scale& scale = kScales[requests.size() % kScales.size()];
    requests.push_back(
        Scaled(FormRequest(45, 37, 29, f.transpose_a, f.transpose_b, f.dtype, f.c_dtype, rng_),
               scale, rng_));
    names.push_back(Name(f, scale));
  }
  std::vector<const v1::GemmRequest*> pointers;
  for (const v1::GemmRequest& r : requests) pointers.push_back(&r);
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream(pointers, &results).ok());  // C_in in several chunks
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << names[i] << ": " << results[i].status.error_message();
    EXPECT_LT(RelativeErrorOfC(requests[i], results[i].response.c()),
              kServiceTolerance.fp32_acc * 4)
        << names[i];
  }
}

TEST_F(GemmFormsTest, BetaZeroNeverReadsCIn) {
  for (v1::DataType c_dtype : {v1::DATA_TYPE_UNSPECIFIED, v1::DATA_TYPE_FP32}) {
    v1::GemmRequest r = FormRequest(13, 11, 9, false, true, v1::DATA_TYPE_FP16, c_dtype, rng_);
    r.set_alpha(-3);
    // All ones bits: NaN in fp16 and in fp32.
    r.set_c_in(
        std::string(size_t(r.m()) * r.n() * (c_dtype == v1::DATA_TYPE_FP32 ? 4 : 2), '\xff'));
    v1::GemmResponse response;
    ASSERT_TRUE(client_->Gemm(r, &response).ok());
    EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc);  // NaN: infinity

    std::vector<StreamedGemm> results;  // a stream sends no C_in for beta 0
    ASSERT_TRUE(client_->GemmStream({&r}, &results).ok());
    ASSERT_TRUE(results[0].status.ok()) << results[0].status.error_message();
    EXPECT_LT(RelativeErrorOfC(r, results[0].response.c()), kServiceTolerance.fp32_acc);
  }
}

TEST_F(GemmFormsTest, KeptFp32CIsTheNextGemmsCIn) {
  const uint32_t m = 21, n = 17, k = 33;
  v1::GemmRequest first =
      FormRequest(m, n, k, true, false, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP32, rng_);
  first.set_keep_c_resident(true);
  v1::GemmResponse kept;
  ASSERT_TRUE(client_->Gemm(first, &kept).ok());
  ASSERT_EQ(kept.c_matrix().dtype(), v1::DATA_TYPE_FP32);

  // Accumulate into it: C2 = A2·B2 - 0.5·C1, C1 by handle (unary and streamed).
  v1::GemmRequest second =
      FormRequest(m, n, 7, false, false, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP32, rng_);
  second.set_beta(-0.5f);
  second.set_c_in_handle(kept.c_matrix().handle());
  v1::GemmRequest expected = second;  // the same with C1's bytes inline, for the reference
  ASSERT_TRUE(client_->DownloadMatrix(kept.c_matrix().handle(), expected.mutable_c_in()).ok());
  v1::GemmResponse response;
  ASSERT_TRUE(client_->Gemm(second, &response).ok());
  EXPECT_LT(RelativeErrorOfC(expected, response.c()), kKernelTolerance.fp32_acc);
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&second}, &results).ok());
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.error_message();
  EXPECT_LT(RelativeErrorOfC(expected, results[0].response.c()), kKernelTolerance.fp32_acc);

  // C_in has C's type and shape.
  v1::GemmRequest r = second;
  r.set_c_dtype(v1::DATA_TYPE_BF16);
  ExpectRefused(r, "c_in_handle", "fp32");
  r = second;
  r.set_m(m - 1);
  r.set_a(r.a().substr(0, size_t(r.m()) * r.k() * 2));
  ExpectRefused(r, "c_in_handle", "m x n");
  r = second;
  r.set_c_in_handle("no-such-handle");
  grpc::Status s = client_->Gemm(r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
}

TEST_F(GemmFormsTest, ScaleRefusalsNameTheirField) {
  v1::GemmRequest good =
      FormRequest(6, 5, 4, true, false, v1::DATA_TYPE_FP16, v1::DATA_TYPE_UNSPECIFIED, rng_);
  good.set_beta(2);
  SetRandomCIn(&good, rng_);
  v1::GemmRequest r = good;
  r.clear_c_in();
  ExpectRefused(r, "beta", "C input");
  r = good;
  r.mutable_c_in()->pop_back();
  ExpectRefused(r, "c_in", "m x n");
  r = good;
  r.set_c_dtype(v1::DATA_TYPE_FP32);  // C_in of fp16 bytes for an fp32 C
  ExpectRefused(r, "c_in", "fp32");
  r = good;
  r.set_alpha(NAN);
  ExpectRefused(r, "alpha", "finite");
  r = good;
  r.set_beta(INFINITY);
  ExpectRefused(r, "beta", "finite");
  r = good;
  r.set_c_in_handle("");
  ExpectRefused(r, "c_in_handle", "empty");
  r = good;
  r.mutable_c_in_region()->set_offset(0);
  ExpectRefused(r, "c_in_region.region");

  // On a stream, the header's fields.
  v1::GemmRequest streamed = good;
  streamed.set_alpha(NAN);
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&streamed}, &results).ok());
  EXPECT_EQ(results[0].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(results[0].status.error_message().rfind("gemm_id 0: header.alpha:", 0), 0u)
      << results[0].status.error_message();
}

// Strided-batched (packed): every layout × dtype × C type × scale with a batch, unary and
// streamed, against float64 per matrix of the batch.
TEST_F(GemmFormsTest, BatchedEveryFormAndScaleMatchesFloat64) {
  std::vector<v1::GemmRequest> requests;
  std::vector<std::string> names;
  for (const Form& f : AllForms()) {
    const Scale& scale = kScales[requests.size() % kScales.size()];
    const uint32_t batch = 2 + requests.size() % 4;
    requests.push_back(Scaled(
        FormRequest(13, 7, 11, f.transpose_a, f.transpose_b, f.dtype, f.c_dtype, rng_, batch),
        scale, rng_));
    names.push_back(Name(f, scale) + " batch " + std::to_string(batch));
    v1::GemmResponse response;
    grpc::Status s = client_->Gemm(requests.back(), &response);
    ASSERT_TRUE(s.ok()) << names.back() << ": " << s.error_message();
    EXPECT_LT(RelativeErrorOfC(requests.back(), response.c()), Tolerance(f)) << names.back();
  }
  std::vector<const v1::GemmRequest*> pointers;
  for (const v1::GemmRequest& r : requests) pointers.push_back(&r);
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream(pointers, &results).ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << names[i] << ": " << results[i].status.error_message();
    EXPECT_LT(RelativeErrorOfC(requests[i], results[i].response.c()),
              kServiceTolerance.fp32_acc * 4)
        << names[i];
  }
}

TEST_F(GemmFormsTest, BatchRefusalsNameTheirField) {
  const v1::GemmRequest good =
      FormRequest(6, 5, 4, false, true, v1::DATA_TYPE_FP16, v1::DATA_TYPE_UNSPECIFIED, rng_, 3);
  v1::GemmRequest r = good;
  r.mutable_a()->resize(2 * 6 * 4 * 2);  // two of the three A matrices: the buffer ends early
  ExpectRefused(r, "a", "for the batch of 3");
  r = good;
  r.mutable_b()->append(2 * 5 * 4, '\0');  // a fourth B: past the batch
  ExpectRefused(r, "b", "for the batch of 3");
  r = good;
  r.set_beta(1);
  SetRandomCIn(&r, rng_);
  r.mutable_c_in()->resize(2 * 6 * 5);  // one C_in for three GEMMs
  ExpectRefused(r, "c_in", "for the batch of 3");
  r = good;
  r.set_b_handle("h");  // a resident matrix is one matrix
  ExpectRefused(r, "b_handle", "batch of 3");
  r = good;
  r.set_keep_c_resident(true);
  ExpectRefused(r, "keep_c_resident", "batch of 3");

  // A batch over the per-matrix limit of elements (2^28 by default), before any byte is sent.
  r = FormRequest(1, 1, 1, false, false, v1::DATA_TYPE_FP16, v1::DATA_TYPE_UNSPECIFIED, rng_);
  r.set_m(1 << 14);
  r.set_k(1 << 14);
  r.set_batch(2);
  v1::GemmResponse response;
  grpc::Status s = client_->Gemm(r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("batch: 2 matrices A"), std::string::npos) << s.error_message();
}

TEST_F(GemmFormsTest, ListKernelsSaysWhichTakeAlphaBeta) {
  v1::ListKernelsResponse kernels;
  ASSERT_TRUE(client_->ListKernels(&kernels).ok());
  for (const v1::KernelInfo& k : kernels.kernels()) {
    ASSERT_EQ(k.scaled_types_size(), 4) << k.name();
    EXPECT_EQ(k.scaled_types(3).dtype(), v1::DATA_TYPE_BF16);
    EXPECT_EQ(k.scaled_types(3).c_dtype(), v1::DATA_TYPE_FP32);
    // The CPU backend's sgemm applies alpha/beta in the same call, and so does auto here.
    EXPECT_TRUE(k.fused_scale()) << k.name();
  }
}

}  // namespace
}  // namespace hgemm
