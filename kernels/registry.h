// The kernel registry: every GEMM implementation the service can run, by name.
//
// A variant is one instantiated kernel configuration (e.g. "wmma_128x128_s3_dsmem_swz"), the
// guarded fallback for shapes the 16-byte path cannot take ("wmma_64x64_s2_ssmem_unaligned"), a
// padded wrapper that copies unaligned operands into zero-padded scratch and runs a 16-byte
// kernel ("pad8_<kernel>"), a split-K wrapper that runs a kernel on s slices of K into fp32
// partials and sums them ("splitk<s>_<kernel>", for skinny M), cuBLAS ("cublas") or "auto"
// (resolved per shape bucket by ChooseAuto). All compute C = op(A)·op(B) on row-major storage,
// accumulating in fp16 or fp32. The default problem is "NN" fp16: A m×k, B k×n, C m×n, densely
// packed; each variant says which further layouts (transposed A and/or B, BLAS semantics),
// element types (bf16 inputs, fp32 C) and row strides it takes (VariantInfo::layouts, types,
// strided), and CheckProblem refuses the rest by name.
//
// Thread safety: Variants(), FindVariant(), Launch() and ChooseAuto() may be called from any
// thread; a LaunchContext is not thread-safe and belongs to one worker (one stream).
//
// This header is plain C++17 (host compilers include it) and needs only cuda_runtime.h and
// accumulation.h.
#ifndef HGEMM_KERNELS_REGISTRY_H_
#define HGEMM_KERNELS_REGISTRY_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/accumulation.h"

// Forward declarations (as cuda_fp16.h and cublas_api.h make them), so that host code needs
// only cuda_runtime.h to include this header.
struct __half;
struct cublasContext;
typedef struct cublasContext* cublasHandle_t;

namespace hgemm::kernels {

using ::hgemm::Accumulation;  // kernels::Accumulation names the one definition
using ::hgemm::AccumulationName;

// Element types of A, B and C.
enum class DataType { kFp16, kBf16, kFp32 };
const char* DataTypeName(DataType t);  // "fp16", "bf16", "fp32"
size_t DataTypeBytes(DataType t);

// One GEMM request: C = op(A)·op(B), op(X) = X or Xᵀ as cuBLAS's CUBLAS_OP_N / CUBLAS_OP_T, on
// row-major storage. op(A) is m×k: A is stored m×k, or k×m when transpose_a; op(B) is k×n: B is
// stored k×n, or n×k when transpose_b (the nn.Linear weight layout: "NT"). C is m×n. Pointers are
// device memory; the caller owns it and keeps it alive until the launch completes. The fields
// after `accumulation` default to the original problem (NN, fp16 in and out, packed), so that
// {a, b, c, m, n, k, acc} still means it.
struct GemmProblem {
  const void* a;  // op(A) m×k, elements of ab_type
  const void* b;  // op(B) k×n, elements of ab_type
  void* c;        // m×n of c_type, fully overwritten
  int m, n, k;
  Accumulation accumulation;
  bool transpose_a = false;
  bool transpose_b = false;
  DataType ab_type = DataType::kFp16;  // fp16 or bf16 (bf16 needs fp32 accumulation)
  DataType c_type = DataType::kFp16;   // ab_type, or fp32 (with fp32 accumulation)
  // Elements between consecutive stored rows (>= the stored row length); 0 = densely packed.
  int lda = 0, ldb = 0, ldc = 0;
  // A strided batch (cublasGemmStridedBatchedEx): `batch` GEMMs of this shape, item i's A, B
  // and C at a, b, c plus i·stride_a / stride_b / stride_c elements. A stride of 0 means the
  // matrices packed one after the other (stored rows × ld); a given one is at least that (items
  // do not overlap). batch = 1 is the single GEMM.
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  // Scaling (cublasGemmEx's α/β): C = alpha·op(A)·op(B) + beta·C_in, in fp32, rounded once to
  // C's type. c_in has C's type, row stride (ldc) and item stride (stride_c); it may be c itself
  // (in place). beta == 0 never reads c_in (it may be null; NaN there stays out of C); alpha ==
  // 0 does not form op(A)·op(B). Only variants with VariantInfo::fused_scale take alpha != 1 or
  // beta != 0; the others are refused by CheckProblem (the CUDA backend then runs them into an
  // fp32 T and applies ScaleEpilogue).
  float alpha = 1.0f, beta = 0.0f;
  const void* c_in = nullptr;
};

// True if `p` asks for α/β scaling (alpha != 1 or beta != 0).
inline bool Scaled(const GemmProblem& p) { return p.alpha != 1.0f || p.beta != 0.0f; }

// The element strides between a batch's items, with 0 (packed) resolved.
struct BatchStrides {
  int64_t a, b, c;
};
BatchStrides StridesOf(const GemmProblem& p);

// Item i of a batch as a single GEMM (batch = 1, pointers offset). REQUIRES: 0 <= i < batch.
GemmProblem BatchItem(const GemmProblem& p, int i);

// Layouts as bits of VariantInfo::layouts, named by BLAS convention (first letter A, second B;
// N = as stored, T = transposed): NN (the default), NT (B stored n×k), TN (A stored k×m), TT.
inline constexpr unsigned kLayoutNN = 1, kLayoutNT = 2, kLayoutTN = 4, kLayoutTT = 8;
inline constexpr unsigned kAllLayouts = 15;
inline unsigned LayoutBit(bool transpose_a, bool transpose_b) {
  return 1u << ((transpose_a ? 2 : 0) + (transpose_b ? 1 : 0));
}
const char* LayoutName(bool transpose_a, bool transpose_b);  // "NN", "NT", "TN", "TT"

// (A/B type, C type) pairs as bits of VariantInfo::types; 0 for a pair no variant takes.
inline constexpr unsigned kTypesFp16 = 1;     // fp16 in, fp16 out (the default)
inline constexpr unsigned kTypesFp16F32 = 2;  // fp16 in, fp32 out
inline constexpr unsigned kTypesBf16 = 4;     // bf16 in, bf16 out
inline constexpr unsigned kTypesBf16F32 = 8;  // bf16 in, fp32 out
inline constexpr unsigned kAllTypes = 15;
unsigned TypesBit(DataType ab, DataType c);
// "fp16", "fp16→fp32", "bf16", "bf16→fp32" (input type, then C's where it differs).
std::string TypesName(DataType ab, DataType c);
// The layouts / type pairs of a bit set, comma-separated ("NN, NT", "fp16, bf16").
std::string LayoutList(unsigned layout_bits);
std::string TypesList(unsigned types_bits);

class LaunchContext;

enum class VariantKind {
  kKernel,  // one of the project's kernels
  kPadded,  // pads K and N to multiples of 8 in LaunchContext scratch, then runs `inner`
  kSplitK,  // runs `inner` on split_k slices of K (one grouped launch) into fp32 partials in
            // LaunchContext scratch, then sums them into C (SplitKReduce)
  kCublas,  // cublasGemmEx
  kAuto,    // resolved through ChooseAuto at launch
};

// What the registry knows about one variant. Entries live for the whole process.
struct VariantInfo {
  std::string name;         // stable id, e.g. "wmma_128x128_s3_dsmem_swz"
  std::string description;  // one line for humans
  bool fp16_acc;            // supports Accumulation::kFp16
  bool fp32_acc;            // supports Accumulation::kFp32
  size_t smem_bytes;        // shared memory per block at the larger supported accumulator
  int min_sm;               // minimum compute capability, major*10+minor (90 = sm_90)
  // True if the variant computes this shape correctly (given aligned pointers).
  bool (*can_implement)(int m, int n, int k);
  std::string constraints;  // what can_implement and Launch require, for error messages
  VariantKind kind;
  bool is_fallback;      // takes any shape; slower
  int swizzle_stride;    // block swizzle band in columns; 0 = no swizzle
  int block_m, block_n;  // block tile (0 for cublas/auto)
  int stages;            // cp.async pipeline depth (0 for cublas/auto)
  std::string inner;     // kPadded / kSplitK: the kernel it runs (on the padded copies, on
                         // the slices of K)
  // Enqueues the kernel on `stream`; nullptr for cublas/auto. REQUIRES: can_implement and the
  // accumulation checked; returns the CUDA launch error.
  cudaError_t (*launch)(const GemmProblem& problem, int swizzle_stride, cudaStream_t stream);
  // Beyond the default problem (defaults: NN only, fp16 only, packed only):
  unsigned layouts = kLayoutNN;  // kLayout* bits it takes
  unsigned types = kTypesFp16;   // kTypes* bits it takes
  bool strided = false;          // takes lda/ldb/ldc other than packed
  // Further requirements of the non-default layouts, types or strides (e.g. TMA's 16-byte row
  // strides of a transposed A); nullptr: none. Returns why not, or an empty string.
  std::string (*check_layout)(const GemmProblem& problem) = nullptr;
  // Runs a whole batch (GemmProblem::batch > 1) in one launch; the others take a batch as one
  // launch per item (Launch loops). Its further requirements go through check_layout.
  bool batched = false;
  // Runs a group (LaunchGrouped) of one layout and type pair in one launch; nullptr: the group
  // is a loop of Launch. REQUIRES: CheckProblem passed for every problem. Returns "" or the
  // error.
  std::string (*launch_grouped)(const std::vector<GemmProblem>& problems,
                                LaunchContext& ctx) = nullptr;
  // kSplitK: how many slices K is cut into at most (fewer where K is short; 0 otherwise).
  int split_k = 0;
  // Applies GemmProblem's alpha/beta (reading c_in) itself, in its own epilogue: the wgmma
  // family, the split-K wrappers (in the reduce), cublas (cublasGemmEx's α/β) and auto (which
  // then picks among the fused kernels).
  bool fused_scale = false;
  // Registered but not yet measured on a GPU: explicit requests run it, "auto" does not
  // consider it unless AutoTakesExperimental() (docs/kernels.md, "Experimental variants").
  bool experimental = false;
  // A kernel that needs its LaunchContext (scratch) launches through this instead of `launch`
  // (then nullptr). Returns "" or the error.
  std::string (*launch_with_context)(const GemmProblem& problem, LaunchContext& ctx) = nullptr;

  bool Supports(Accumulation acc) const { return acc == Accumulation::kFp16 ? fp16_acc : fp32_acc; }
  bool SupportsLayout(bool transpose_a, bool transpose_b) const {
    return (layouts & LayoutBit(transpose_a, transpose_b)) != 0;
  }
  bool SupportsTypes(DataType ab, DataType c) const { return (types & TypesBit(ab, c)) != 0; }
};

// All variants in a stable order: the project's kernels first (fastest-expected first), then
// the fallback, "cublas" and "auto".
const std::vector<VariantInfo>& Variants();

// The variant named `name`, or nullptr if there is none.
const VariantInfo* FindVariant(std::string_view name);

// The fallback variant (any shape, any alignment, both accumulations).
const VariantInfo& FallbackVariant();

// True if the environment opts "auto" into experimental variants (HGEMM_AUTO_EXPERIMENTAL=1,
// read on every call). Thread-safe as far as getenv is (no concurrent setenv).
bool AutoTakesExperimental();

// True if "auto" may consider `v`: any variant but an experimental one without the opt-in.
inline bool AutoMayUse(const VariantInfo& v) { return !v.experimental || AutoTakesExperimental(); }

// Per-stream resources: a lazily created cuBLAS handle bound to the stream and scratch buffers
// for tuning. One per worker stream; not thread-safe; the caller owns the stream, which must
// outlive the context. Not copyable.
class LaunchContext {
 public:
  explicit LaunchContext(cudaStream_t stream);
  ~LaunchContext();
  LaunchContext(const LaunchContext&) = delete;
  LaunchContext& operator=(const LaunchContext&) = delete;

  cudaStream_t stream() const { return stream_; }

  // The cuBLAS handle bound to stream(), created on first use. Returns nullptr and sets *error
  // if creation fails.
  cublasHandle_t cublas(std::string* error);

  // Device scratch of at least `bytes` in one of five slots (kTuningScratch for ChooseAuto's
  // operands, kPaddingScratch for pad8_ variants, kGroupScratch for LaunchGrouped's pointer
  // arrays, kSplitKScratch for the fp32 partials of splitk variants, kStreamKScratch for a
  // stream-K tail's partial tiles and counters), owned by the context and
  // grown on demand (the old buffer is freed after synchronizing the stream). Work enqueued on
  // stream() may use it until the next call for the same slot. Returns nullptr and sets *error
  // on failure.
  static constexpr int kTuningScratch = 0;
  static constexpr int kPaddingScratch = 1;
  static constexpr int kGroupScratch = 2;
  static constexpr int kSplitKScratch = 3;
  static constexpr int kStreamKScratch = 4;
  static constexpr int kScratchSlots = 5;
  void* Scratch(int slot, size_t bytes, std::string* error);

 private:
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
  void* scratch_[kScratchSlots] = {};
  size_t scratch_bytes_[kScratchSlots] = {};
};

// Why `variant` cannot run `problem`, or an empty string if it can (shape, accumulation, layout,
// element types, strides, pointers and their alignment; for a batch, its strides and items 0
// and 1, the least aligned). Does not touch the device.
std::string CheckProblem(const VariantInfo& variant, const GemmProblem& problem);

// Enqueues C = alpha·op(A)·op(B) + beta·C_in on ctx's stream (asynchronous; see GemmProblem; a
// scaled problem on cublas first copies C_in into C where c_in is not c, then calls
// cublasGemmEx with alpha and beta). Returns an empty string on success,
// else a message (CUDA/cuBLAS error text, or why the variant can't take this problem).
// "auto" first resolves through ChooseAutoFor (which may synchronize ctx's stream once per
// bucket and form). A batch is one launch where the variant is `batched` (cublas: one
// cublasGemmStridedBatchedEx), else one launch per item.
std::string Launch(const VariantInfo& variant, const GemmProblem& problem, LaunchContext& ctx);

// A group of GEMMs of different shapes (cublasGemmGroupedBatchedEx's problem, each its own
// group of one): "cublas" runs them as one cublasGemmGroupedBatchedEx (fp32 compute; its device
// array of pointers in ctx's kGroupScratch); a variant with launch_grouped (the wgmma family)
// as one launch when all problems share one layout and type pair (their tensor maps in
// kGroupScratch); anything else as a loop of Launch, one per problem, in order. Each problem
// must have batch = 1 and pass CheckProblem; the first refusal or error names the problem's
// index.
std::string LaunchGrouped(const VariantInfo& variant, const std::vector<GemmProblem>& problems,
                          LaunchContext& ctx);

// The kernel "auto" runs for this shape and accumulation: on first use of the shape bucket it
// times the candidate kernels (the project's own, never cuBLAS) on ctx's stream with scratch
// buffers of this shape filled with random data, synchronizing ctx's stream; the choice is then
// cached process-wide (thread-safe). If tuning cannot run (no memory, a CUDA error) it returns
// DefaultVariant without caching. Always returns a kernel that can take the shape.
const VariantInfo& ChooseAuto(int m, int n, int k, Accumulation acc, LaunchContext& ctx);

// The heuristic choice used before (or instead of) tuning: no device work (it reads the current
// device's SM count, cached per device), thread-safe.
const VariantInfo& DefaultVariant(int m, int n, int k, Accumulation acc);

// The untuned choice for a problem other than NN fp16 packed: DefaultVariant's choice if it
// takes the problem, else the first kernel in Variants() order that does; nullptr if none does
// (e.g. a transposed layout on a device without the wgmma family). No device work.
const VariantInfo* AutoVariantFor(const GemmProblem& problem);

// What "auto" runs for `problem`: NN fp16 packed goes to ChooseAuto; other layouts and types are
// tuned the same way per (shape bucket, alignment, accumulation, layout, type pair) among the
// kernels that take the problem, on packed scratch operands of its types (strides do not enter
// the bucket; a cached choice that refuses the strides or alignment is not used), and cached
// process-wide. nullptr if no kernel takes the problem; AutoVariantFor's choice, uncached, if
// tuning cannot run.
const VariantInfo* ChooseAutoFor(const GemmProblem& problem, LaunchContext& ctx);

// The variants "auto" measures for `problem` (ChooseAuto's for NN fp16 packed, ChooseAutoFor's
// otherwise): those that read the operands in place, else the padded wrappers and the fallback;
// experimental ones only where AutoTakesExperimental(). No device work.
std::vector<const VariantInfo*> AutoCandidates(const GemmProblem& problem);

// How a splitk variant cuts K into at most s slices: `count` slices, all but the last `depth`
// deep (a multiple of the wgmma K tile, 64), the last the rest (1 to depth). REQUIRES: k, s >= 1.
struct KSlices {
  int count, depth;
};
KSlices SliceK(int k, int s);

// The problems a splitk variant launches for `p` (batch 1), one per slice of SliceK(p.k, s):
// slice i reads op(A)'s columns and op(B)'s rows [i·depth, i·depth + k_i) in place (pointers
// offset, the whole matrices' row strides) and writes C_i = its m×n fp32 partial, packed, at
// partials + i·m·n (fp32 accumulation). No device work.
std::vector<GemmProblem> SplitKProblems(const GemmProblem& p, int s, float* partials);

// The cached auto choice for the bucket of this shape, or nullptr if it has not been tuned.
const VariantInfo* CachedAutoChoice(int m, int n, int k, Accumulation acc);

}  // namespace hgemm::kernels

#endif  // HGEMM_KERNELS_REGISTRY_H_
