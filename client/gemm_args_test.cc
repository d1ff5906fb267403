// GemmArgs: what is refused before anything is sent, and the request made of what passes.
#include "client/gemm_args.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hgemm {
namespace {

// An m×n×k fp16 GEMM's operand bytes (the values do not matter to the checks).
struct Bytes {
  Bytes(uint32_t m, uint32_t n, uint32_t k) : a(2 * m * k, 'a'), b(2 * k * n, 'b') {}
  OperandBytes operands() const { return {a.data(), a.size(), b.data(), b.size()}; }
  std::string a, b;
};

void ExpectRefused(const grpc::Status& status, const std::string& says) {
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find(says), std::string::npos) << status.error_message();
}

TEST(GemmArgs, ABytesGemmIsCopiedIntoItsRequest) {
  const Bytes bytes(3, 5, 4);
  const std::vector<uint16_t> c_in(3 * 5, 0x3C00);
  GemmArgs args;
  args.kernel = "wmma";
  args.request_id = "r1";
  args.verify = true;
  args.verify_repetitions = 2;
  args.alpha = 0.5f;
  args.beta = 2;
  args.c_in = c_in.data();
  args.c_in_bytes = c_in.size() * 2;
  ASSERT_TRUE(args.Check(3, 5, 4, bytes.operands(), 2 * 3 * 5).ok());
  v1::GemmRequest request;
  args.Request(3, 5, 4, bytes.operands(), &request);
  EXPECT_EQ(request.m(), 3u);
  EXPECT_EQ(request.n(), 5u);
  EXPECT_EQ(request.k(), 4u);
  EXPECT_EQ(request.a(), bytes.a);
  EXPECT_EQ(request.b(), bytes.b);
  EXPECT_EQ(request.c_in().size(), c_in.size() * 2);
  EXPECT_EQ(request.options().kernel(), "wmma");
  EXPECT_EQ(request.options().request_id(), "r1");
  EXPECT_TRUE(request.options().verify());
  EXPECT_EQ(request.options().verify_repetitions(), 2u);
  EXPECT_EQ(request.alpha(), 0.5f);
  EXPECT_EQ(request.beta(), 2.0f);
}

TEST(GemmArgs, DetachedOperandsAreOnlyNamed) {
  const Bytes bytes(2, 2, 2);
  GemmArgs args;
  args.b_handle = "h-b";
  v1::GemmRequest request;
  OperandBytes detached;
  args.Request(2, 2, 2, {bytes.a.data(), bytes.a.size(), nullptr, 0}, &request, &detached);
  EXPECT_FALSE(request.has_a());
  EXPECT_EQ(detached.a, bytes.a.data());
  EXPECT_EQ(detached.a_bytes, bytes.a.size());
  EXPECT_EQ(request.b_handle(), "h-b");
  EXPECT_EQ(detached.b, nullptr);
}

TEST(GemmArgs, ACInWithBetaZeroIsNotSent) {
  const Bytes bytes(2, 2, 2);
  const std::string c_in(8, 'c');
  GemmArgs args;
  args.c_in = c_in.data();
  args.c_in_bytes = c_in.size();
  v1::GemmRequest request;
  args.Request(2, 2, 2, bytes.operands(), &request);
  EXPECT_FALSE(request.has_c_in());
}

TEST(GemmArgs, SizesAreCheckedAgainstTheShapeTypesAndBatch) {
  const Bytes bytes(4, 4, 4);
  GemmArgs args;
  ExpectRefused(args.Check(4, 4, 5, bytes.operands(), 32), "a_bytes is 32; an 4x5 fp16 A is 40");
  ExpectRefused(args.Check(4, 4, 4, bytes.operands(), 31),
                "c_capacity is 31 bytes; an 4x4 fp16 C needs 32");
  args.c_dtype = v1::DATA_TYPE_FP32;
  ExpectRefused(args.Check(4, 4, 4, bytes.operands(), 32), "an 4x4 fp32 C needs 64");
  EXPECT_TRUE(args.Check(4, 4, 4, bytes.operands(), GemmArgs::kCKept).ok());
  args.c_dtype = v1::DATA_TYPE_UNSPECIFIED;
  args.batch = 2;
  ExpectRefused(args.Check(4, 4, 4, bytes.operands(), 64), "a_bytes is 32");
  const Bytes two(8, 8, 4);  // 64 bytes of A and of B: two 4x4x4 GEMMs
  EXPECT_TRUE(args.Check(4, 4, 4, {two.a.data(), 64, two.b.data(), 64}, 64).ok());
  args.batch = 0;
  args.c_in = bytes.a.data();
  args.c_in_bytes = 30;
  ExpectRefused(args.Check(4, 4, 4, bytes.operands(), 32), "c_in_bytes is 30");
}

TEST(GemmArgs, TypesOutOfRangeAreRefused) {
  const Bytes bytes(2, 2, 2);
  GemmArgs args;
  args.dtype = v1::DATA_TYPE_FP32;  // C only
  ExpectRefused(args.Check(2, 2, 2, bytes.operands(), 8), "dtype 3 is not");
  args.dtype = static_cast<v1::DataType>(7);
  ExpectRefused(args.Check(2, 2, 2, bytes.operands(), 8), "dtype 7 is not");
  args.dtype = v1::DATA_TYPE_BF16;
  args.c_dtype = static_cast<v1::DataType>(-1);
  ExpectRefused(args.Check(2, 2, 2, bytes.operands(), 8), "c_dtype -1 is not");
}

TEST(GemmArgs, AnOperandHasOneSource) {
  const Bytes bytes(2, 2, 2);
  GemmArgs args;
  args.a_handle = "h-a";
  ExpectRefused(args.Check(2, 2, 2, bytes.operands(), 8), "a: pass NULL and 0 bytes");
  EXPECT_TRUE(args.Check(2, 2, 2, {nullptr, 0, bytes.b.data(), 8}, 8).ok());
  args.a_region.set_region("r");
  ExpectRefused(args.Check(2, 2, 2, {nullptr, 0, bytes.b.data(), 8}, 8, GemmArgs::Regions::kTaken),
                "a: given both by handle and in a region");
  args.a_handle.clear();
  ExpectRefused(args.Check(2, 2, 2, {nullptr, 0, bytes.b.data(), 8}, 8),
                "regions: only hgemm_gemm() takes");
  args.c_in_region.set_region("r");
  args.c_in_handle = "h-c";
  ExpectRefused(args.Check(2, 2, 2, {nullptr, 0, bytes.b.data(), 8}, 8, GemmArgs::Regions::kTaken),
                "c_in: given in a region and as bytes or by handle");
}

TEST(GemmArgs, AGroupFormNamesNoOperands) {
  GemmArgs args;
  args.transpose_a = true;
  EXPECT_TRUE(args.CheckGroupForm().ok());
  for (int i = 0; i < 3; ++i) {
    GemmArgs named = args;
    if (i == 0) named.b_handle = "h";
    if (i == 1) named.c_region.set_region("r");
    if (i == 2) named.batch = 2;
    ExpectRefused(named.CheckGroupForm(), "a grouped GEMM takes no handles");
  }
}

TEST(GemmArgs, ARingEntryCarriesNoBytes) {
  GemmArgs args;
  args.a_region.set_region("r");
  args.b_handle = "h-b";
  ExpectRefused(args.CheckRingEntry(2, 2, 2, /*keep_c=*/false), "c: a ring GEMM writes C into");
  EXPECT_TRUE(args.CheckRingEntry(2, 2, 2, /*keep_c=*/true).ok());
  args.c_region.set_region("r");
  EXPECT_TRUE(args.CheckRingEntry(2, 2, 2, /*keep_c=*/false).ok());
  ExpectRefused(args.CheckRingEntry(2, 2, 2, /*keep_c=*/true), "c: a kept C goes to no region");
  args.b_handle.clear();
  ExpectRefused(args.CheckRingEntry(2, 2, 2, false), "b: a ring entry carries no bytes");
  args.b_handle = "h-b";
  const std::string c_in(8, 'c');
  args.c_in = c_in.data();
  args.c_in_bytes = c_in.size();
  ExpectRefused(args.CheckRingEntry(2, 2, 2, false), "c_in: a ring entry carries no bytes");
}

}  // namespace
}  // namespace hgemm
