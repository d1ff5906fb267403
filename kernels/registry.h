// The kernel registry: every GEMM implementation the service can run, by name.
//
// A variant is one instantiated kernel configuration (e.g. "wmma_128x128_s3_dsmem_swz"), the
// guarded fallback for shapes the 16-byte path cannot take ("wmma_64x64_s2_ssmem_unaligned"), a
// padded wrapper that copies unaligned operands into zero-padded scratch and runs a 16-byte
// kernel ("pad8_<kernel>"), cuBLAS ("cublas") or "auto" (resolved per shape bucket by ChooseAuto). All compute
// C = A·B with row-major fp16 A (m×k), B (k×n) and C (m×n), accumulating in fp16 or fp32.
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

// One GEMM request. Pointers are device memory, row-major and densely packed (lda = k, ldb = n,
// ldc = n). The caller owns the memory and keeps it alive until the launch completes.
struct GemmProblem {
  const __half* a;  // m×k
  const __half* b;  // k×n
  __half* c;        // m×n, fully overwritten
  int m, n, k;
  Accumulation accumulation;
};

class LaunchContext;

enum class VariantKind {
  kKernel,  // one of the project's kernels
  kPadded,  // pads K and N to multiples of 8 in LaunchContext scratch, then runs `inner`
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
  bool is_fallback;         // takes any shape; slower
  int swizzle_stride;       // block swizzle band in columns; 0 = no swizzle
  int block_m, block_n;     // block tile (0 for cublas/auto)
  int stages;               // cp.async pipeline depth (0 for cublas/auto)
  std::string inner;        // kPadded: the 16-byte kernel it runs on the padded copies
  // Enqueues the kernel on `stream`; nullptr for cublas/auto. REQUIRES: can_implement and the
  // accumulation checked; returns the CUDA launch error.
  cudaError_t (*launch)(const GemmProblem& problem, int swizzle_stride, cudaStream_t stream);

  bool Supports(Accumulation acc) const { return acc == Accumulation::kFp16 ? fp16_acc : fp32_acc; }
};

// All variants in a stable order: the project's kernels first (fastest-expected first), then
// the fallback, "cublas" and "auto".
const std::vector<VariantInfo>& Variants();

// The variant named `name`, or nullptr if there is none.
const VariantInfo* FindVariant(std::string_view name);

// The fallback variant (any shape, any alignment, both accumulations).
const VariantInfo& FallbackVariant();

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

  // Device scratch of at least `bytes` in one of two slots (kTuningScratch for ChooseAuto's
  // operands, kPaddingScratch for pad8_ variants), owned by the context and grown on demand (the
  // old buffer is freed after synchronizing the stream). Work enqueued on stream() may use it
  // until the next call for the same slot. Returns nullptr and sets *error on failure.
  static constexpr int kTuningScratch = 0;
  static constexpr int kPaddingScratch = 1;
  void* Scratch(int slot, size_t bytes, std::string* error);

 private:
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
  void* scratch_[2] = {nullptr, nullptr};
  size_t scratch_bytes_[2] = {0, 0};
};

// Why `variant` cannot run `problem`, or an empty string if it can (shape, accumulation,
// pointers and their alignment). Does not touch the device.
std::string CheckProblem(const VariantInfo& variant, const GemmProblem& problem);

// Enqueues C = A·B on ctx's stream (asynchronous). Returns an empty string on success, else a
// message (CUDA/cuBLAS error text, or why the variant can't take this shape/accumulation).
// "auto" first resolves through ChooseAuto (which may synchronize ctx's stream once per bucket).
std::string Launch(const VariantInfo& variant, const GemmProblem& problem, LaunchContext& ctx);

// The kernel "auto" runs for this shape and accumulation: on first use of the shape bucket it
// times the candidate kernels (the project's own, never cuBLAS) on ctx's stream with scratch
// buffers of this shape filled with random data, synchronizing ctx's stream; the choice is then
// cached process-wide (thread-safe). If tuning cannot run (no memory, a CUDA error) it returns
// DefaultVariant without caching. Always returns a kernel that can take the shape.
const VariantInfo& ChooseAuto(int m, int n, int k, Accumulation acc, LaunchContext& ctx);

// The heuristic choice used before (or instead of) tuning: no device work (it reads the current
// device's SM count, cached per device), thread-safe.
const VariantInfo& DefaultVariant(int m, int n, int k, Accumulation acc);

// The cached auto choice for the bucket of this shape, or nullptr if it has not been tuned.
const VariantInfo* CachedAutoChoice(int m, int n, int k, Accumulation acc);

}  // namespace hgemm::kernels

#endif  // HGEMM_KERNELS_REGISTRY_H_
