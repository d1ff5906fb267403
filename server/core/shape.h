// The sizes of a GEMM and of its matrices, with the arithmetic that keeps them exact.
// Thread safety: values and pure functions.
#ifndef HGEMM_SERVER_CORE_SHAPE_H_
#define HGEMM_SERVER_CORE_SHAPE_H_

#include <cstdint>

namespace hgemm {

// The one place for the arithmetic of matrix sizes. Dimensions are uint32 on the wire, so a
// product of two is exact in uint64; capping every matrix at kMaxElementsPerMatrix (whatever the
// flags say) keeps every size derived from them, 2·m·n·k included (m·n·k ≤ 2^60 since
// (m·k)(k·n)(m·n) = (m·n·k)²), inside int64.
inline constexpr int64_t kMaxElementsPerMatrix = int64_t{1} << 40;

// Elements of a rows×cols matrix: exact for any uint32 dimensions.
constexpr uint64_t MatrixElements(uint32_t rows, uint32_t cols) { return uint64_t{rows} * cols; }

// fp16 bytes of a rows×cols matrix. REQUIRES: MatrixElements(rows, cols) ≤ kMaxElementsPerMatrix.
constexpr int64_t MatrixBytes(uint32_t rows, uint32_t cols) {
  return 2 * int64_t(MatrixElements(rows, cols));
}

// A GEMM's m, n, k. Made by ValidateShape (server/validation.h), which guarantees each is in
// [1, 2^32) and each of A, B, C has at most kMaxElementsPerMatrix elements; the sizes below
// REQUIRE that.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;

  int64_t Flops() const { return 2 * m * n * k; }
  // fp16 bytes of A, B and C, and of all three.
  int64_t ABytes() const { return MatrixBytes(m, k); }
  int64_t BBytes() const { return MatrixBytes(k, n); }
  int64_t CBytes() const { return MatrixBytes(m, n); }
  int64_t Bytes() const { return ABytes() + BBytes() + CBytes(); }
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_CORE_SHAPE_H_
