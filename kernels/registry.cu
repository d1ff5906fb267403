#include "kernels/registry.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

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

// The stored extent of an operand: rows × cols as it lies in memory, and its row stride.
struct Stored {
  int rows, cols, ld;
};
Stored StoredA(const GemmProblem& p) {
  const int rows = p.transpose_a ? p.k : p.m, cols = p.transpose_a ? p.m : p.k;
  return {rows, cols, p.lda == 0 ? cols : p.lda};
}
Stored StoredB(const GemmProblem& p) {
  const int rows = p.transpose_b ? p.n : p.k, cols = p.transpose_b ? p.k : p.n;
  return {rows, cols, p.ldb == 0 ? cols : p.ldb};
}
Stored StoredC(const GemmProblem& p) { return {p.m, p.n, p.ldc == 0 ? p.n : p.ldc}; }
int64_t Extent(const Stored& s) { return int64_t(s.rows) * s.ld; }

bool IsDefaultForm(const GemmProblem& p) {
  return !Scaled(p) && !p.transpose_a && !p.transpose_b && p.ab_type == DataType::kFp16 &&
         p.c_type == DataType::kFp16 && StoredA(p).ld == p.k && StoredB(p).ld == p.n &&
         StoredC(p).ld == p.n;
}

bool PaddedShape(int m, int n, int k) {
  return internal::ShapeFitsGrid(m, n, k, 128) && n <= (1 << 30) && k <= (1 << 30);
}

// pad8_<inner>: runs `inner` on zero-padded copies, so it takes what inner supports and needs
// (accumulations, layouts, types, shared memory, SM) on any shape and any strides.
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
  v.strided = true;  // a padded copy is packed
  v.check_layout = nullptr;
  v.batched = false;  // a batch: one padded launch per item
  v.launch_grouped = nullptr;
  v.fused_scale = false;  // C goes through a padded copy; the backend scales it afterwards
  return v;
}

std::vector<VariantInfo> BuildVariants() {
  std::vector<VariantInfo> all = internal::WgmmaVariants();
  std::vector<VariantInfo> mma = internal::MmaVariants();
  all.insert(all.end(), mma.begin(), mma.end());
  std::vector<VariantInfo> skinny = internal::SkinnyVariants();
  all.insert(all.end(), skinny.begin(), skinny.end());
  std::vector<VariantInfo> wmma = internal::WmmaVariants();
  all.insert(all.end(), wmma.begin(), wmma.end());
  // Fallbacks after the fast kernels, keeping each family's order.
  std::stable_partition(all.begin(), all.end(),
                        [](const VariantInfo& v) { return !v.is_fallback; });
  // Padded wrappers, for shapes only the fallback could take otherwise; the wgmma one only where
  // that family is listed (sm_90 devices).
  for (const char* inner : {"wgmma_128x256_s4_g8", "mma_128x128_bk32_s4_swz"}) {
    auto it =
        std::find_if(all.begin(), all.end(), [&](const VariantInfo& v) { return v.name == inner; });
    if (it != all.end()) all.push_back(PaddedVariant(*it));
  }
  // Split-K wrappers for skinny M over the two wgmma tiles with the fewest rows (auto measures
  // them against the kernels; docs/kernels_notes.md predicts s = 2 at M <= 64).
  for (const char* inner : {"wgmma_64x128_s8_g8", "wgmma_128x128_s6_g8"}) {
    auto it =
        std::find_if(all.begin(), all.end(), [&](const VariantInfo& v) { return v.name == inner; });
    if (it == all.end()) continue;
    const VariantInfo base = *it;  // push_back may move *it
    for (int s : {2, 4, 8}) all.push_back(internal::SplitKVariant(base, s));
  }
  VariantInfo cublas{"cublas",
                     "cublasGemmEx with the problem's ops and types (fp32 compute for fp32 "
                     "acc, fp16 for fp16 acc); a batch: cublasGemmStridedBatchedEx; a "
                     "group: cublasGemmGroupedBatchedEx",
                     true,
                     true,
                     0,
                     50,
                     &AnyShape,
                     "any m, n, k >= 1",
                     VariantKind::kCublas,
                     false,
                     0,
                     0,
                     0,
                     0,
                     "",
                     nullptr,
                     kAllLayouts,
                     kAllTypes,
                     /*strided=*/true,
                     nullptr,
                     /*batched=*/true};
  cublas.fused_scale = true;  // cublasGemmEx's own alpha and beta
  all.push_back(cublas);
  VariantInfo automatic{"auto",
                        "tuned per shape bucket (and layout, types) among the project's kernels",
                        true,
                        true,
                        0,
                        90,
                        &AnyShape,
                        "any m, n, k >= 1",
                        VariantKind::kAuto,
                        false,
                        0,
                        0,
                        0,
                        0,
                        "",
                        nullptr,
                        kAllLayouts,
                        kAllTypes,
                        /*strided=*/true,
                        nullptr};
  automatic.fused_scale = true;  // a scaled problem is tuned among the fused variants
  all.push_back(automatic);
  return all;
}

std::string CublasError(const char* what, cublasStatus_t s) {
  return std::string(what) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")";
}

cudaDataType_t CublasType(DataType t) {
  switch (t) {
    case DataType::kFp16:
      return CUDA_R_16F;
    case DataType::kBf16:
      return CUDA_R_16BF;
    case DataType::kFp32:
      return CUDA_R_32F;
  }
  return CUDA_R_16F;
}

// cublasGemmEx, or cublasGemmStridedBatchedEx for a batch, with scalars of `compute`'s type.
std::string CublasGemm(const GemmProblem& p, const void* alpha, const void* beta,
                       cublasComputeType_t compute, LaunchContext& ctx) {
  std::string error;
  cublasHandle_t handle = ctx.cublas(&error);
  if (handle == nullptr) return error;
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B goes first. A row-major
  // X seen column-major is Xᵀ, so a stored operand that is not transposed is passed as
  // CUBLAS_OP_N and a transposed one as CUBLAS_OP_T, each with its stored row stride.
  const cublasOperation_t op_b = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = StoredB(p).ld, lda = StoredA(p).ld, ldc = StoredC(p).ld;
  const cudaDataType_t ab = CublasType(p.ab_type), c = CublasType(p.c_type);
  if (p.batch == 1) {
    if (cublasStatus_t s = cublasGemmEx(handle, op_b, op_a, p.n, p.m, p.k, alpha, p.b, ab, ldb, p.a,
                                        ab, lda, beta, p.c, c, ldc, compute, CUBLAS_GEMM_DEFAULT);
        s != CUBLAS_STATUS_SUCCESS)
      return CublasError("cublasGemmEx", s);
    return "";
  }
  const BatchStrides st = StridesOf(p);
  if (cublasStatus_t s = cublasGemmStridedBatchedEx(
          handle, op_b, op_a, p.n, p.m, p.k, alpha, p.b, ab, ldb, st.b, p.a, ab, lda, st.a, beta,
          p.c, c, ldc, st.c, p.batch, compute, CUBLAS_GEMM_DEFAULT);
      s != CUBLAS_STATUS_SUCCESS)
    return CublasError("cublasGemmStridedBatchedEx", s);
  return "";
}

// cuBLAS reads C_in from C: copies each item's C_in into its C (same type, ldc and item
// stride) on ctx's stream, unless beta is 0 or c_in is c.
std::string CopyCInToC(const GemmProblem& p, LaunchContext& ctx) {
  if (p.beta == 0.0f || p.c_in == p.c) return "";
  const size_t bytes = DataTypeBytes(p.c_type);
  const size_t pitch = size_t(StoredC(p).ld) * bytes;
  for (int i = 0; i < p.batch; ++i) {
    const GemmProblem item = BatchItem(p, i);
    if (cudaError_t e = cudaMemcpy2DAsync(item.c, pitch, item.c_in, pitch, size_t(p.n) * bytes, p.m,
                                          cudaMemcpyDeviceToDevice, ctx.stream());
        e != cudaSuccess)
      return CudaErrorText("copying c_in into c", e);
  }
  return "";
}

std::string LaunchCublas(const GemmProblem& p, LaunchContext& ctx) {
  if (std::string e = CopyCInToC(p, ctx); !e.empty()) return e;
  if (p.accumulation == Accumulation::kFp32)
    return CublasGemm(p, &p.alpha, &p.beta, CUBLAS_COMPUTE_32F, ctx);
  const __half alpha = __float2half(p.alpha), beta = __float2half(p.beta);
  return CublasGemm(p, &alpha, &beta, CUBLAS_COMPUTE_16F, ctx);
}

// One cublasGemmGroupedBatchedEx, each problem a group of one. Its scalars and shapes are host
// arrays; the operand pointers a device array (staged through kGroupScratch).
std::string LaunchCublasGrouped(const std::vector<GemmProblem>& problems, LaunchContext& ctx) {
  const GemmProblem& first = problems.front();
  if (first.accumulation != Accumulation::kFp32)
    return "cublasGemmGroupedBatchedEx computes in fp32 only: use fp32 accumulation";
  // It takes C of the inputs' type alone (CUBLAS_STATUS_NOT_SUPPORTED for fp16 -> fp32 on the
  // H100, cuBLAS 13): such a group is a loop of cublasGemmEx calls.
  if (first.c_type != first.ab_type) {
    for (size_t i = 0; i < problems.size(); ++i)
      if (std::string e = LaunchCublas(problems[i], ctx); !e.empty())
        return "problem " + std::to_string(i) + ": " + e;
    return "";
  }
  const size_t count = problems.size();
  std::vector<cublasOperation_t> op_b(count), op_a(count);
  std::vector<int> rows(count), cols(count), depth(count), ldb(count), lda(count), ldc(count),
      sizes(count, 1);
  std::vector<float> alpha(count), beta(count);
  std::vector<const void*> pointers(3 * count);  // all B, then all A, then all C
  for (size_t i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    if (p.ab_type != first.ab_type || p.c_type != first.c_type ||
        p.accumulation != first.accumulation)
      return "problem " + std::to_string(i) +
             ": cublasGemmGroupedBatchedEx takes one set of element types and one accumulation "
             "for the whole group";
    op_b[i] = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // as in CublasGemm: B first
    op_a[i] = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    rows[i] = p.n;
    cols[i] = p.m;
    depth[i] = p.k;
    ldb[i] = StoredB(p).ld;
    lda[i] = StoredA(p).ld;
    ldc[i] = StoredC(p).ld;
    alpha[i] = p.alpha;
    beta[i] = p.beta;
    if (std::string e = CopyCInToC(p, ctx); !e.empty())
      return "problem " + std::to_string(i) + ": " + e;
    pointers[i] = p.b;
    pointers[count + i] = p.a;
    pointers[2 * count + i] = p.c;
  }
  std::string error;
  cublasHandle_t handle = ctx.cublas(&error);
  if (handle == nullptr) return error;
  auto* device_pointers = static_cast<const void**>(
      ctx.Scratch(LaunchContext::kGroupScratch, pointers.size() * sizeof(void*), &error));
  if (device_pointers == nullptr) return error;
  // From pageable memory: returns once the host vector has been staged.
  if (cudaError_t e =
          cudaMemcpyAsync(device_pointers, pointers.data(), pointers.size() * sizeof(void*),
                          cudaMemcpyHostToDevice, ctx.stream());
      e != cudaSuccess)
    return CudaErrorText("copying the group's pointers", e);
  const cudaDataType_t ab = CublasType(first.ab_type), c = CublasType(first.c_type);
  if (cublasStatus_t s = cublasGemmGroupedBatchedEx(
          handle, op_b.data(), op_a.data(), rows.data(), cols.data(), depth.data(), alpha.data(),
          device_pointers, ab, ldb.data(), device_pointers + count, ab, lda.data(), beta.data(),
          const_cast<void* const*>(device_pointers + 2 * count), c, ldc.data(), int(count),
          sizes.data(), CUBLAS_COMPUTE_32F);
      s != CUBLAS_STATUS_SUCCESS)
    return CublasError("cublasGemmGroupedBatchedEx", s);
  return "";
}

// pad8_<inner>: copies whichever operands the 16-byte kernel cannot read in place (K or N not a
// multiple of 8, a row stride that is not, a pointer not 16-byte aligned, a layout the kernel
// does not take) into zero-padded, packed, untransposed scratch, runs the inner kernel on
// (m, n8, k8), and copies C back. Zero columns of A and rows of B add nothing.
std::string LaunchPadded(const VariantInfo& v, const GemmProblem& p, LaunchContext& ctx) {
  const VariantInfo* inner = FindVariant(v.inner);
  if (inner == nullptr || inner->kind != VariantKind::kKernel)
    return "bad inner variant " + v.inner;
  const int k8 = (p.k + 7) / 8 * 8, n8 = (p.n + 7) / 8 * 8;
  const Stored sa = StoredA(p), sb = StoredB(p), sc = StoredC(p);
  // In place: the inner kernel reads the stored matrix as it is (16-byte rows and pointer, a
  // layout it takes; a kernel without strides only packed rows).
  auto in_place = [&](const void* ptr, Stored s) {
    return Aligned16(ptr) && s.cols % 8 == 0 && s.ld % 8 == 0 && (inner->strided || s.ld == s.cols);
  };
  const bool layout_ok = inner->SupportsLayout(p.transpose_a, p.transpose_b);
  const bool pad_a = k8 != p.k || !in_place(p.a, sa) || (p.transpose_a && !layout_ok);
  const bool pad_b = k8 != p.k || n8 != p.n || !in_place(p.b, sb) || (p.transpose_b && !layout_ok);
  const bool pad_c = n8 != p.n || !in_place(p.c, sc);
  const size_t ab = DataTypeBytes(p.ab_type), cb = DataTypeBytes(p.c_type);
  const size_t a_bytes = pad_a ? AlignUp(size_t(p.m) * k8 * ab) : 0;
  const size_t b_bytes = pad_b ? AlignUp(size_t(k8) * n8 * ab) : 0;
  const size_t c_bytes = pad_c ? AlignUp(size_t(p.m) * n8 * cb) : 0;
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
    auto* a = reinterpret_cast<uint16_t*>(base);
    if (cudaError_t e = CopyPadded(a, p.m, k8, static_cast<const uint16_t*>(p.a), p.m, p.k, sa.ld,
                                   p.transpose_a, stream);
        e != cudaSuccess)
      return CudaErrorText("padding a", e);
    q.a = a;
    q.transpose_a = false;
    q.lda = 0;
  }
  if (pad_b) {
    auto* b = reinterpret_cast<uint16_t*>(base + a_bytes);
    if (cudaError_t e = CopyPadded(b, k8, n8, static_cast<const uint16_t*>(p.b), p.k, p.n, sb.ld,
                                   p.transpose_b, stream);
        e != cudaSuccess)
      return CudaErrorText("padding b", e);
    q.b = b;
    q.transpose_b = false;
    q.ldb = 0;
  }
  if (pad_c) {
    q.c = base + a_bytes + b_bytes;
    q.ldc = 0;
  }
  if (std::string why = CheckProblem(*inner, q); !why.empty()) return why;
  if (cudaError_t e = inner->launch(q, inner->swizzle_stride, stream); e != cudaSuccess)
    return CudaErrorText(("launch of " + inner->name).c_str(), e);
  if (pad_c) {
    if (cudaError_t e = cudaMemcpy2DAsync(p.c, sc.ld * cb, q.c, size_t(n8) * cb, size_t(p.n) * cb,
                                          p.m, cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess)
      return CudaErrorText("unpadding c", e);
  }
  return "";
}

// A batch's strides (items may not overlap; the last item's end must fit in int64), then items
// 0 and 1 as single GEMMs (item i's offsets are multiples of item 1's, so together they are the
// least aligned), then a one-launch variant's own batch requirements.
std::string CheckBatch(const VariantInfo& v, const GemmProblem& p) {
  if (p.batch < 1) return "batch must be >= 1, got " + std::to_string(p.batch);
  const BatchStrides s = StridesOf(p);
  for (auto [name, stride, extent] : {std::tuple{"stride_a", s.a, Extent(StoredA(p))},
                                      std::tuple{"stride_b", s.b, Extent(StoredB(p))},
                                      std::tuple{"stride_c", s.c, Extent(StoredC(p))}}) {
    if (stride < extent)
      return std::string(name) + " " + std::to_string(stride) + " is below one item's extent " +
             std::to_string(extent) + " (stored rows × ld; items may not overlap)";
    if (stride > INT64_MAX / p.batch)
      return std::string(name) + " " + std::to_string(stride) + " × batch " +
             std::to_string(p.batch) + " overflows";
  }
  for (int i : {0, 1})
    if (std::string why = CheckProblem(v, BatchItem(p, i)); !why.empty())
      return "batch item " + std::to_string(i) + ": " + why;
  if (v.batched && v.check_layout != nullptr)
    if (std::string why = v.check_layout(p); !why.empty()) return "variant " + v.name + ": " + why;
  return "";
}

}  // namespace

BatchStrides StridesOf(const GemmProblem& p) {
  return {p.stride_a != 0 ? p.stride_a : Extent(StoredA(p)),
          p.stride_b != 0 ? p.stride_b : Extent(StoredB(p)),
          p.stride_c != 0 ? p.stride_c : Extent(StoredC(p))};
}

GemmProblem BatchItem(const GemmProblem& p, int i) {
  const BatchStrides s = StridesOf(p);
  GemmProblem item = p;
  item.batch = 1;
  item.stride_a = item.stride_b = item.stride_c = 0;
  const size_t ab_bytes = DataTypeBytes(p.ab_type), c_bytes = DataTypeBytes(p.c_type);
  item.a = static_cast<const char*>(p.a) + i * s.a * int64_t(ab_bytes);
  item.b = static_cast<const char*>(p.b) + i * s.b * int64_t(ab_bytes);
  item.c = static_cast<char*>(p.c) + i * s.c * int64_t(c_bytes);
  if (p.c_in != nullptr) item.c_in = static_cast<const char*>(p.c_in) + i * s.c * int64_t(c_bytes);
  return item;
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

bool AutoTakesExperimental() {
  const char* opt_in = std::getenv("HGEMM_AUTO_EXPERIMENTAL");
  return opt_in != nullptr && std::string(opt_in) == "1";
}

const VariantInfo& FallbackVariant() {
  for (const VariantInfo& v : Variants())
    if (v.is_fallback) return v;
  std::abort();  // unreachable: WmmaVariants() always registers one
}

LaunchContext::LaunchContext(cudaStream_t stream) : stream_(stream) {}

LaunchContext::~LaunchContext() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (std::any_of(std::begin(scratch_), std::end(scratch_), [](void* p) { return p != nullptr; }))
    cudaStreamSynchronize(stream_);
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
  if (slot < 0 || slot >= kScratchSlots) {
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

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFp16:
      return "fp16";
    case DataType::kBf16:
      return "bf16";
    case DataType::kFp32:
      return "fp32";
  }
  return "?";
}

size_t DataTypeBytes(DataType t) { return t == DataType::kFp32 ? 4 : 2; }

const char* LayoutName(bool transpose_a, bool transpose_b) {
  static const char* const kNames[4] = {"NN", "NT", "TN", "TT"};
  return kNames[(transpose_a ? 2 : 0) + (transpose_b ? 1 : 0)];
}

unsigned TypesBit(DataType ab, DataType c) {
  if (ab == DataType::kFp16 && c == DataType::kFp16) return kTypesFp16;
  if (ab == DataType::kFp16 && c == DataType::kFp32) return kTypesFp16F32;
  if (ab == DataType::kBf16 && c == DataType::kBf16) return kTypesBf16;
  if (ab == DataType::kBf16 && c == DataType::kFp32) return kTypesBf16F32;
  return 0;
}

std::string TypesName(DataType ab, DataType c) {
  return ab == c ? DataTypeName(ab) : std::string(DataTypeName(ab)) + "→" + DataTypeName(c);
}

std::string LayoutList(unsigned bits) {
  std::string out;
  for (int i = 0; i < 4; ++i)
    if (bits & (1u << i)) out += std::string(out.empty() ? "" : ", ") + LayoutName(i & 2, i & 1);
  return out;
}

std::string TypesList(unsigned bits) {
  std::string out;
  const std::pair<DataType, DataType> kPairs[4] = {{DataType::kFp16, DataType::kFp16},
                                                   {DataType::kFp16, DataType::kFp32},
                                                   {DataType::kBf16, DataType::kBf16},
                                                   {DataType::kBf16, DataType::kFp32}};
  for (int i = 0; i < 4; ++i)
    if (bits & (1u << i))
      out += (out.empty() ? "" : ", ") + TypesName(kPairs[i].first, kPairs[i].second);
  return out;
}

std::string CheckProblem(const VariantInfo& v, const GemmProblem& p) {
  if (p.batch != 1) return CheckBatch(v, p);
  if (p.m < 1 || p.n < 1 || p.k < 1)
    return "m, n and k must be >= 1, got " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" +
           std::to_string(p.k);
  if (p.a == nullptr || p.b == nullptr || p.c == nullptr) return "a, b and c must be non-null";
  if (TypesBit(p.ab_type, p.c_type) == 0)
    return std::string("unsupported element types: a and b ") + DataTypeName(p.ab_type) + ", c " +
           DataTypeName(p.c_type) + " (a and b are fp16 or bf16; c is their type or fp32)";
  if (p.accumulation == Accumulation::kFp16 &&
      (p.ab_type != DataType::kFp16 || p.c_type != DataType::kFp16))
    return std::string("fp16 accumulation takes fp16 a, b and c only (got ") +
           TypesName(p.ab_type, p.c_type) + "): use fp32 accumulation";
  for (auto [name, stored] :
       {std::pair{"lda", StoredA(p)}, std::pair{"ldb", StoredB(p)}, std::pair{"ldc", StoredC(p)}})
    if (stored.ld < stored.cols)
      return std::string(name) + " " + std::to_string(stored.ld) +
             " is below the stored row length " + std::to_string(stored.cols);
  if (!v.Supports(p.accumulation))
    return "variant " + v.name + " does not support " + AccumulationName(p.accumulation) +
           " accumulation";
  if (Scaled(p)) {
    if (!v.fused_scale)
      return "variant " + v.name + " does not apply alpha and beta itself (alpha " +
             std::to_string(p.alpha) + ", beta " + std::to_string(p.beta) +
             "); the wgmma_*, splitk*, cublas and auto variants do";
    if (p.beta != 0.0f && p.c_in == nullptr) return "beta != 0 needs c_in (C's input)";
    if (p.beta != 0.0f && v.kind == VariantKind::kKernel && !Aligned16(p.c_in))
      return "variant " + v.name + " needs a 16-byte aligned c_in (its tiles are read by TMA)";
  }
  if (!v.SupportsLayout(p.transpose_a, p.transpose_b))
    return "variant " + v.name + " does not take layout " +
           LayoutName(p.transpose_a, p.transpose_b) +
           " (transpose_a=" + (p.transpose_a ? "true" : "false") +
           ", transpose_b=" + (p.transpose_b ? "true" : "false") + "); it takes " +
           LayoutList(v.layouts) + "; cublas takes every layout";
  if (!v.SupportsTypes(p.ab_type, p.c_type))
    return "variant " + v.name + " does not take element types " + TypesName(p.ab_type, p.c_type) +
           "; it takes " + TypesList(v.types) + "; cublas takes every type";
  if (!v.strided && (StoredA(p).ld != StoredA(p).cols || StoredB(p).ld != StoredB(p).cols ||
                     StoredC(p).ld != StoredC(p).cols))
    return "variant " + v.name + " takes densely packed operands only (lda, ldb, ldc = 0)";
  if (!v.can_implement(p.m, p.n, p.k))
    return "variant " + v.name + " cannot take " + std::to_string(p.m) + "x" + std::to_string(p.n) +
           "x" + std::to_string(p.k) + " (requires " + v.constraints + "; " +
           FallbackVariant().name + " takes any shape)";
  if (v.check_layout != nullptr)
    if (std::string why = v.check_layout(p); !why.empty()) return "variant " + v.name + ": " + why;
  if ((v.kind == VariantKind::kSplitK || (v.kind == VariantKind::kKernel && !v.is_fallback)) &&
      !(Aligned16(p.a) && Aligned16(p.b) && Aligned16(p.c)))
    return "variant " + v.name + " needs 16-byte aligned a, b and c";
  if (v.kind == VariantKind::kAuto && !IsDefaultForm(p) && AutoVariantFor(p) == nullptr)
    return std::string("auto: no kernel on this device takes layout ") +
           LayoutName(p.transpose_a, p.transpose_b) + " with " + TypesName(p.ab_type, p.c_type) +
           " at " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) +
           (p.lda || p.ldb || p.ldc ? " (strided)" : "") + "; cublas does";
  return "";
}

const VariantInfo* AutoVariantFor(const GemmProblem& p) {
  const VariantInfo& preferred = DefaultVariant(p.m, p.n, p.k, p.accumulation);
  if (CheckProblem(preferred, p).empty()) return &preferred;
  for (VariantKind kind : {VariantKind::kKernel, VariantKind::kPadded})
    for (const VariantInfo& v : Variants())
      if (v.kind == kind && AutoMayUse(v) && CheckProblem(v, p).empty()) return &v;
  return nullptr;
}

std::string Launch(const VariantInfo& v, const GemmProblem& p, LaunchContext& ctx) {
  if (std::string why = CheckProblem(v, p); !why.empty()) return why;
  if (p.batch > 1 && !v.batched && v.kind != VariantKind::kAuto) {
    for (int i = 0; i < p.batch; ++i)
      if (std::string e = Launch(v, BatchItem(p, i), ctx); !e.empty())
        return "batch item " + std::to_string(i) + ": " + e;
    return "";
  }
  switch (v.kind) {
    case VariantKind::kCublas:
      return LaunchCublas(p, ctx);
    case VariantKind::kAuto: {
      if (!IsDefaultForm(p)) {  // CheckProblem: some kernel takes it
        const VariantInfo* chosen = ChooseAutoFor(p, ctx);
        return Launch(chosen != nullptr ? *chosen : *AutoVariantFor(p), p, ctx);
      }
      const VariantInfo& chosen = ChooseAuto(p.m, p.n, p.k, p.accumulation, ctx);
      std::string why = CheckProblem(chosen, p);  // alignment is not part of the bucket
      return Launch(why.empty() ? chosen : FallbackVariant(), p, ctx);
    }
    case VariantKind::kPadded:
      return LaunchPadded(v, p, ctx);
    case VariantKind::kSplitK:
      return internal::LaunchSplitK(v, p, ctx);
    case VariantKind::kKernel:
      if (v.launch_with_context != nullptr) return v.launch_with_context(p, ctx);
      if (cudaError_t e = v.launch(p, v.swizzle_stride, ctx.stream()); e != cudaSuccess)
        return CudaErrorText(("launch of " + v.name).c_str(), e);
      return "";
  }
  return "unknown variant kind";
}

std::string LaunchGrouped(const VariantInfo& v, const std::vector<GemmProblem>& problems,
                          LaunchContext& ctx) {
  if (problems.empty()) return "the group is empty";
  for (size_t i = 0; i < problems.size(); ++i) {
    if (problems[i].batch != 1)
      return "problem " + std::to_string(i) + ": batch must be 1 in a group";
    if (std::string why = CheckProblem(v, problems[i]); !why.empty())
      return "problem " + std::to_string(i) + ": " + why;
  }
  if (v.kind == VariantKind::kCublas) return LaunchCublasGrouped(problems, ctx);
  const GemmProblem& first = problems.front();
  const bool one_form = std::all_of(problems.begin(), problems.end(), [&](const GemmProblem& p) {
    return p.transpose_a == first.transpose_a && p.transpose_b == first.transpose_b &&
           p.ab_type == first.ab_type && p.c_type == first.c_type && p.alpha == first.alpha &&
           p.beta == first.beta;
  });
  if (v.launch_grouped != nullptr && one_form) return v.launch_grouped(problems, ctx);
  for (size_t i = 0; i < problems.size(); ++i)
    if (std::string e = Launch(v, problems[i], ctx); !e.empty())
      return "problem " + std::to_string(i) + ": " + e;
  return "";
}

}  // namespace hgemm::kernels
