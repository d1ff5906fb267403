#include "kernels/registry.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/align.h"
#include "kernels/cuda_check.h"
#include "kernels/fill.h"
#include "kernels/variant_lists.h"

namespace hgemm::kernels {
namespace internal {

bool ShapeFitsGrid(int m, int n, int k, int block_m) {
  return m >= 1 && n >= 1 && k >= 1 && (m + block_m - 1) / block_m <= 65535;
}

}  // namespace internal

namespace {

bool AnyShape(int m, int n, int k) { return m >= 1 && n >= 1 && k >= 1; }

bool PaddedShape(int m, int n, int k) {
  return internal::ShapeFitsGrid(m, n, k, 128) && n <= (1 << 30) && k <= (1 << 30);
}

// pad8_<inner>: runs `inner` on zero-padded copies, so it takes what inner supports and needs
// (accumulations, shared memory, SM) on any shape.
VariantInfo PaddedVariant(const VariantInfo& inner) {
  VariantInfo v = inner;
  v.name = "pad8_" + inner.name;
  v.description = "copies unaligned operands to zero-padded scratch, then " + inner.name;
  v.can_implement = &PaddedShape;
  v.constraints = "any m, n, k >= 1 (uses scratch)";
  v.kind = VariantKind::kPadded;
  v.is_fallback = false;
  v.swizzle_stride = 0;
  v.inner = inner.name;
  v.launch = nullptr;
  return v;
}

std::vector<VariantInfo> BuildVariants() {
  std::vector<VariantInfo> all = internal::WgmmaVariants();
  std::vector<VariantInfo> mma = internal::MmaVariants();
  all.insert(all.end(), mma.begin(), mma.end());
  std::vector<VariantInfo> wmma = internal::WmmaVariants();
  all.insert(all.end(), wmma.begin(), wmma.end());
  // Fallbacks after the fast kernels, keeping each family's order.
  std::stable_partition(all.begin(), all.end(), [](const VariantInfo& v) { return !v.is_fallback; });
  // Padded wrappers, for shapes only the fallback could take otherwise; the wgmma one only where
  // that family is listed (sm_90 devices).
  for (const char* inner : {"wgmma_128x256_s4_g8", "mma_128x128_bk32_s4_swz"}) {
    auto it = std::find_if(all.begin(), all.end(),
                           [&](const VariantInfo& v) { return v.name == inner; });
    if (it != all.end()) all.push_back(PaddedVariant(*it));
  }
  all.push_back(VariantInfo{"cublas", "cublasGemmEx (fp32 compute for fp32 acc, fp16 for fp16 acc)",
                            true, true, 0, 50, &AnyShape, "any m, n, k >= 1",
                            VariantKind::kCublas, false, 0, 0, 0, 0, "", nullptr});
  all.push_back(VariantInfo{"auto", "tuned per shape bucket among the project's kernels", true,
                            true, 0, 90, &AnyShape, "any m, n, k >= 1", VariantKind::kAuto,
                            false, 0, 0, 0, 0, "", nullptr});
  return all;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

std::string CublasError(const char* what, cublasStatus_t s) {
  return std::string(what) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")";
}

std::string LaunchCublas(const GemmProblem& p, LaunchContext& ctx) {
  std::string error;
  cublasHandle_t handle = ctx.cublas(&error);
  if (handle == nullptr) return error;
  // Row-major C = A·B is column-major C^T = B^T·A^T: swap the operands, no transposes.
  cublasStatus_t s;
  if (p.accumulation == Accumulation::kFp32) {
    const float alpha = 1.f, beta = 0.f;
    s = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, p.n, p.m, p.k, &alpha, p.b, CUDA_R_16F, p.n,
                     p.a, CUDA_R_16F, p.k, &beta, p.c, CUDA_R_16F, p.n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
  } else {
    const __half alpha = __float2half(1.f), beta = __float2half(0.f);
    s = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, p.n, p.m, p.k, &alpha, p.b, CUDA_R_16F, p.n,
                     p.a, CUDA_R_16F, p.k, &beta, p.c, CUDA_R_16F, p.n, CUBLAS_COMPUTE_16F,
                     CUBLAS_GEMM_DEFAULT);
  }
  if (s != CUBLAS_STATUS_SUCCESS) return CublasError("cublasGemmEx", s);
  return "";
}

// pad8_<inner>: copies whichever operands the 16-byte kernel cannot read in place (K or N not a
// multiple of 8, or a pointer not 16-byte aligned) into zero-padded scratch, runs the inner
// kernel on (m, n8, k8), and copies C back. Zero columns of A and rows of B add nothing.
std::string LaunchPadded(const VariantInfo& v, const GemmProblem& p, LaunchContext& ctx) {
  const VariantInfo* inner = FindVariant(v.inner);
  if (inner == nullptr || inner->kind != VariantKind::kKernel) return "bad inner variant " + v.inner;
  const int k8 = (p.k + 7) / 8 * 8, n8 = (p.n + 7) / 8 * 8;
  const bool pad_a = k8 != p.k || !Aligned16(p.a);
  const bool pad_b = k8 != p.k || n8 != p.n || !Aligned16(p.b);
  const bool pad_c = n8 != p.n || !Aligned16(p.c);
  const size_t a_bytes = pad_a ? AlignUp(size_t(p.m) * k8 * 2) : 0;
  const size_t b_bytes = pad_b ? AlignUp(size_t(k8) * n8 * 2) : 0;
  const size_t c_bytes = pad_c ? AlignUp(size_t(p.m) * n8 * 2) : 0;
  unsigned char* base = nullptr;
  if (a_bytes + b_bytes + c_bytes > 0) {
    std::string error;
    base = static_cast<unsigned char*>(
        ctx.Scratch(LaunchContext::kPaddingScratch, a_bytes + b_bytes + c_bytes, &error));
    if (base == nullptr) return error;
  }
  cudaStream_t stream = ctx.stream();
  GemmProblem q = p;
  q.n = n8;
  q.k = k8;
  if (pad_a) {
    auto* a = reinterpret_cast<__half*>(base);
    if (cudaError_t e = CopyPadded(a, p.m, k8, p.a, p.m, p.k, stream); e != cudaSuccess)
      return CudaErrorText("padding a", e);
    q.a = a;
  }
  if (pad_b) {
    auto* b = reinterpret_cast<__half*>(base + a_bytes);
    if (cudaError_t e = CopyPadded(b, k8, n8, p.b, p.k, p.n, stream); e != cudaSuccess)
      return CudaErrorText("padding b", e);
    q.b = b;
  }
  if (pad_c) q.c = reinterpret_cast<__half*>(base + a_bytes + b_bytes);
  if (std::string why = CheckProblem(*inner, q); !why.empty()) return why;
  if (cudaError_t e = inner->launch(q, inner->swizzle_stride, stream); e != cudaSuccess)
    return CudaErrorText(("launch of " + inner->name).c_str(), e);
  if (pad_c) {
    if (cudaError_t e = CopyPadded(p.c, p.m, p.n, q.c, p.m, n8, stream); e != cudaSuccess)
      return CudaErrorText("unpadding c", e);
  }
  return "";
}

}  // namespace

const std::vector<VariantInfo>& Variants() {
  static const std::vector<VariantInfo>* const variants =
      new std::vector<VariantInfo>(BuildVariants());
  return *variants;
}

const VariantInfo* FindVariant(std::string_view name) {
  for (const VariantInfo& v : Variants())
    if (v.name == name) return &v;
  return nullptr;
}

const VariantInfo& FallbackVariant() {
  for (const VariantInfo& v : Variants())
    if (v.is_fallback) return v;
  std::abort();  // unreachable: WmmaVariants() always registers one
}

LaunchContext::LaunchContext(cudaStream_t stream) : stream_(stream) {}

LaunchContext::~LaunchContext() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (scratch_[0] != nullptr || scratch_[1] != nullptr) cudaStreamSynchronize(stream_);
  for (void* p : scratch_)
    if (p != nullptr) cudaFree(p);
}

cublasHandle_t LaunchContext::cublas(std::string* error) {
  if (cublas_ != nullptr) return cublas_;
  cublasHandle_t handle = nullptr;
  if (cublasStatus_t s = cublasCreate(&handle); s != CUBLAS_STATUS_SUCCESS) {
    *error = CublasError("cublasCreate", s);
    return nullptr;
  }
  if (cublasStatus_t s = cublasSetStream(handle, stream_); s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle);
    *error = CublasError("cublasSetStream", s);
    return nullptr;
  }
  cublas_ = handle;
  return cublas_;
}

void* LaunchContext::Scratch(int slot, size_t bytes, std::string* error) {
  if (slot != kTuningScratch && slot != kPaddingScratch) {
    *error = "no scratch slot " + std::to_string(slot);
    return nullptr;
  }
  if (bytes <= scratch_bytes_[slot]) return scratch_[slot];
  if (scratch_[slot] != nullptr) {
    cudaStreamSynchronize(stream_);  // work in flight may still use the old buffer
    cudaFree(scratch_[slot]);
    scratch_[slot] = nullptr;
    scratch_bytes_[slot] = 0;
  }
  if (cudaError_t e = cudaMalloc(&scratch_[slot], bytes); e != cudaSuccess) {
    scratch_[slot] = nullptr;
    *error = CudaErrorText("cudaMalloc of scratch", e);
    return nullptr;
  }
  scratch_bytes_[slot] = bytes;
  return scratch_[slot];
}

std::string CheckProblem(const VariantInfo& v, const GemmProblem& p) {
  if (p.m < 1 || p.n < 1 || p.k < 1)
    return "m, n and k must be >= 1, got " + std::to_string(p.m) + "x" + std::to_string(p.n) +
           "x" + std::to_string(p.k);
  if (p.a == nullptr || p.b == nullptr || p.c == nullptr) return "a, b and c must be non-null";
  if (!v.Supports(p.accumulation))
    return "variant " + v.name + " does not support " + AccumulationName(p.accumulation) +
           " accumulation";
  if (!v.can_implement(p.m, p.n, p.k))
    return "variant " + v.name + " cannot take " + std::to_string(p.m) + "x" +
           std::to_string(p.n) + "x" + std::to_string(p.k) + " (requires " + v.constraints +
           "; " + FallbackVariant().name + " takes any shape)";
  if (v.kind == VariantKind::kKernel && !v.is_fallback &&
      !(Aligned16(p.a) && Aligned16(p.b) && Aligned16(p.c)))
    return "variant " + v.name + " needs 16-byte aligned a, b and c";
  return "";
}

std::string Launch(const VariantInfo& v, const GemmProblem& p, LaunchContext& ctx) {
  if (std::string why = CheckProblem(v, p); !why.empty()) return why;
  switch (v.kind) {
    case VariantKind::kCublas:
      return LaunchCublas(p, ctx);
    case VariantKind::kAuto: {
      const VariantInfo& chosen = ChooseAuto(p.m, p.n, p.k, p.accumulation, ctx);
      std::string why = CheckProblem(chosen, p);  // alignment is not part of the bucket
      return Launch(why.empty() ? chosen : FallbackVariant(), p, ctx);
    }
    case VariantKind::kPadded:
      return LaunchPadded(v, p, ctx);
    case VariantKind::kKernel:
      if (cudaError_t e = v.launch(p, v.swizzle_stride, ctx.stream()); e != cudaSuccess)
        return CudaErrorText(("launch of " + v.name).c_str(), e);
      return "";
  }
  return "unknown variant kind";
}

}  // namespace hgemm::kernels
