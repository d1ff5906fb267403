// The sizes of a GEMM and of its matrices, with the arithmetic that keeps them exact.
// Thread safety: values and pure functions.
#ifndef HGEMM_SERVER_CORE_SHAPE_H_
#define HGEMM_SERVER_CORE_SHAPE_H_

#include <cstdint>
#include <vector>

namespace hgemm {

// The one place for the arithmetic of matrix sizes. Dimensions are uint32 on the wire, so a
// product of two is exact in uint64; capping every matrix at kMaxElementsPerMatrix (whatever the
// flags say) keeps every size derived from them, 2·m·n·k included (m·n·k ≤ 2^60 since
// (m·k)(k·n)(m·n) = (m·n·k)²), inside int64.
inline constexpr int64_t kMaxElementsPerMatrix = int64_t{1} << 40;

// Element types of matrices (the wire's DataType): A and B are fp16 or bf16; C is their type
// or fp32.
enum class ElementType { kFp16, kBf16, kFp32 };

constexpr int64_t ElementBytes(ElementType type) { return type == ElementType::kFp32 ? 4 : 2; }
constexpr const char* ElementTypeName(ElementType type) {
  return type == ElementType::kFp16 ? "fp16" : type == ElementType::kBf16 ? "bf16" : "fp32";
}

// Layouts and (input, C) type pairs as bits, the encoding of kernels/registry.h's VariantInfo
// (the CUDA backend passes those through): layouts by BLAS letters (A's, then B's; N as
// stored, T transposed), NN = 1, NT = 2, TN = 4, TT = 8; types fp16 = 1, fp16→fp32 = 2,
// bf16 = 4, bf16→fp32 = 8.
inline constexpr unsigned kLayoutNNBit = 1, kAllLayoutBits = 15;
inline constexpr unsigned kTypesFp16Bit = 1, kAllTypesBits = 15;
constexpr unsigned LayoutBit(bool transpose_a, bool transpose_b) {
  return 1u << ((transpose_a ? 2 : 0) + (transpose_b ? 1 : 0));
}
// The layout of bit 1 << i.
inline constexpr const char* kLayoutNames[4] = {"NN", "NT", "TN", "TT"};
// REQUIRES: ab is fp16 or bf16; c is ab or fp32.
constexpr unsigned TypesBit(ElementType ab, ElementType c) {
  return 1u << ((ab == ElementType::kBf16 ? 2 : 0) + (c == ElementType::kFp32 ? 1 : 0));
}

// Elements of a rows×cols matrix: exact for any uint32 dimensions.
constexpr uint64_t MatrixElements(uint32_t rows, uint32_t cols) { return uint64_t{rows} * cols; }

// Bytes of a rows×cols matrix of `type`. REQUIRES: MatrixElements(rows, cols) ≤
// kMaxElementsPerMatrix (so that 4 bytes per element stay far inside int64).
constexpr int64_t MatrixBytes(uint32_t rows, uint32_t cols, ElementType type = ElementType::kFp16) {
  return ElementBytes(type) * int64_t(MatrixElements(rows, cols));
}

// The dimensions of one problem of a GEMM.
struct ProblemDims {
  int64_t m = 0, n = 0, k = 0;
};

// A GEMM's m, n, k. Made by ValidateShape (server/validation.h), which guarantees each is in
// [1, 2^32) and each of A, B, C has at most kMaxElementsPerMatrix elements; the sizes below
// REQUIRE that.
// The element types are part of it because the sizes follow them (the validation sets them
// after the dimensions).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  ElementType ab_type = ElementType::kFp16;  // of A and B: fp16 or bf16
  ElementType c_type = ElementType::kFp16;   // ab_type or fp32
  // C_in (m×n of c_type) is an operand too: the GEMM's beta is not 0.
  bool c_input = false;
  // GEMMs of this shape in one job (strided-batched): each operand and C hold `batch` matrices
  // packed one after the other. ValidateBatch keeps batch·(elements of each) within the limit.
  int64_t batch = 1;
  // Grouped (cublasGemmGroupedBatchedEx, one problem per group): problems of their own sizes in
  // one job, each operand and C holding theirs packed in order; then m, n, k are 0 and batch 1.
  // Empty: not grouped. ValidateGroup keeps each operand's elements summed over the group
  // within the limit.
  std::vector<ProblemDims> group;

  bool Grouped() const { return !group.empty(); }
  // The job's problems in the order of their matrices: the group's, or `batch` of (m, n, k).
  std::vector<ProblemDims> Problems() const {
    return Grouped() ? group : std::vector<ProblemDims>(size_t(batch), ProblemDims{m, n, k});
  }
  int64_t Flops() const {
    return Sum([](const ProblemDims& p) { return 2 * p.m * p.n * p.k; });
  }
  // Bytes of one A, B (of ab_type; a transposed operand has the same size) and C (of c_type).
  int64_t AMatrixBytes() const { return MatrixBytes(m, k, ab_type); }
  int64_t BMatrixBytes() const { return MatrixBytes(k, n, ab_type); }
  int64_t CMatrixBytes() const { return MatrixBytes(m, n, c_type); }
  // Bytes of the whole batch's (or group's) A, B, C and C_in (0 without c_input), and of all
  // of them.
  int64_t ABytes() const {
    return Sum([this](const ProblemDims& p) { return MatrixBytes(p.m, p.k, ab_type); });
  }
  int64_t BBytes() const {
    return Sum([this](const ProblemDims& p) { return MatrixBytes(p.k, p.n, ab_type); });
  }
  int64_t CBytes() const {
    return Sum([this](const ProblemDims& p) { return MatrixBytes(p.m, p.n, c_type); });
  }
  int64_t CInBytes() const { return c_input ? CBytes() : 0; }
  int64_t Bytes() const { return ABytes() + BBytes() + CBytes() + CInBytes(); }

 private:
  // `per_problem` summed over the problems (a batch's are equal: one product).
  template <typename PerProblem>
  int64_t Sum(PerProblem per_problem) const {
    if (!Grouped()) return batch * per_problem(ProblemDims{m, n, k});
    int64_t total = 0;
    for (const ProblemDims& p : group) total += per_problem(p);
    return total;
  }
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_CORE_SHAPE_H_
