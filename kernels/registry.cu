#include "kernels/registry.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/variant_lists.h"

namespace hgemm::kernels {
namespace internal {

bool ShapeFitsGrid(int m, int n, int k, int block_m) {
  return m >= 1 && n >= 1 && k >= 1 && (m + block_m - 1) / block_m <= 65535;
}

}  // namespace internal

namespace {

bool AnyShape(int m, int n, int k) { return m >= 1 && n >= 1 && k >= 1; }

std::vector<VariantInfo> BuildVariants() {
  std::vector<VariantInfo> all = internal::MmaVariants();
  std::vector<VariantInfo> wmma = internal::WmmaVariants();
  all.insert(all.end(), wmma.begin(), wmma.end());
  // Fallbacks after the fast kernels, keeping each family's order.
  std::stable_partition(all.begin(), all.end(), [](const VariantInfo& v) { return !v.is_fallback; });
  all.push_back(VariantInfo{"cublas", "cublasGemmEx (fp32 compute for fp32 acc, fp16 for fp16 acc)",
                            true, true, 0, 50, &AnyShape, "any m, n, k >= 1",
                            VariantKind::kCublas, false, 0, 0, 0, 0, nullptr});
  all.push_back(VariantInfo{"auto", "tuned per shape bucket among the project's kernels", true,
                            true, 0, 90, &AnyShape, "any m, n, k >= 1", VariantKind::kAuto,
                            false, 0, 0, 0, 0, nullptr});
  return all;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

std::string CudaError(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

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

}  // namespace

const char* AccumulationName(Accumulation acc) {
  return acc == Accumulation::kFp16 ? "fp16" : "fp32";
}

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
  if (scratch_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaFree(scratch_);
  }
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

void* LaunchContext::Scratch(size_t bytes, std::string* error) {
  if (bytes <= scratch_bytes_) return scratch_;
  if (scratch_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  if (cudaError_t e = cudaMalloc(&scratch_, bytes); e != cudaSuccess) {
    scratch_ = nullptr;
    *error = CudaError("cudaMalloc of tuning scratch", e);
    return nullptr;
  }
  scratch_bytes_ = bytes;
  return scratch_;
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
    case VariantKind::kKernel:
      if (cudaError_t e = v.launch(p, v.swizzle_stride, ctx.stream()); e != cudaSuccess)
        return CudaError(("launch of " + v.name).c_str(), e);
      return "";
  }
  return "unknown variant kind";
}

}  // namespace hgemm::kernels
