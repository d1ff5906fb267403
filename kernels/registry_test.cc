// Registry contracts that need no GPU: names, lookup, constraints and the fallback.
#include "kernels/registry.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace hgemm::kernels {
namespace {

TEST(Registry, NamesAreUniqueAndFindable) {
  std::set<std::string> names;
  for (const VariantInfo& v : Variants()) {
    EXPECT_TRUE(names.insert(v.name).second) << "duplicate " << v.name;
    EXPECT_EQ(FindVariant(v.name), &v);
    EXPECT_FALSE(v.description.empty()) << v.name;
    EXPECT_TRUE(v.fp16_acc || v.fp32_acc) << v.name;
    EXPECT_NE(v.can_implement, nullptr) << v.name;
    if (v.kind == VariantKind::kKernel) {
      EXPECT_NE(v.launch == nullptr, v.launch_with_context == nullptr)
          << v.name << ": one launch function";
      EXPECT_GT(v.smem_bytes, 0u) << v.name;
      EXPECT_LE(v.smem_bytes, 227u * 1024) << v.name;
      EXPECT_GT(v.stages, 1) << v.name;
    }
  }
  EXPECT_EQ(FindVariant("no_such_variant"), nullptr);
}

TEST(Registry, CublasAutoAndFallbackAreRegistered) {
  const VariantInfo* cublas = FindVariant("cublas");
  ASSERT_NE(cublas, nullptr);
  EXPECT_EQ(cublas->kind, VariantKind::kCublas);
  const VariantInfo* automatic = FindVariant("auto");
  ASSERT_NE(automatic, nullptr);
  EXPECT_EQ(automatic->kind, VariantKind::kAuto);
  const VariantInfo& fallback = FallbackVariant();
  EXPECT_TRUE(fallback.is_fallback);
  EXPECT_TRUE(fallback.fp16_acc && fallback.fp32_acc);
  EXPECT_TRUE(fallback.can_implement(7, 5, 3));
  EXPECT_TRUE(fallback.can_implement(1, 1, 1));
}

TEST(Registry, VariantNamedInTheIssueExists) {
  EXPECT_NE(FindVariant("wmma_128x128_s4_dsmem_swz"), nullptr);
  EXPECT_NE(FindVariant("wmma_256x256_s3_dsmem_swz"), nullptr);
}

TEST(Registry, FastKernelsRejectNOrKNotMultipleOf8) {
  for (const VariantInfo& v : Variants()) {
    if (v.kind != VariantKind::kKernel || v.is_fallback) continue;
    EXPECT_TRUE(v.can_implement(v.name == "skinny_m16" ? 16 : 1000, 1000, 1000)) << v.name;
    EXPECT_TRUE(v.can_implement(1, 8, 8)) << v.name;
    EXPECT_FALSE(v.can_implement(64, 65, 64)) << v.name;
    EXPECT_FALSE(v.can_implement(64, 64, 17)) << v.name;
    EXPECT_FALSE(v.can_implement(0, 64, 64)) << v.name;
  }
}

TEST(Registry, PaddedVariantsWrapAnAlignedKernel) {
  int padded = 0;
  for (const VariantInfo& v : Variants()) {
    if (v.kind != VariantKind::kPadded) continue;
    ++padded;
    const VariantInfo* inner = FindVariant(v.inner);
    ASSERT_NE(inner, nullptr) << v.name;
    EXPECT_EQ(inner->kind, VariantKind::kKernel) << v.name;
    EXPECT_FALSE(inner->is_fallback) << v.name;
    EXPECT_TRUE(v.can_implement(4097, 4096, 4095)) << v.name;
    EXPECT_TRUE(v.can_implement(7, 5, 3)) << v.name;
  }
  EXPECT_GE(padded, 1);
}

TEST(Registry, PicksFallbackWhenNNotMultipleOf8) {
  EXPECT_TRUE(DefaultVariant(128, 130, 128, Accumulation::kFp32).is_fallback);
  EXPECT_TRUE(DefaultVariant(4097, 4096, 4095, Accumulation::kFp16).is_fallback);
  EXPECT_FALSE(DefaultVariant(4096, 4096, 4096, Accumulation::kFp16).is_fallback);
  EXPECT_FALSE(DefaultVariant(4096, 4096, 4096, Accumulation::kFp32).is_fallback);
}

TEST(Registry, DefaultSupportsAccumulationAndShape) {
  for (Accumulation acc : {Accumulation::kFp16, Accumulation::kFp32})
    for (int m : {1, 33, 1000, 8192})
      for (int n : {8, 64, 1000, 4096})
        for (int k : {8, 24, 4096}) {
          const VariantInfo& v = DefaultVariant(m, n, k, acc);
          EXPECT_TRUE(v.Supports(acc)) << v.name;
          EXPECT_TRUE(v.can_implement(m, n, k)) << v.name;
          EXPECT_EQ(v.kind, VariantKind::kKernel) << v.name;
        }
}

// The wgmma family is listed without a device (CI) and on sm_90 devices; only a machine whose
// devices are all of another compute capability leaves it out.
TEST(Registry, DefaultPicksWgmmaForAlignedShapes) {
  if (FindVariant("wgmma_128x256_s4_g8") == nullptr) {
    int count = 0;
    ASSERT_TRUE(cudaGetDeviceCount(&count) == cudaSuccess && count > 0)
        << "no device, yet the wgmma family is not listed";
    GTEST_SKIP() << "no sm_90 device";
  }
  EXPECT_EQ(DefaultVariant(4096, 4096, 4096, Accumulation::kFp16).name, "wgmma_128x256_s4_g8");
  EXPECT_EQ(DefaultVariant(8192, 64, 4096, Accumulation::kFp32).name, "wgmma_128x128_s6_g8");
  EXPECT_EQ(DefaultVariant(128, 8192, 8192, Accumulation::kFp32).name, "wgmma_64x128_s8_g8");
  const VariantInfo* padded = FindVariant("pad8_wgmma_128x256_s4_g8");
  ASSERT_NE(padded, nullptr);
  EXPECT_EQ(padded->inner, "wgmma_128x256_s4_g8");
}

TEST(Registry, CheckProblemExplainsRejections) {
  auto* fake = reinterpret_cast<__half*>(uintptr_t{256});  // never dereferenced
  const VariantInfo* v256 = FindVariant("wmma_256x256_s3_dsmem_swz");
  ASSERT_NE(v256, nullptr);
  GemmProblem p{fake, fake, fake, 64, 64, 64, Accumulation::kFp32};
  EXPECT_NE(CheckProblem(*v256, p).find("does not support fp32"), std::string::npos);
  p.accumulation = Accumulation::kFp16;
  EXPECT_EQ(CheckProblem(*v256, p), "");
  p.n = 65;
  EXPECT_NE(CheckProblem(*v256, p).find("cannot take"), std::string::npos);
  EXPECT_EQ(CheckProblem(FallbackVariant(), p), "");
  p.n = 64;
  p.k = 0;
  EXPECT_NE(CheckProblem(FallbackVariant(), p).find(">= 1"), std::string::npos);
  p.k = 64;
  p.b = reinterpret_cast<const __half*>(uintptr_t{258});
  EXPECT_NE(CheckProblem(*v256, p).find("aligned"), std::string::npos);
  EXPECT_EQ(CheckProblem(FallbackVariant(), p), "");
  EXPECT_EQ(CheckProblem(*FindVariant("cublas"), p), "");
}

// Layouts, element types and strides are declared per variant and refused by name.
GemmProblem AlignedProblem(int m, int n, int k) {
  return GemmProblem{reinterpret_cast<const void*>(uintptr_t{1} << 20),
                     reinterpret_cast<const void*>(uintptr_t{2} << 20),
                     reinterpret_cast<void*>(uintptr_t{3} << 20),
                     m,
                     n,
                     k,
                     Accumulation::kFp32};
}

TEST(Registry, LayoutNamesAndBits) {
  EXPECT_STREQ(LayoutName(false, false), "NN");
  EXPECT_STREQ(LayoutName(false, true), "NT");
  EXPECT_STREQ(LayoutName(true, false), "TN");
  EXPECT_STREQ(LayoutName(true, true), "TT");
  EXPECT_EQ(LayoutBit(false, false), kLayoutNN);
  EXPECT_EQ(LayoutBit(false, true), kLayoutNT);
  EXPECT_EQ(LayoutBit(true, false), kLayoutTN);
  EXPECT_EQ(LayoutBit(true, true), kLayoutTT);
  EXPECT_EQ(TypesBit(DataType::kFp16, DataType::kFp16), kTypesFp16);
  EXPECT_EQ(TypesBit(DataType::kBf16, DataType::kFp32), kTypesBf16F32);
  EXPECT_EQ(TypesBit(DataType::kFp16, DataType::kBf16), 0u);
  EXPECT_EQ(TypesBit(DataType::kFp32, DataType::kFp32), 0u);
}

TEST(Registry, EveryVariantTakesTheDefaultProblem) {
  for (const VariantInfo& v : Variants()) {
    EXPECT_TRUE(v.SupportsLayout(false, false)) << v.name;
    EXPECT_TRUE(v.SupportsTypes(DataType::kFp16, DataType::kFp16)) << v.name;
  }
}

TEST(Registry, OlderFamiliesRefuseOtherLayoutsAndTypesByName) {
  for (const VariantInfo& v : Variants()) {
    if (v.name.rfind("wgmma_", 0) == 0 || v.name.rfind("pad8_wgmma_", 0) == 0 ||
        v.name == "skinny_m16" || v.kind == VariantKind::kSplitK ||
        v.kind == VariantKind::kCublas || v.kind == VariantKind::kAuto)
      continue;
    GemmProblem p = AlignedProblem(128, 128, 128);
    if (!v.Supports(Accumulation::kFp32)) p.accumulation = Accumulation::kFp16;
    ASSERT_EQ(CheckProblem(v, p), "") << v.name;
    p.transpose_b = true;
    EXPECT_NE(CheckProblem(v, p).find("does not take layout NT"), std::string::npos)
        << v.name << ": " << CheckProblem(v, p);
    p.transpose_b = false;
    p.transpose_a = true;
    EXPECT_NE(CheckProblem(v, p).find("layout TN"), std::string::npos) << v.name;
    p.transpose_a = false;
    p.accumulation = Accumulation::kFp32;
    p.ab_type = p.c_type = DataType::kBf16;
    if (v.Supports(Accumulation::kFp32)) {
      EXPECT_NE(CheckProblem(v, p).find("does not take element types bf16"), std::string::npos)
          << v.name << ": " << CheckProblem(v, p);
    }
    p.ab_type = p.c_type = DataType::kFp16;
    p.ldb = 136;
    if (v.Supports(Accumulation::kFp32) && v.kind != VariantKind::kPadded) {
      EXPECT_NE(CheckProblem(v, p).find("densely packed"), std::string::npos) << v.name;
    }
  }
}

// skinny_m16 takes M <= 16, NN and NT, fp16 or bf16 in, C of that type or fp32, packed, fp32
// accumulation, through its LaunchContext (the split's partials), and is among auto's
// candidates there (on an H100 the fastest at M = 1); the rest it refuses by name.
TEST(Registry, SkinnyTakesSmallMNnAndNtAndRefusesTheRest) {
  const VariantInfo* v = FindVariant("skinny_m16");
  ASSERT_NE(v, nullptr);
  EXPECT_FALSE(v->experimental);
  EXPECT_FALSE(v->fused_scale);
  EXPECT_NE(v->launch_with_context, nullptr);
  EXPECT_LE(v->smem_bytes, 227u * 1024);
  EXPECT_TRUE(v->can_implement(1, 8192, 8192));
  EXPECT_TRUE(v->can_implement(16, 8, 8));
  EXPECT_FALSE(v->can_implement(17, 8192, 8192));
  EXPECT_FALSE(v->can_implement(16, 8192, 8190));
  GemmProblem p = AlignedProblem(16, 128, 128);
  for (bool tb : {false, true})
    for (DataType ab : {DataType::kFp16, DataType::kBf16})
      for (DataType c : {ab, DataType::kFp32}) {
        p.transpose_b = tb;
        p.ab_type = ab;
        p.c_type = c;
        EXPECT_EQ(CheckProblem(*v, p), "") << tb << DataTypeName(ab) << DataTypeName(c);
      }
  p = AlignedProblem(16, 128, 128);
  p.transpose_a = true;
  EXPECT_NE(CheckProblem(*v, p).find("layout TN"), std::string::npos) << CheckProblem(*v, p);
  p = AlignedProblem(17, 128, 128);
  EXPECT_NE(CheckProblem(*v, p).find("m <= 16"), std::string::npos) << CheckProblem(*v, p);
  p = AlignedProblem(16, 128, 128);
  p.accumulation = Accumulation::kFp16;
  EXPECT_NE(CheckProblem(*v, p), "");
  p = AlignedProblem(16, 128, 128);
  p.ldb = 136;
  EXPECT_NE(CheckProblem(*v, p).find("densely packed"), std::string::npos) << CheckProblem(*v, p);
  for (bool tb : {false, true}) {
    GemmProblem skinny = AlignedProblem(8, 8192, 8192);
    skinny.transpose_b = tb;
    std::vector<const VariantInfo*> candidates = AutoCandidates(skinny);
    EXPECT_NE(std::find(candidates.begin(), candidates.end(), v), candidates.end()) << tb;
  }
  std::vector<const VariantInfo*> past_16 = AutoCandidates(AlignedProblem(17, 8192, 8192));
  EXPECT_FALSE(past_16.empty());
  EXPECT_EQ(std::find(past_16.begin(), past_16.end(), v), past_16.end());
}

TEST(Registry, WgmmaTakesEveryLayoutBf16AndFp32C) {
  const VariantInfo* w = FindVariant("wgmma_128x256_s4_g8");
  if (w == nullptr) GTEST_SKIP() << "no wgmma family on this machine";
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (DataType t : {DataType::kFp16, DataType::kBf16}) {
        GemmProblem p = AlignedProblem(136, 264, 104);
        p.transpose_a = ta;
        p.transpose_b = tb;
        p.ab_type = t;
        p.c_type = DataType::kFp32;
        EXPECT_EQ(CheckProblem(*w, p), "")
            << LayoutName(ta, tb) << " " << DataTypeName(t) << "→fp32";
        p.c_type = t;
        EXPECT_EQ(CheckProblem(*w, p), "") << LayoutName(ta, tb) << " " << DataTypeName(t);
        p.ldb = (tb ? 104 : 264) + 8;
        EXPECT_EQ(CheckProblem(*w, p), "") << "strided";
        p.ldb = (tb ? 104 : 264) + 4;
        EXPECT_NE(CheckProblem(*w, p).find("ldb must be a multiple of 8"), std::string::npos);
      }
  GemmProblem p = AlignedProblem(33, 264, 104);
  p.transpose_a = true;
  EXPECT_NE(CheckProblem(*w, p).find("transpose_a needs m % 8 == 0"), std::string::npos)
      << CheckProblem(*w, p);
  p.transpose_a = false;
  EXPECT_EQ(CheckProblem(*w, p), "");
  p.c_type = DataType::kFp32;  // fp32 C: fp32 accumulation only
  EXPECT_EQ(CheckProblem(*w, p), "");
  p.accumulation = Accumulation::kFp16;
  EXPECT_NE(CheckProblem(*w, p).find("fp16 accumulation takes fp16"), std::string::npos);
  p.accumulation = Accumulation::kFp32;
  // cuBLAS takes all of it.
  EXPECT_EQ(CheckProblem(*FindVariant("cublas"), p), "");
  p.transpose_a = true;
  EXPECT_EQ(CheckProblem(*FindVariant("cublas"), p), "");
}

TEST(Registry, RefusesBadTypePairsAndStrides) {
  const VariantInfo& cublas = *FindVariant("cublas");
  GemmProblem p = AlignedProblem(64, 64, 64);
  p.ab_type = DataType::kFp16;
  p.c_type = DataType::kBf16;
  EXPECT_NE(CheckProblem(cublas, p).find("unsupported element types"), std::string::npos);
  p.ab_type = DataType::kFp32;
  p.c_type = DataType::kFp32;
  EXPECT_NE(CheckProblem(cublas, p).find("unsupported element types"), std::string::npos);
  p.ab_type = p.c_type = DataType::kBf16;
  p.accumulation = Accumulation::kFp16;
  EXPECT_NE(CheckProblem(cublas, p).find("fp16 accumulation takes fp16"), std::string::npos);
  p.accumulation = Accumulation::kFp32;
  EXPECT_EQ(CheckProblem(cublas, p), "");
  p.transpose_a = true;
  p.lda = 32;  // A is stored 64×64: rows of 64
  EXPECT_NE(CheckProblem(cublas, p).find("lda 32 is below the stored row length 64"),
            std::string::npos)
      << CheckProblem(cublas, p);
}

// A padded wrapper takes the layouts and types of its inner kernel, any strides (its copies are
// packed) and any shape.
TEST(Registry, PaddedVariantsTakeTheirKernelsFormsAtAnyShapeAndStride) {
  int padded = 0;
  for (const VariantInfo& v : Variants()) {
    if (v.kind != VariantKind::kPadded) continue;
    ++padded;
    const VariantInfo* inner = FindVariant(v.inner);
    ASSERT_NE(inner, nullptr) << v.name;
    EXPECT_EQ(v.layouts, inner->layouts) << v.name;
    EXPECT_EQ(v.types, inner->types) << v.name;
    EXPECT_TRUE(v.strided) << v.name;
    GemmProblem p = AlignedProblem(33, 17, 9);
    p.ldb = 21;
    if (!v.Supports(Accumulation::kFp32)) p.accumulation = Accumulation::kFp16;
    EXPECT_EQ(CheckProblem(v, p), "") << v.name;
  }
  EXPECT_GT(padded, 0);
}

TEST(Registry, AutoPicksAKernelThatTakesTheLayout) {
  GemmProblem p = AlignedProblem(4096, 4096, 4096);
  p.transpose_b = true;
  p.ab_type = p.c_type = DataType::kBf16;
  const VariantInfo* chosen = AutoVariantFor(p);
  if (FindVariant("wgmma_128x256_s4_g8") == nullptr) {
    EXPECT_EQ(chosen, nullptr);
    return;
  }
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(CheckProblem(*chosen, p), "") << chosen->name;
  EXPECT_EQ(chosen->kind, VariantKind::kKernel);
  EXPECT_EQ(CheckProblem(*FindVariant("auto"), p), "");
  // No kernel reads an odd N with a transposed B in place: the padded wgmma wrapper takes it.
  p.n = 4095;
  chosen = AutoVariantFor(p);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(chosen->kind, VariantKind::kPadded) << chosen->name;
  EXPECT_EQ(CheckProblem(*FindVariant("auto"), p), "");
}

// Strided batches. Strides default to packed items; items may not overlap; items 0
// and 1 are checked as single GEMMs (item 1 is the least aligned).
TEST(Registry, BatchStridesAndItems) {
  GemmProblem p = AlignedProblem(64, 48, 32);
  p.batch = 3;
  p.transpose_b = true;  // B stored 48×32
  p.c_type = DataType::kFp32;
  const BatchStrides packed = StridesOf(p);
  EXPECT_EQ(packed.a, 64 * 32);
  EXPECT_EQ(packed.b, 48 * 32);
  EXPECT_EQ(packed.c, 64 * 48);
  p.ldc = 56;
  EXPECT_EQ(StridesOf(p).c, 64 * 56);
  p.stride_a = 5000;
  const GemmProblem item = BatchItem(p, 2);
  EXPECT_EQ(item.batch, 1);
  EXPECT_EQ(item.stride_a, 0);
  EXPECT_EQ(static_cast<const char*>(item.a) - static_cast<const char*>(p.a), 2 * 5000 * 2);
  EXPECT_EQ(static_cast<const char*>(item.b) - static_cast<const char*>(p.b), 2 * 48 * 32 * 2);
  EXPECT_EQ(static_cast<char*>(item.c) - static_cast<char*>(p.c), 2 * 64 * 56 * 4);
  EXPECT_EQ(item.ldc, 56);
}

TEST(Registry, RefusesBadBatchesByName) {
  const VariantInfo& cublas = *FindVariant("cublas");
  GemmProblem p = AlignedProblem(64, 64, 64);
  p.batch = 0;
  EXPECT_NE(CheckProblem(cublas, p).find("batch must be >= 1"), std::string::npos);
  p.batch = 4;
  EXPECT_EQ(CheckProblem(cublas, p), "");
  EXPECT_EQ(CheckProblem(FallbackVariant(), p), "");  // a loop of launches
  p.stride_b = 64 * 64 - 1;
  EXPECT_NE(CheckProblem(cublas, p).find("stride_b 4095 is below one item's extent 4096"),
            std::string::npos)
      << CheckProblem(cublas, p);
  p.stride_b = int64_t(1) << 62;
  EXPECT_NE(CheckProblem(cublas, p).find("overflows"), std::string::npos);
  // Item 1 of an odd stride is not 16-byte aligned: the 16-byte kernels refuse it by item.
  p.stride_b = 64 * 64 + 1;
  for (const VariantInfo& v : Variants()) {
    if (v.kind != VariantKind::kKernel || v.is_fallback ||
        !CheckProblem(v, BatchItem(p, 0)).empty())
      continue;
    EXPECT_NE(CheckProblem(v, p).find("batch item 1: "), std::string::npos) << v.name;
    EXPECT_NE(CheckProblem(v, p).find("aligned"), std::string::npos) << v.name;
  }
  EXPECT_EQ(CheckProblem(cublas, p), "");
  EXPECT_EQ(CheckProblem(FallbackVariant(), p), "");
}

TEST(Registry, GroupsAreRefusedBeforeAnyLaunch) {
  LaunchContext ctx(nullptr);  // nothing below reaches the device
  const VariantInfo& cublas = *FindVariant("cublas");
  EXPECT_EQ(LaunchGrouped(cublas, {}, ctx), "the group is empty");
  GemmProblem batched = AlignedProblem(64, 64, 64);
  batched.batch = 2;
  EXPECT_NE(LaunchGrouped(cublas, {AlignedProblem(64, 64, 64), batched}, ctx)
                .find("problem 1: batch must be 1"),
            std::string::npos);
  GemmProblem odd = AlignedProblem(64, 63, 64);
  for (const VariantInfo& v : Variants()) {
    if (v.kind != VariantKind::kKernel || v.is_fallback ||
        !CheckProblem(v, AlignedProblem(64, 64, 64)).empty())
      continue;
    EXPECT_NE(LaunchGrouped(v, {AlignedProblem(64, 64, 64), odd}, ctx).find("problem 1: "),
              std::string::npos)
        << v.name;
  }
}

// The wgmma family runs a batch in one launch (3-D tensor maps, the item outermost), so its
// strides obey TMA's rules, and a group in one launch; the older families loop and need only
// aligned items.
TEST(Registry, WgmmaTakesBatchesAndGroupsInOneLaunch) {
  EXPECT_TRUE(FindVariant("cublas")->batched);
  EXPECT_FALSE(FindVariant("auto")->batched);  // resolves to a kernel first
  for (const VariantInfo& v : Variants()) {
    if (v.kind == VariantKind::kKernel || v.kind == VariantKind::kPadded) {
      const bool wgmma = v.name.rfind("wgmma_", 0) == 0;
      // Ping-pong and cluster kernels run a group as a loop of launches.
      const bool loops_groups =
          v.name.rfind("wgmma_pp_", 0) == 0 || v.name.find("_cluster2") != std::string::npos;
      EXPECT_EQ(v.batched, wgmma) << v.name;
      EXPECT_EQ(v.launch_grouped != nullptr, wgmma && !loops_groups) << v.name;
    }
  }
  const VariantInfo* w = FindVariant("wgmma_128x256_s4_g8");
  if (w == nullptr) GTEST_SKIP() << "no wgmma family on this machine";
  GemmProblem p = AlignedProblem(136, 264, 104);
  p.batch = 5;
  p.transpose_a = true;
  EXPECT_EQ(CheckProblem(*w, p), "");
  p.stride_a = 136 * 104 + 16;  // gaps of 16 elements: 32 bytes
  p.stride_c = 136 * 264 + 8;
  EXPECT_EQ(CheckProblem(*w, p), "");
  p.stride_c = 136 * 264 + 4;  // fp16: item 1 of C 8 bytes off 16-byte alignment
  EXPECT_NE(CheckProblem(*w, p).find("batch item 1: "), std::string::npos);
  p.c_type = DataType::kFp32;  // fp32: item 1 aligned, but the stride is not a multiple of 8
  EXPECT_NE(CheckProblem(*w, p).find("stride_c must be a multiple of 8"), std::string::npos)
      << CheckProblem(*w, p);
  p.stride_c = 0;
  p.m = 1 << 20;  // 8192 row tiles × 2 column tiles × 2^18 items reaches 2^31 tiles
  p.n = 512;
  p.transpose_a = false;
  p.batch = 1 << 18;
  p.stride_a = p.stride_b = 0;
  EXPECT_NE(CheckProblem(*w, p).find("reaches 2^31"), std::string::npos) << CheckProblem(*w, p);
}

// The cluster-pair kernel is the cooperative 128x256 kernel's shape
// rules and forms, but C of the input type only (its fp32-C kernels are not compiled: a
// problem asking for one is refused before any launch), a group as a loop of launches, and
// experimental.
TEST(Registry, ClusterPairTakesTheCooperativeTilesShapesWithCOfTheInputType) {
  const VariantInfo* cluster = FindVariant("wgmma_128x256_s4_g4_cluster2");
  const VariantInfo* same_tile = FindVariant("wgmma_128x256_s4_g8");
  if (same_tile == nullptr) {
    EXPECT_EQ(cluster, nullptr) << "listed on a machine without the wgmma family";
    GTEST_SKIP() << "no wgmma family on this machine";
  }
  ASSERT_NE(cluster, nullptr);
  EXPECT_TRUE(cluster->experimental);
  EXPECT_EQ(cluster->launch_grouped, nullptr);
  EXPECT_TRUE(cluster->batched && cluster->strided && cluster->fused_scale);
  EXPECT_EQ(cluster->layouts, kAllLayouts);
  EXPECT_TRUE(cluster->SupportsTypes(DataType::kFp16, DataType::kFp16));
  EXPECT_TRUE(cluster->SupportsTypes(DataType::kBf16, DataType::kBf16));
  EXPECT_FALSE(cluster->SupportsTypes(DataType::kFp16, DataType::kFp32));
  EXPECT_FALSE(cluster->SupportsTypes(DataType::kBf16, DataType::kFp32));
  EXPECT_EQ(cluster->block_m, 128);
  EXPECT_EQ(cluster->block_n, 256);
  EXPECT_EQ(cluster->smem_bytes, same_tile->smem_bytes);
  GemmProblem p = AlignedProblem(256, 512, 128);
  EXPECT_EQ(CheckProblem(*cluster, p), "");
  p.c_type = DataType::kFp32;
  EXPECT_NE(CheckProblem(*cluster, p), "");
  EXPECT_EQ(CheckProblem(*same_tile, p), "");
}

// The stream-K kernel (for 8192³ at or above cuBLAS) takes the cooperative 128x256
// kernel's shapes and forms but C of the input type only, launches through its LaunchContext
// (the tail's scratch), runs a group as the plain kernel's one launch, and is experimental.
TEST(Registry, StreamKTakesTheCooperativeTilesShapesThroughItsContext) {
  const VariantInfo* sk = FindVariant("wgmma_128x256_s4_g8_sk");
  const VariantInfo* same_tile = FindVariant("wgmma_128x256_s4_g8");
  if (same_tile == nullptr) {
    EXPECT_EQ(sk, nullptr) << "listed on a machine without the wgmma family";
    GTEST_SKIP() << "no wgmma family on this machine";
  }
  ASSERT_NE(sk, nullptr);
  EXPECT_TRUE(sk->experimental);
  EXPECT_EQ(sk->kind, VariantKind::kKernel);
  EXPECT_EQ(sk->launch, nullptr);
  EXPECT_NE(sk->launch_with_context, nullptr);
  EXPECT_EQ(sk->launch_grouped, same_tile->launch_grouped);
  EXPECT_TRUE(sk->batched && sk->strided && sk->fused_scale);
  EXPECT_EQ(sk->layouts, kAllLayouts);
  EXPECT_TRUE(sk->SupportsTypes(DataType::kFp16, DataType::kFp16));
  EXPECT_TRUE(sk->SupportsTypes(DataType::kBf16, DataType::kBf16));
  EXPECT_FALSE(sk->SupportsTypes(DataType::kFp16, DataType::kFp32));
  EXPECT_EQ(sk->block_m, 128);
  EXPECT_EQ(sk->block_n, 256);
  EXPECT_EQ(sk->smem_bytes, same_tile->smem_bytes);
  GemmProblem p = AlignedProblem(8192, 8192, 8192);
  EXPECT_EQ(CheckProblem(*sk, p), "");
  p.c_type = DataType::kFp32;
  EXPECT_NE(CheckProblem(*sk, p), "");
}

// The ping-pong kernel is registered with the cooperative 128x128
// kernel's forms and shape rules (the same output tile and tensor maps), groups as a loop, and
// marked experimental until a GPU has measured it.
TEST(Registry, PingpongTakesTheCooperativeTilesFormsAndIsExperimental) {
  const VariantInfo* pp = FindVariant("wgmma_pp_128x128_s6_g8");
  const VariantInfo* same_tile = FindVariant("wgmma_128x128_s6_g8");
  if (same_tile == nullptr) {
    EXPECT_EQ(pp, nullptr) << "listed on a machine without the wgmma family";
    GTEST_SKIP() << "no wgmma family on this machine";
  }
  ASSERT_NE(pp, nullptr);
  EXPECT_TRUE(pp->experimental);
  EXPECT_EQ(pp->kind, VariantKind::kKernel);
  EXPECT_NE(pp->launch, same_tile->launch);
  EXPECT_EQ(pp->launch_grouped, nullptr);
  EXPECT_TRUE(pp->batched && pp->strided);
  EXPECT_EQ(pp->layouts, kAllLayouts);
  EXPECT_EQ(pp->types, kAllTypes);
  EXPECT_TRUE(pp->fp16_acc && pp->fp32_acc);
  EXPECT_EQ(pp->min_sm, 90);
  EXPECT_EQ(pp->block_m, 128);
  EXPECT_EQ(pp->block_n, 128);
  EXPECT_EQ(pp->stages, 6);
  // Six 32 KB stages and two consumers' 16 KB of C staging, within an sm_90 block's 227 KB.
  EXPECT_GE(pp->smem_bytes, 6u * 32768 + 2 * 16384);
  EXPECT_LE(pp->smem_bytes, 227u * 1024);
  // Experimental: the ping-pong, cluster, stream-K and split-K variants (what has not yet run
  // on a GPU, or ran and did not earn auto's time).
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const VariantInfo& v : Variants())
    EXPECT_TRUE(!v.experimental || v.name.rfind("wgmma_pp_", 0) == 0 ||
                v.name.find("_cluster2") != std::string::npos || ends_with(v.name, "_sk") ||
                v.kind == VariantKind::kSplitK)
        << v.name;
  // The same refusals as the cooperative kernel of the same tile, word for word but the name.
  auto verdict = [](const VariantInfo& v, const GemmProblem& p) {
    std::string why = CheckProblem(v, p);
    for (size_t at; (at = why.find(v.name)) != std::string::npos;)
      why.replace(at, v.name.size(), "V");
    return why;
  };
  std::vector<GemmProblem> problems;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (DataType ab : {DataType::kFp16, DataType::kBf16})
        for (DataType c : {ab, DataType::kFp32}) {
          GemmProblem p = AlignedProblem(136, 264, 104);
          p.transpose_a = ta;
          p.transpose_b = tb;
          p.ab_type = ab;
          p.c_type = c;
          problems.push_back(p);
          p.m = 33;  // a transposed A needs m % 8 == 0
          problems.push_back(p);
          p.m = 136;
          p.ldb = (tb ? 104 : 264) + 4;  // not a 16-byte multiple
          problems.push_back(p);
          p.ldb = 0;
          p.batch = 3;
          p.stride_c = 136 * 264 + 4;
          problems.push_back(p);
        }
  GemmProblem p = AlignedProblem(4096, 4095, 4096);  // N not a multiple of 8
  problems.push_back(p);
  p = AlignedProblem(64, 64, 64);
  p.accumulation = Accumulation::kFp16;
  problems.push_back(p);
  int refused = 0;
  for (const GemmProblem& q : problems) {
    EXPECT_EQ(verdict(*pp, q), verdict(*same_tile, q))
        << LayoutName(q.transpose_a, q.transpose_b) << " " << TypesName(q.ab_type, q.c_type) << " "
        << q.m << "x" << q.n << "x" << q.k << " batch " << q.batch;
    refused += !CheckProblem(*pp, q).empty();
  }
  EXPECT_GT(refused, 0);
  EXPECT_LT(refused, int(problems.size()));
}

// "auto" leaves experimental variants out unless HGEMM_AUTO_EXPERIMENTAL=1; explicit requests
// may name them.
TEST(Registry, AutoSkipsExperimentalVariantsUnlessOptedIn) {
  const VariantInfo* pp = FindVariant("wgmma_pp_128x128_s6_g8");
  if (pp == nullptr) GTEST_SKIP() << "no wgmma family on this machine";
  ASSERT_EQ(unsetenv("HGEMM_AUTO_EXPERIMENTAL"), 0);
  ASSERT_FALSE(AutoTakesExperimental());
  std::vector<GemmProblem> problems;
  for (bool tb : {false, true})
    for (DataType ab : {DataType::kFp16, DataType::kBf16}) {
      GemmProblem p = AlignedProblem(4096, 4096, 4096);
      p.transpose_b = tb;
      p.ab_type = p.c_type = ab;
      problems.push_back(p);
      p.c_type = DataType::kFp32;
      problems.push_back(p);
    }
  problems.push_back(AlignedProblem(8192, 8192, 8192));
  problems.back().accumulation = Accumulation::kFp16;
  auto has_pp = [&](const GemmProblem& p) {
    const std::vector<const VariantInfo*> c = AutoCandidates(p);
    return std::find(c.begin(), c.end(), pp) != c.end();
  };
  for (const GemmProblem& p : problems) {
    EXPECT_EQ(CheckProblem(*pp, p), "");  // an explicit request takes it
    EXPECT_FALSE(has_pp(p)) << LayoutName(p.transpose_a, p.transpose_b) << " "
                            << TypesName(p.ab_type, p.c_type);
    const std::vector<const VariantInfo*> c = AutoCandidates(p);
    EXPECT_FALSE(c.empty());
    for (const VariantInfo* v : c) EXPECT_FALSE(v->experimental) << v->name;
    const VariantInfo* untuned = AutoVariantFor(p);
    ASSERT_NE(untuned, nullptr);
    EXPECT_FALSE(untuned->experimental) << untuned->name;
  }
  // Anything but "1" is not the opt-in.
  ASSERT_EQ(setenv("HGEMM_AUTO_EXPERIMENTAL", "yes", 1), 0);
  EXPECT_FALSE(AutoTakesExperimental());
  EXPECT_FALSE(has_pp(problems.front()));
  ASSERT_EQ(setenv("HGEMM_AUTO_EXPERIMENTAL", "1", 1), 0);
  EXPECT_TRUE(AutoTakesExperimental());
  for (const GemmProblem& p : problems)
    EXPECT_TRUE(has_pp(p)) << LayoutName(p.transpose_a, p.transpose_b) << " "
                           << TypesName(p.ab_type, p.c_type);
  ASSERT_EQ(unsetenv("HGEMM_AUTO_EXPERIMENTAL"), 0);
}

// A group's problems sit at any offset of its packed matrices: an NN fp16 problem whose operand
// is not 16-byte aligned gets only variants that take it, never the aligned-shape kernels that
// its shape alone would pick (H100 run: "group[4]: wgmma_64x128_s8_g8 needs 16-byte aligned a,
// b and c").
TEST(Registry, AutoCandidatesOfAMisalignedPackedProblemTakeIt) {
  for (int offset : {0, 2, 8}) {
    GemmProblem p = AlignedProblem(200, 64, 512);
    p.a = static_cast<const char*>(p.a) + offset;
    const std::vector<const VariantInfo*> c = AutoCandidates(p);
    ASSERT_FALSE(c.empty()) << offset;
    for (const VariantInfo* v : c) EXPECT_EQ(CheckProblem(*v, p), "") << offset << " " << v->name;
  }
}

// Skinny M: splitk<s>_<inner> for s in {2, 4, 8} over the 64x128 and 128x128 wgmma
// kernels, taking what the inner kernel takes (it reads the operands in place) at m <= 256.
TEST(Registry, SplitKVariantsWrapAWgmmaKernel) {
  if (FindVariant("wgmma_64x128_s8_g8") == nullptr) GTEST_SKIP() << "no wgmma family here";
  int split = 0;
  for (const char* inner : {"wgmma_64x128_s8_g8", "wgmma_128x128_s6_g8"})
    for (int s : {2, 4, 8}) {
      const std::string name = "splitk" + std::to_string(s) + "_" + inner;
      const VariantInfo* v = FindVariant(name);
      ASSERT_NE(v, nullptr) << name;
      EXPECT_EQ(v->kind, VariantKind::kSplitK) << name;
      EXPECT_EQ(v->split_k, s) << name;
      EXPECT_EQ(v->inner, inner) << name;
      const VariantInfo& in = *FindVariant(inner);
      EXPECT_EQ(v->layouts, in.layouts) << name;
      EXPECT_EQ(v->types, in.types) << name;
      EXPECT_EQ(v->strided, in.strided) << name;
      EXPECT_TRUE(v->fp16_acc && v->fp32_acc) << name;
      EXPECT_EQ(v->min_sm, 90) << name;
      EXPECT_FALSE(v->batched) << name;  // a batch or a group: one split launch per item
      EXPECT_EQ(v->launch_grouped, nullptr) << name;
      EXPECT_EQ(v->launch, nullptr) << name;
      EXPECT_FALSE(v->is_fallback) << name;
      EXPECT_TRUE(v->experimental) << name;  // out of auto until a GPU run has checked it
      // Skinny shapes, up to 64 MiB of fp32 partials; K and N as the inner kernel needs them.
      for (int m : {1, 7, 16, 64, 65, 128, 256}) {
        EXPECT_TRUE(v->can_implement(m, 8192, 8192)) << name << " m=" << m;
      }
      EXPECT_TRUE(v->can_implement(1, 8, 8)) << name;
      EXPECT_FALSE(v->can_implement(257, 8192, 8192)) << name;
      EXPECT_FALSE(v->can_implement(16, 8196, 8192)) << name;
      EXPECT_FALSE(v->can_implement(16, 8192, 8188)) << name;
      EXPECT_FALSE(v->can_implement(0, 8192, 8192)) << name;
      EXPECT_FALSE(v->can_implement(256, (64 << 20) / (4 * s * 256) + 8, 64)) << name;
      ++split;
    }
  EXPECT_EQ(split, 6);
}

TEST(Registry, SplitKRefusesByNameWhatItsKernelRefuses) {
  const VariantInfo* v = FindVariant("splitk4_wgmma_64x128_s8_g8");
  if (v == nullptr) GTEST_SKIP() << "no wgmma family here";
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (DataType t : {DataType::kFp16, DataType::kBf16})
        for (DataType c : {t, DataType::kFp32}) {
          GemmProblem p = AlignedProblem(16, 8192, 8192);
          p.transpose_a = ta;
          p.transpose_b = tb;
          p.ab_type = t;
          p.c_type = c;
          EXPECT_EQ(CheckProblem(*v, p), "") << LayoutName(ta, tb) << " " << TypesName(t, c);
        }
  GemmProblem p = AlignedProblem(7, 8192, 8192);
  p.transpose_a = true;  // A stored k×m: rows of 7 elements are not 16-byte strides
  EXPECT_NE(CheckProblem(*v, p).find("transpose_a needs m % 8 == 0"), std::string::npos)
      << CheckProblem(*v, p);
  p = AlignedProblem(16, 8192, 8192);
  p.lda = 8196;
  EXPECT_NE(CheckProblem(*v, p).find("lda must be a multiple of 8"), std::string::npos);
  p = AlignedProblem(300, 8192, 8192);
  EXPECT_NE(CheckProblem(*v, p).find("cannot take 300x8192x8192"), std::string::npos)
      << CheckProblem(*v, p);
  p = AlignedProblem(16, 8192, 8192);
  p.b = reinterpret_cast<const void*>((uintptr_t{2} << 20) + 8);
  EXPECT_NE(CheckProblem(*v, p).find("aligned"), std::string::npos) << CheckProblem(*v, p);
  p = AlignedProblem(16, 8192, 8192);
  p.ab_type = p.c_type = DataType::kBf16;
  p.accumulation = Accumulation::kFp16;
  EXPECT_NE(CheckProblem(*v, p).find("fp16 accumulation takes fp16"), std::string::npos);
}

// α/β: which variants apply them themselves (fused_scale; ListKernels reports it), and what
// CheckProblem refuses by name: scaling on a variant that does not fuse it (the backend then
// runs the separate T + ScaleEpilogue path), beta without C_in, an unaligned C_in for TMA.
TEST(Registry, FusedScaleVariantsAndTheirRefusals) {
  for (const VariantInfo& v : Variants()) {
    // The ping-pong kernels' epilogue does not scale (yet): the backend's separate pass does.
    const bool wgmma = v.name.rfind("wgmma_", 0) == 0 && v.name.rfind("wgmma_pp_", 0) != 0;
    const bool expected = wgmma || v.kind == VariantKind::kSplitK ||
                          v.kind == VariantKind::kCublas || v.kind == VariantKind::kAuto;
    EXPECT_EQ(v.fused_scale, expected) << v.name;
  }
  GemmProblem p = AlignedProblem(136, 264, 104);
  p.alpha = 2.0f;  // alpha alone is scaling too
  const VariantInfo& mma = *FindVariant("mma_128x128_bk32_s4_swz");
  EXPECT_NE(CheckProblem(mma, p).find("does not apply alpha and beta itself"), std::string::npos)
      << CheckProblem(mma, p);
  EXPECT_EQ(CheckProblem(*FindVariant("cublas"), p), "");
  const VariantInfo* pad = FindVariant("pad8_mma_128x128_bk32_s4_swz");
  ASSERT_NE(pad, nullptr);
  EXPECT_NE(CheckProblem(*pad, p).find("alpha and beta"), std::string::npos);
  p.alpha = 1.0f;
  EXPECT_EQ(CheckProblem(mma, p), "");  // alpha 1, beta 0: the plain GEMM
  p.beta = 0.5f;                        // and no c_in
  EXPECT_NE(CheckProblem(*FindVariant("cublas"), p).find("beta != 0 needs c_in"),
            std::string::npos);
  const VariantInfo* wgmma = FindVariant("wgmma_128x256_s4_g8");
  if (wgmma == nullptr) GTEST_SKIP() << "no wgmma family here";
  p.c_in = reinterpret_cast<const void*>((uintptr_t{4} << 20) + 8);
  EXPECT_NE(CheckProblem(*wgmma, p).find("16-byte aligned c_in"), std::string::npos)
      << CheckProblem(*wgmma, p);
  EXPECT_EQ(CheckProblem(*FindVariant("splitk2_wgmma_64x128_s8_g8"), p), "");  // the reduce
  p.c_in = p.c;                                                                // in place
  EXPECT_EQ(CheckProblem(*wgmma, p), "");
  p.beta = 0.0f;
  p.alpha = -0.5f;
  p.c_in = nullptr;  // beta 0 reads no c_in
  EXPECT_EQ(CheckProblem(*wgmma, p), "");
}

// A batch's items each get their own C_in, at C's item stride; split-K slices are unscaled
// (the reduce applies alpha and beta once).
TEST(Registry, ScaledBatchItemsAndSplitKSlices) {
  GemmProblem p = AlignedProblem(64, 128, 256);
  p.alpha = 2.0f;
  p.beta = 0.25f;
  p.c_in = reinterpret_cast<const void*>(uintptr_t{5} << 20);
  p.batch = 3;
  p.stride_c = 64 * 128 + 8;
  const GemmProblem item = BatchItem(p, 2);
  EXPECT_EQ(item.c_in, static_cast<const char*>(p.c_in) + 2 * (64 * 128 + 8) * 2);
  EXPECT_EQ(item.alpha, 2.0f);
  EXPECT_EQ(item.beta, 0.25f);
  GemmProblem unscaled = p;
  unscaled.c_in = nullptr;
  unscaled.beta = 0.0f;
  EXPECT_EQ(BatchItem(unscaled, 2).c_in, nullptr);
  std::vector<float> partials(4 * 64 * 128);
  p.batch = 1;
  p.stride_c = 0;
  for (const GemmProblem& q : SplitKProblems(p, 4, partials.data())) {
    EXPECT_EQ(q.alpha, 1.0f);
    EXPECT_EQ(q.beta, 0.0f);
    EXPECT_EQ(q.c_in, nullptr);
  }
}

// Slices are whole 64-deep K tiles but the last, which takes the rest; short K gets fewer.
TEST(Registry, SliceKCutsWholeTilesAndLeavesTheRestToTheLast) {
  for (int s : {1, 2, 3, 4, 8})
    for (int k :
         {8, 16, 56, 64, 72, 100, 128, 136, 200, 504, 1000, 4104, 8192, 8200, 65536, 2147483640}) {
      const KSlices slices = SliceK(k, s);
      ASSERT_GE(slices.count, 1) << k << " " << s;
      EXPECT_LE(slices.count, s) << k << " " << s;
      const int64_t last = int64_t(k) - int64_t(slices.count - 1) * slices.depth;
      EXPECT_GE(last, 1) << k << " " << s;
      EXPECT_LE(last, slices.depth) << k << " " << s;
      if (slices.count > 1) {
        EXPECT_EQ(slices.depth % 64, 0) << k << " " << s;
      }
      if (k % 8 == 0) {
        EXPECT_EQ(last % 8, 0) << k << " " << s;  // the inner kernel's K alignment
      }
    }
  EXPECT_EQ(SliceK(8192, 2).count, 2);
  EXPECT_EQ(SliceK(8192, 2).depth, 4096);
  EXPECT_EQ(SliceK(8192, 8).depth, 1024);
  EXPECT_EQ(SliceK(200, 8).count, 4);  // 64 + 64 + 64 + 8: fewer slices than s when K is short
  EXPECT_EQ(SliceK(100, 2).count, 2);  // 64 + 36
  EXPECT_EQ(SliceK(56, 8).count, 1);   // K under one tile: one slice
  EXPECT_EQ(SliceK(4104, 4).depth, 1088);
}

// SplitKProblems on host memory (pointers are only offset, never dereferenced by it): for every
// layout, with and without row strides, K not a multiple of s·8 and K under s·64, the slices'
// products read through each slice's own pointers and row strides sum to the whole product,
// exactly (small integers), and each slice passes the inner kernel's CheckProblem.
TEST(Registry, SplitKSlicesSumToTheWholeProduct) {
  const VariantInfo* inner = FindVariant("wgmma_64x128_s8_g8");
  struct Case {
    int m, n, k, pad;
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Case& c : {Case{16, 24, 1000, 0}, Case{8, 16, 200, 8}, Case{7, 8, 72, 0},
                            Case{64, 8, 4104, 16}, Case{1, 16, 40, 0}}) {
        if (ta && c.m % 8 != 0) continue;  // refused by name (SplitKRefusesByName...)
        const int a_rows = ta ? c.k : c.m, a_cols = ta ? c.m : c.k;
        const int b_rows = tb ? c.n : c.k, b_cols = tb ? c.k : c.n;
        const int lda = a_cols + c.pad, ldb = b_cols + c.pad;
        auto alloc16 = [](size_t elements) {  // 16-byte aligned, as device memory is
          return std::unique_ptr<uint16_t[], void (*)(void*)>(
              static_cast<uint16_t*>(std::aligned_alloc(64, (elements * 2 + 63) / 64 * 64)),
              &std::free);
        };
        auto a = alloc16(size_t(a_rows) * lda), b = alloc16(size_t(b_rows) * ldb);
        for (size_t i = 0; i < size_t(a_rows) * lda; ++i) a[i] = uint16_t(i * 7 % 13);
        for (size_t i = 0; i < size_t(b_rows) * ldb; ++i) b[i] = uint16_t(i * 5 % 11);
        // op(A)·op(B) over columns/rows [0, k) of operands stored at `pa`, `pb` with row strides
        // lda, ldb: element (i, j).
        auto product = [&](const uint16_t* pa, const uint16_t* pb, int ld_a, int ld_b, int k, int i,
                           int j) {
          double sum = 0;
          for (int l = 0; l < k; ++l)
            sum += double(ta ? pa[size_t(l) * ld_a + i] : pa[size_t(i) * ld_a + l]) *
                   double(tb ? pb[size_t(j) * ld_b + l] : pb[size_t(l) * ld_b + j]);
          return sum;
        };
        GemmProblem p{a.get(),
                      b.get(),
                      reinterpret_cast<void*>(uintptr_t{3} << 20),
                      c.m,
                      c.n,
                      c.k,
                      Accumulation::kFp16};
        p.transpose_a = ta;
        p.transpose_b = tb;
        if (c.pad > 0) {
          p.lda = lda;
          p.ldb = ldb;
        }
        std::vector<float> partials(size_t(8) * c.m * c.n);
        for (int s : {2, 4, 8}) {
          const std::string where = std::string(LayoutName(ta, tb)) + " " + std::to_string(c.m) +
                                    "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                                    " pad " + std::to_string(c.pad) + " s=" + std::to_string(s);
          const std::vector<GemmProblem> parts = SplitKProblems(p, s, partials.data());
          ASSERT_EQ(int(parts.size()), SliceK(c.k, s).count) << where;
          int k_total = 0;
          for (size_t i = 0; i < parts.size(); ++i) {
            const GemmProblem& q = parts[i];
            k_total += q.k;
            EXPECT_EQ(q.m, c.m) << where;
            EXPECT_EQ(q.n, c.n) << where;
            EXPECT_EQ(q.k % 8, 0) << where;
            EXPECT_EQ(q.c_type, DataType::kFp32) << where;
            EXPECT_EQ(q.accumulation, Accumulation::kFp32) << where;
            EXPECT_EQ(q.c, partials.data() + i * c.m * c.n) << where;
            EXPECT_EQ(q.ldc, 0) << where;
            if (inner != nullptr) {
              EXPECT_EQ(CheckProblem(*inner, q), "") << where << " slice " << i;
            }
          }
          EXPECT_EQ(k_total, c.k) << where;
          for (int i = 0; i < c.m; ++i)
            for (int j = 0; j < c.n; ++j) {
              double sum = 0;
              for (const GemmProblem& q : parts)
                sum += product(static_cast<const uint16_t*>(q.a), static_cast<const uint16_t*>(q.b),
                               q.lda, q.ldb, q.k, i, j);
              ASSERT_EQ(sum, product(a.get(), b.get(), lda, ldb, c.k, i, j))
                  << where << " at " << i << "," << j;
            }
        }
      }
}

}  // namespace
}  // namespace hgemm::kernels
