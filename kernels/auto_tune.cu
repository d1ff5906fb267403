// "auto": per-shape-bucket choice among the project's kernels, by measurement, cached
// process-wide.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/align.h"
#include "kernels/fill.h"
#include "kernels/launch.cuh"
#include "kernels/registry.h"

namespace hgemm::kernels {
namespace {

// Tuning runs on scratch copies of the problem's shape; above this it takes the default.
constexpr size_t kMaxTuneScratchBytes = size_t{3} << 30;
constexpr int kTimedRuns = 3;

// Shapes in one bucket share a choice: each extent rounded up to a power of two (n and k at
// least 16; m from 1, because under 16 rows the fastest kernel changes: skinny_m16 at m = 1,
// the 64x128 wgmma kernel on NT at m = 16, measured on an H100), plus whether the 16-byte path
// applies, the accumulation and the form (layout bit | type-pair bit << 4 | scaling << 8,
// scaling 1 for alpha only, 2 with beta; 0 for NN fp16 unscaled, whose buckets ChooseAuto fills).
struct BucketKey {
  int m, n, k;
  bool vec16;
  Accumulation acc;
  unsigned form = 0;
  bool operator<(const BucketKey& o) const {
    return std::tie(m, n, k, vec16, acc, form) < std::tie(o.m, o.n, o.k, o.vec16, o.acc, o.form);
  }
};

int RoundUpPow2(int x, int floor) {
  int p = floor;
  while (p < x && p < (1 << 30)) p <<= 1;
  return p;
}

BucketKey KeyFor(int m, int n, int k, Accumulation acc) {
  return {RoundUpPow2(m, 1), RoundUpPow2(n, 16), RoundUpPow2(k, 16), n % 8 == 0 && k % 8 == 0, acc};
}

std::mutex& CacheMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

std::map<BucketKey, const VariantInfo*>& Cache() {  // guarded by CacheMutex()
  static auto* cache = new std::map<BucketKey, const VariantInfo*>;
  return *cache;
}

// Variants that read the operands where they are: the 16-byte kernels and the split-K
// wrappers over them (these take skinny M only); experimental ones only with the opt-in.
bool ReadsInPlace(const VariantInfo& v) {
  return ((v.kind == VariantKind::kKernel && !v.is_fallback) || v.kind == VariantKind::kSplitK) &&
         AutoMayUse(v);
}

// The kernels that can take the shape; for shapes the 16-byte kernels cannot take, the padded
// wrappers and the fallback compete instead.
std::vector<const VariantInfo*> Candidates(int m, int n, int k, Accumulation acc) {
  std::vector<const VariantInfo*> out;
  for (const VariantInfo& v : Variants())
    if (ReadsInPlace(v) && v.Supports(acc) && v.can_implement(m, n, k)) out.push_back(&v);
  if (!out.empty()) return out;
  for (const VariantInfo& v : Variants())
    if ((v.kind == VariantKind::kPadded || v.is_fallback) && v.Supports(acc) &&
        v.can_implement(m, n, k))
      out.push_back(&v);
  return out;
}

// NN fp16 with lda, ldb, ldc 0 and 16-byte aligned operands: ChooseAuto's problem (its buckets
// are keyed by shape alone). A group's later problems sit at any offset of its packed matrices.
bool IsDefaultFormPacked(const GemmProblem& p) {
  return !Scaled(p) && !p.transpose_a && !p.transpose_b && p.ab_type == DataType::kFp16 &&
         p.c_type == DataType::kFp16 && p.lda == 0 && p.ldb == 0 && p.ldc == 0 && Aligned16(p.a) &&
         Aligned16(p.b) && Aligned16(p.c);
}

// The current device's SM count; without a device (CI, tests) the H200's 132, on which the
// heuristics were measured.
int CurrentSmCount() {
  constexpr int kMeasuredSmCount = 132;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || detail::SmCount(device, &sms) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" error
    return kMeasuredSmCount;
  }
  return sms;
}

// Times each candidate on ctx's stream on packed scratch operands of `form`'s shape, layout and
// types (its pointers and strides are not used); nullptr if tuning could not run.
const VariantInfo* Tune(const GemmProblem& form, LaunchContext& ctx,
                        const std::vector<const VariantInfo*>& candidates) {
  const int m = form.m, n = form.n, k = form.k;
  const size_t ab = DataTypeBytes(form.ab_type);
  const size_t a_bytes = AlignUp(size_t(m) * k * ab);
  const size_t b_bytes = AlignUp(size_t(k) * n * ab);
  const size_t c_bytes = AlignUp(size_t(m) * n * DataTypeBytes(form.c_type));
  if (a_bytes + b_bytes + c_bytes > kMaxTuneScratchBytes) return nullptr;
  std::string error;
  auto* base = static_cast<unsigned char*>(
      ctx.Scratch(LaunchContext::kTuningScratch, a_bytes + b_bytes + c_bytes, &error));
  if (base == nullptr) return nullptr;
  GemmProblem p = form;
  p.a = base;
  p.b = base + a_bytes;
  p.c = base + a_bytes + b_bytes;
  p.lda = p.ldb = p.ldc = 0;
  p.batch = 1;  // one item of a batch's shape
  p.stride_a = p.stride_b = p.stride_c = 0;
  p.c_in = p.beta != 0.0f ? p.c : nullptr;  // a scaled form reads C_in in place
  cudaStream_t stream = ctx.stream();
  // Random data: zeros run faster than real inputs and would skew the choice.
  const bool filled = form.ab_type == DataType::kBf16
                          ? FillUniform(reinterpret_cast<__nv_bfloat16*>(base), size_t(m) * k, 1,
                                        -1.f, 1.f, stream) == cudaSuccess &&
                                FillUniform(reinterpret_cast<__nv_bfloat16*>(base + a_bytes),
                                            size_t(k) * n, 2, -1.f, 1.f, stream) == cudaSuccess
                          : FillUniform(reinterpret_cast<__half*>(base), size_t(m) * k, 1, -1.f,
                                        1.f, stream) == cudaSuccess &&
                                FillUniform(reinterpret_cast<__half*>(base + a_bytes),
                                            size_t(k) * n, 2, -1.f, 1.f, stream) == cudaSuccess;
  if (!filled) return nullptr;

  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return nullptr;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return nullptr;
  }
  const VariantInfo* best = nullptr;
  float best_ms = 0;
  for (const VariantInfo* v : candidates) {
    if (!Launch(*v, p, ctx).empty()) continue;  // warm-up (and the dynamic-smem opt-in)
    float ms[kTimedRuns];
    bool ok = true;
    for (int r = 0; r < kTimedRuns && ok; ++r) {
      ok = cudaEventRecord(start, stream) == cudaSuccess && Launch(*v, p, ctx).empty() &&
           cudaEventRecord(stop, stream) == cudaSuccess &&
           cudaEventSynchronize(stop) == cudaSuccess &&
           cudaEventElapsedTime(&ms[r], start, stop) == cudaSuccess;
    }
    if (!ok) continue;
    std::sort(ms, ms + kTimedRuns);
    const float median = ms[kTimedRuns / 2];
    if (best == nullptr || median < best_ms) {
      best = v;
      best_ms = median;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return nullptr;
  return best;
}

}  // namespace

const VariantInfo& DefaultVariant(int m, int n, int k, Accumulation acc) {
  // Unaligned shapes: the fallback, which needs no scratch memory.
  if (n % 8 != 0 || k % 8 != 0) return FallbackVariant();
  auto tiles = [&](int bm, int bn) { return (long long)((m + bm - 1) / bm) * ((n + bn - 1) / bn); };
  // The H200 runs (docs/kernels_notes.md). The wgmma family, where it is listed (sm_90): one
  // consumer warpgroup for M <= 128, 128x256 tiles from about a wave of them on, else 128x128.
  const char* wgmma = m <= 128                 ? "wgmma_64x128_s8_g8"
                      : tiles(128, 256) >= 100 ? "wgmma_128x256_s4_g8"
                                               : "wgmma_128x128_s6_g8";
  // The mma.sync family otherwise: large fp16 outputs are fastest with 64x128 warp tiles,
  // large fp32 outputs with the plain 128x128 kernel; below about one wave of 128x128 tiles
  // (one per SM) the double-buffered 128x128 kernel wins.
  const int wave = CurrentSmCount();
  const char* mma =
      tiles(128, 128) >= wave ? "mma_128x128_bk32_s4_swz" : "mma_128x128_bk32_s4_db_swz";
  if (acc == Accumulation::kFp16 && tiles(128, 256) >= wave) mma = "mma_128x256_w4_bk32_s4_swz";
  for (const char* name : {wgmma, mma}) {
    const VariantInfo* v = FindVariant(name);
    if (v != nullptr && v->Supports(acc) && v->can_implement(m, n, k)) return *v;
  }
  for (const VariantInfo* c : Candidates(m, n, k, acc))
    if (c->kind == VariantKind::kKernel) return *c;
  return FallbackVariant();
}

const VariantInfo* CachedAutoChoice(int m, int n, int k, Accumulation acc) {
  std::lock_guard<std::mutex> lock(CacheMutex());
  auto it = Cache().find(KeyFor(m, n, k, acc));
  if (it == Cache().end()) return nullptr;
  // A bucket holds shapes the tuned kernel may not take (e.g. m past its grid limit).
  return it->second->can_implement(m, n, k) ? it->second : nullptr;
}

const VariantInfo& ChooseAuto(int m, int n, int k, Accumulation acc, LaunchContext& ctx) {
  if (const VariantInfo* cached = CachedAutoChoice(m, n, k, acc)) return *cached;
  const std::vector<const VariantInfo*> candidates = Candidates(m, n, k, acc);
  if (candidates.empty()) return FallbackVariant();
  const VariantInfo* best =
      candidates.size() == 1
          ? candidates.front()
          : Tune(GemmProblem{nullptr, nullptr, nullptr, m, n, k, acc}, ctx, candidates);
  if (best == nullptr) return DefaultVariant(m, n, k, acc);  // not cached: retry next time
  std::lock_guard<std::mutex> lock(CacheMutex());
  // Another thread may have tuned the same bucket meanwhile; the first choice stays.
  auto [it, inserted] = Cache().emplace(KeyFor(m, n, k, acc), best);
  return it->second->can_implement(m, n, k) ? *it->second : *best;
}

std::vector<const VariantInfo*> AutoCandidates(const GemmProblem& p) {
  if (IsDefaultFormPacked(p)) return Candidates(p.m, p.n, p.k, p.accumulation);
  // The variants that read the operands in place (kernels, the fallback included, and split-K
  // wrappers); where none does (odd K or N, strides, pointers), the padded wrappers.
  // Experimental ones only with the opt-in.
  std::vector<const VariantInfo*> candidates;
  for (bool in_place : {true, false}) {
    for (const VariantInfo& v : Variants())
      if ((in_place ? v.kind == VariantKind::kKernel || v.kind == VariantKind::kSplitK
                    : v.kind == VariantKind::kPadded) &&
          AutoMayUse(v) && CheckProblem(v, p).empty())
        candidates.push_back(&v);
    if (!candidates.empty()) break;
  }
  return candidates;
}

const VariantInfo* ChooseAutoFor(const GemmProblem& p, LaunchContext& ctx) {
  if (IsDefaultFormPacked(p)) return &ChooseAuto(p.m, p.n, p.k, p.accumulation, ctx);
  BucketKey key = KeyFor(p.m, p.n, p.k, p.accumulation);
  // Scaled problems tune apart (only fused variants take them, and reading C_in costs time).
  const unsigned scaling = !Scaled(p) ? 0 : p.beta == 0.0f ? 1 : 2;
  key.form = LayoutBit(p.transpose_a, p.transpose_b) | (TypesBit(p.ab_type, p.c_type) << 4) |
             (scaling << 8);
  {
    std::lock_guard<std::mutex> lock(CacheMutex());
    auto it = Cache().find(key);
    if (it != Cache().end() && CheckProblem(*it->second, p).empty()) return it->second;
  }
  const std::vector<const VariantInfo*> candidates = AutoCandidates(p);
  if (candidates.empty()) return nullptr;
  const VariantInfo* best = candidates.size() == 1 ? candidates.front() : Tune(p, ctx, candidates);
  if (best == nullptr) return AutoVariantFor(p);  // not cached: retry next time
  std::lock_guard<std::mutex> lock(CacheMutex());
  auto [it, inserted] = Cache().emplace(key, best);
  return CheckProblem(*it->second, p).empty() ? it->second : best;
}

}  // namespace hgemm::kernels
