// GemmDims: the m×n×k of one GEMM as the client tools name it ("512x256x1024"), each in
// [1, 2^32) as in hgemm.v1.GemmRequest, and the one parser of that text (hgemm_client --shape,
// hgemm_load --shapes, kernel_bench --shapes).
// Thread safety: plain values and pure functions.
#ifndef HGEMM_CLIENT_GEMM_DIMS_H_
#define HGEMM_CLIENT_GEMM_DIMS_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace hgemm {

struct GemmDims {
  uint32_t m = 0, n = 0, k = 0;

  // fp16 bytes of A (m×k), B (k×n) and C (m×n). REQUIRES: the product fits int64 (any GEMM a
  // server accepts; hgemm_client checks larger ones in uint64, client/cli.h).
  int64_t ABytes() const { return 2 * int64_t(m) * k; }
  int64_t BBytes() const { return 2 * int64_t(k) * n; }
  int64_t CBytes() const { return 2 * int64_t(m) * n; }
  double Flops() const { return 2.0 * m * n * k; }
  std::string Name() const;  // "512x256x1024"
};

// Parses "MxNxK" (decimal, each in [1, 2^32 − 1]) into *dims. Returns "" or what is wrong,
// naming the dimension (e.g. "m = 4294967296 is over 4294967295, the largest uint32"), but not
// repeating `text` (the caller names the flag and the value); *dims is untouched on failure.
// Never throws.
std::string ParseGemmDims(std::string_view text, GemmDims* dims);

}  // namespace hgemm

#endif  // HGEMM_CLIENT_GEMM_DIMS_H_
