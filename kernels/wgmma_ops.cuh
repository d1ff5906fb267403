// Inline-asm wrappers for wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} with
// A and B read from shared memory through matrix descriptors. Written out once per N because
// inline asm takes its operands one by one; the element type picks the opcode, and the operand
// majors are the instruction's immediates (PTX ISA, "Shared Memory Matrix Layout"):
// imm-trans-a = 0 reads A K-major (row-major m x k), 1 M-major (A stored k x m); imm-trans-b = 0
// reads B K-major (B stored n x k), 1 N-major (row-major k x n, the default problem).
//   Wgmma<N, BF16, TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d): d[N/2] fp32 accumulators of the
//   warpgroup's m64 x N tile (thread layout as in the PTX ISA's "wgmma .m64nNk16 register
//   fragment D"); scale_d = 0 overwrites d (D = A*B), 1 accumulates (D += A*B).
// Issue only from all 128 threads of a warpgroup, between wgmma.fence and commit_group.
// sm_90a only.
#ifndef HGEMM_KERNELS_WGMMA_OPS_CUH_
#define HGEMM_KERNELS_WGMMA_OPS_CUH_

#include <cstdint>

namespace hgemm::kernels::detail {

// @tparam N        the wgmma N (128 or 256).
// @tparam BF16     bf16 operands (else fp16).
// @tparam TRANS_A  imm-trans-a: 1 = A M-major.
// @tparam TRANS_B  imm-trans-b: 1 = B N-major.
template <int N, bool BF16, int TRANS_A, int TRANS_B>
struct WgmmaOp;

template <int N, bool BF16 = false, int TRANS_A = 0, int TRANS_B = 1>
__device__ __forceinline__ void Wgmma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                      int scale_d) {
  static_assert(TRANS_A == 0 || TRANS_A == 1, "imm-trans-a is 0 or 1");
  static_assert(TRANS_B == 0 || TRANS_B == 1, "imm-trans-b is 0 or 1");
  WgmmaOp<N, BF16, TRANS_A, TRANS_B>::Run(d, desc_a, desc_b, scale_d);
}

#define HGEMM_WGMMA_N128_ASM(TYPE)                                                                 \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE                                 \
      " {"                                                                                         \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"             \
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"                                                       \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])                                                                                \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B))

template <bool BF16, int TRANS_A, int TRANS_B>
struct WgmmaOp<128, BF16, TRANS_A, TRANS_B> {
  static __device__ __forceinline__ void Run(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d) {
    if constexpr (BF16) {
      HGEMM_WGMMA_N128_ASM("bf16");
    } else {
      HGEMM_WGMMA_N128_ASM("f16");
    }
  }
};
#undef HGEMM_WGMMA_N128_ASM

#define HGEMM_WGMMA_N256_ASM(TYPE)                                                                 \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE                                 \
      " {"                                                                                         \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "           \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "     \
      "%111, "                                                                                     \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, " \
      "%127"                                                                                       \
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"                                                   \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), \
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), \
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), \
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),          \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),        \
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),        \
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),        \
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])         \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B))

template <bool BF16, int TRANS_A, int TRANS_B>
struct WgmmaOp<256, BF16, TRANS_A, TRANS_B> {
  static __device__ __forceinline__ void Run(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d) {
    if constexpr (BF16) {
      HGEMM_WGMMA_N256_ASM("bf16");
    } else {
      HGEMM_WGMMA_N256_ASM("f16");
    }
  }
};
#undef HGEMM_WGMMA_N256_ASM

}  // namespace hgemm::kernels::detail

#endif  // HGEMM_KERNELS_WGMMA_OPS_CUH_
