// Kernel benchmark: every registered variant (or a chosen few) on a set of cases, layouts
// (NN, NT, TN, TT: transposed A and/or B, as cuBLAS's transa/transb on row-major storage) and
// element types (fp16, bf16; C of the input type or fp32), both accumulations, timed with CUDA
// events (median of --repeats launches after --warmup), and reported as TFLOP/s and as a ratio
// to cuBLAS (cublasGemmEx with the same ops, types and accumulation), measured in the same run.
// Each variant's output is checked against an fp32 reference of the same inputs before it is
// timed; the error ratio is ours / cuBLAS's relative Frobenius error. Inputs rotate among enough
// buffer sets to exceed L2, so no launch reads operands the previous one left in cache (C_in of
// mode scaled excepted: one copy, which our epilogue reads and cuBLAS copies into each C once).
// Modes (--modes; Mode below): plain GEMMs, alpha/beta with C_in, padded row strides, strided
// batches and groups of different shapes, each against the matching cuBLAS entry point, and
// skinny M (split-K; the device's copy bandwidth, their bound, measured first). Every row also
// reports TB/s: the operands' minimal bytes (A and B read once, C written once) over the time.
//
//   kernel_bench [--csv out.csv] [--variants a,b] [--shapes 4096x4096x4096,...] [--acc
//   fp16|fp32|both]
//                [--layouts NN,NT,TN,TT] [--types fp16,bf16,fp16_fp32,bf16_fp32]
//                [--modes plain,scaled,ld,batched,grouped,skinny] [--batched 64x512x512x512,...]
//                [--grouped 256x512x128,...] [--skinny 16x8192x8192,...] [--ld_pad 64]
//                [--alpha 0.75] [--beta 0.5]
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/stats.h"
#include "client/gemm_dims.h"
#include "kernels/cuda_check.h"
#include "kernels/fill.h"
#include "kernels/registry.h"
#include "kernels/scale_epilogue.h"
#include "kernels/testing.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"

namespace hgemm::kernels {
namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

// What a row measures, each against the matching cuBLAS call (the "cublas" variant):
//   plain    C = op(A)·op(B)                          vs cublasGemmEx
//   scaled   two rows per variant (column scale_path): vs cublasGemmEx with alpha, beta and C_in
//            fused: alpha, beta and C_in in the          in C (fp32 compute)
//            launch (variants with fused_scale);
//            separate: T = op(A)·op(B) in fp32, then
//            ScaleEpilogue (the backend's path for
//            the others)
//   ld       every stored row padded by --ld_pad      vs cublasGemmEx with the same lda/ldb/ldc
//   batched  a packed strided batch (Launch: one      vs cublasGemmStridedBatchedEx
//            launch where the variant is batched)
//   grouped  a list of shapes (LaunchGrouped)         vs cublasGemmGroupedBatchedEx
//   skinny   plain, on the --skinny shapes (M <= 128), vs cublasGemmEx
//            for the splitk variants, their inner
//            kernels and auto (unless --variants)
enum class Mode { kPlain, kScaled, kLd, kBatched, kGrouped, kSkinny };
constexpr const char* kModeNames[] = {"plain", "scaled", "ld", "batched", "grouped", "skinny"};
const char* ModeName(Mode m) { return kModeNames[int(m)]; }

// How a scaled row applies alpha/beta: in the variant's own epilogue (fused; cuBLAS's rows), or
// T in fp32 then ScaleEpilogue (separate). kNone for the other modes.
enum class ScalePath { kNone, kFused, kSeparate };
const char* ScalePathName(ScalePath p) {
  return p == ScalePath::kFused ? "fused" : p == ScalePath::kSeparate ? "separate" : "";
}

// One GEMM (or strided batch of them) of a case: a grouped case has several.
struct Part {
  int batch = 1;
  int m, n, k;
};

// One case: its parts, how rows are padded, and its label ("64x512x512x512").
struct Case {
  Mode mode = Mode::kPlain;
  std::vector<Part> parts;
  int pad = 0;  // elements added to every stored row (mode ld)
  std::string label;
  double Flops() const {
    double f = 0;
    for (const Part& p : parts) f += 2.0 * p.batch * p.m * p.n * double(p.k);
    return f;
  }
  // The least a GEMM must move: A and B read once (ab_bytes each element), C written once.
  double MinimalBytes(size_t ab_bytes, size_t c_bytes) const {
    double bytes = 0;
    for (const Part& p : parts)
      bytes += double(p.batch) * (double(ab_bytes) * (double(p.m) * p.k + double(p.k) * p.n) +
                                  double(c_bytes) * p.m * p.n);
    return bytes;
  }
};

struct Buffers {
  std::vector<void*> a, b, c;  // per part
};

// One layout and type pair of a shape.
struct Form {
  bool ta = false, tb = false;
  DataType ab = DataType::kFp16, c = DataType::kFp16;
};

struct Result {
  std::string variant;
  Accumulation acc;
  ScalePath path = ScalePath::kNone;
  double median_ms = 0, tflops = 0, tbps = 0, rel_err = 0;
  bool ok = false;
  std::string note;
};

class Bench {
 public:
  // Launches and events go to `stream`, the LaunchContext's stream; the caller owns it.
  Bench(cudaStream_t stream, int warmup, int repeats, bool check, float alpha, float beta)
      : warmup_(warmup),
        repeats_(repeats),
        check_(check),
        alpha_(alpha),
        beta_(beta),
        stream_(stream) {
    HGEMM_CHECK_CUDA(cudaEventCreate(&start_));
    HGEMM_CHECK_CUDA(cudaEventCreate(&stop_));
    int dev = 0;
    HGEMM_CHECK_CUDA(cudaGetDevice(&dev));
    HGEMM_CHECK_CUDA(cudaGetDeviceProperties(&prop_, dev));
  }
  ~Bench() {
    Free();
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  const cudaDeviceProp& prop() const { return prop_; }

  // Allocates rotating buffer sets for `c` (sized for either layout with its padding, C for
  // fp32, so that every form fits); scaled cases also get C_in and T.
  void Prepare(const Case& c) {
    Free();
    case_ = c;
    size_t set_bytes = 0;
    for (const Part& p : c.parts) set_bytes += (ElemsA(p) + ElemsB(p)) * 2 + ElemsC(p) * 4;
    const size_t want = 4 * size_t(prop_.l2CacheSize);
    const int sets =
        int(std::min<size_t>(8, std::max<size_t>(1, (want + set_bytes - 1) / set_bytes)));
    for (int i = 0; i < sets; ++i) {
      Buffers buf;
      for (const Part& p : c.parts) {
        buf.a.push_back(Alloc(ElemsA(p) * 2));
        buf.b.push_back(Alloc(ElemsB(p) * 2));
        buf.c.push_back(Alloc(ElemsC(p) * 4));
      }
      sets_.push_back(buf);
    }
    if (c.mode == Mode::kScaled) {
      for (const Part& p : c.parts) {
        c_in_.push_back(Alloc(ElemsC(p) * 4));
        t_.push_back(static_cast<float*>(Alloc(ElemsC(p) * 4)));
      }
    }
    if (check_) ref_ = static_cast<float*>(Alloc(OutputElems() * sizeof(float)));
    form_valid_ = false;
  }

  // Fills the buffer sets with random elements of the form's input type (the stored layout
  // does not change the counts) and C_in with random values of C's type, and computes the fp32
  // reference of alpha·op(A)·op(B) + beta·C_in (scaled) or op(A)·op(B) for set 0.
  void SetForm(const Form& f) {
    const bool refill = !form_valid_ || f.ab != form_.ab || f.c != form_.c;
    form_ = f;
    form_valid_ = true;
    if (refill) {
      uint64_t seed = 100;
      for (Buffers& set : sets_)
        for (size_t j = 0; j < case_.parts.size(); ++j)
          for (auto [ptr, count] : {std::pair{set.a[j], ElemsA(case_.parts[j])},
                                    std::pair{set.b[j], ElemsB(case_.parts[j])}}) {
            if (f.ab == DataType::kBf16)
              HGEMM_CHECK_CUDA(
                  FillUniform(static_cast<__nv_bfloat16*>(ptr), count, seed++, -1.f, 1.f, stream_));
            else
              HGEMM_CHECK_CUDA(
                  FillUniform(static_cast<__half*>(ptr), count, seed++, -1.f, 1.f, stream_));
          }
      FillCIn();
    }
    if (check_) {
      size_t offset = 0;
      for (size_t j = 0; j < case_.parts.size(); ++j) {
        const Part& part = case_.parts[j];
        const GemmProblem p = Problem(0, j, Accumulation::kFp32);
        for (int t = 0; t < part.batch; ++t) {
          const GemmProblem item = BatchItem(p, t);
          HGEMM_CHECK_CUDA(testing::ReferenceGemmEx(item.a, item.b, ref_ + offset, part.m, part.n,
                                                    part.k, f.ta, f.tb, item.lda, item.ldb,
                                                    f.ab == DataType::kBf16, stream_));
          offset += size_t(part.m) * part.n;
        }
      }
      host_ref_.resize(offset);
      HGEMM_CHECK_CUDA(cudaMemcpyAsync(host_ref_.data(), ref_, offset * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
      HGEMM_CHECK_CUDA(cudaStreamSynchronize(stream_));
      if (case_.mode == Mode::kScaled)
        for (size_t i = 0; i < offset; ++i)
          host_ref_[i] = alpha_ * host_ref_[i] + beta_ * host_c_in_[i];
    }
    HGEMM_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

  // Part j of buffer set i as the registry's problem (C of the form's type; ld: rows padded).
  GemmProblem Problem(int i, size_t j, Accumulation acc) const {
    const Buffers& b = sets_[i % sets_.size()];
    const Part& part = case_.parts[j];
    GemmProblem p{b.a[j], b.b[j], b.c[j], part.m, part.n, part.k, acc};
    p.transpose_a = form_.ta;
    p.transpose_b = form_.tb;
    p.ab_type = form_.ab;
    p.c_type = form_.c;
    if (case_.pad > 0) {
      p.lda = (form_.ta ? part.m : part.k) + case_.pad;
      p.ldb = (form_.tb ? part.k : part.n) + case_.pad;
      p.ldc = part.n + case_.pad;
    }
    p.batch = part.batch;
    return p;
  }

  // Part j of set i as a scaled problem of `path`: alpha, beta and C_in (fused; cuBLAS reads
  // C_in from C, where Run put it), or the unscaled problem into T (separate).
  GemmProblem ScaledProblem(int i, size_t j, Accumulation acc, const VariantInfo& v,
                            ScalePath path) const {
    GemmProblem p = Problem(i, j, acc);
    if (path == ScalePath::kSeparate) {
      p.c = t_[j];
      p.c_type = DataType::kFp32;  // the separate path writes T in fp32 first
      return p;
    }
    p.alpha = alpha_;
    p.beta = beta_;
    p.c_in = v.kind == VariantKind::kCublas ? p.c : c_in_[j];
    return p;
  }

  // Why `v` cannot run this case in this form (scaled: on `path`), or "".
  std::string Refusal(const VariantInfo& v, Accumulation acc,
                      ScalePath path = ScalePath::kNone) const {
    for (size_t j = 0; j < case_.parts.size(); ++j) {
      GemmProblem p = Problem(0, j, acc);
      if (case_.mode == Mode::kScaled) {
        if (acc != Accumulation::kFp32) return "scaled rows run fp32 accumulation";
        if (v.kind == VariantKind::kCublas && path == ScalePath::kSeparate)
          return "cuBLAS scales in its own call";
        p = ScaledProblem(0, j, acc, v, path);
      }
      if (std::string why = CheckProblem(v, p); !why.empty()) return why;
    }
    return "";
  }

  Result Run(const VariantInfo& v, Accumulation acc, LaunchContext& ctx,
             ScalePath path = ScalePath::kNone) {
    Result r{v.name, acc, path};
    const bool cublas = v.kind == VariantKind::kCublas;
    auto launch = [&](int i) -> std::string {
      switch (case_.mode) {
        case Mode::kGrouped: {
          std::vector<GemmProblem> problems;
          for (size_t j = 0; j < case_.parts.size(); ++j) problems.push_back(Problem(i, j, acc));
          return LaunchGrouped(v, problems, ctx);
        }
        case Mode::kScaled: {
          const GemmProblem p = ScaledProblem(i, 0, acc, v, path);
          if (path == ScalePath::kFused) return Launch(v, p, ctx);
          // The backend's separate path: T in fp32, then the epilogue.
          if (std::string e = Launch(v, p, ctx); !e.empty()) return e;
          const GemmProblem c = Problem(i, 0, acc);
          const int64_t count = int64_t(c.batch) * c.m * c.n;
          if (cudaError_t e =
                  ScaleEpilogue(t_[0], c_in_[0], c.c, count, alpha_, beta_, c.c_type, stream_);
              e != cudaSuccess)
            return CudaErrorText("ScaleEpilogue", e);
          return "";
        }
        default:
          return Launch(v, Problem(i, 0, acc), ctx);
      }
    };
    const size_t c_bytes = DataTypeBytes(form_.c);
    // Correctness first (this also warms up, tunes "auto" and creates the cuBLAS handle). NaN
    // poison: 0x7E00 is an fp16 NaN, 0x7FC0 a bf16 one and, in both halves, an fp32 one (so a
    // fused epilogue that read C instead of C_in shows). cuBLAS's scaled call reads C as C_in
    // instead: every set's C gets C_in.
    for (Buffers& set : sets_)
      for (size_t j = 0; j < case_.parts.size(); ++j) {
        const size_t bytes = ElemsC(case_.parts[j]) * c_bytes;
        if (case_.mode == Mode::kScaled && cublas)
          HGEMM_CHECK_CUDA(
              cudaMemcpyAsync(set.c[j], c_in_[j], bytes, cudaMemcpyDeviceToDevice, stream_));
        else if (&set == &sets_[0])
          HGEMM_CHECK_CUDA(FillBits(static_cast<__half*>(set.c[j]), bytes / 2,
                                    form_.c == DataType::kFp16 ? 0x7E00 : 0x7FC0, stream_));
      }
    if (std::string e = launch(0); !e.empty()) {
      r.note = e;
      return r;
    }
    HGEMM_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (check_) {
      // Every part's C rows (ldc apart), item after item, packed like the reference.
      std::vector<unsigned char> out(OutputElems() * c_bytes);
      size_t offset = 0;
      for (size_t j = 0; j < case_.parts.size(); ++j) {
        const GemmProblem p = Problem(0, j, acc);
        const size_t row = size_t(p.n) * c_bytes, pitch = size_t(p.ldc ? p.ldc : p.n) * c_bytes;
        const size_t rows = size_t(p.batch) * p.m;  // packed items: rows ldc apart throughout
        HGEMM_CHECK_CUDA(
            cudaMemcpy2D(out.data() + offset, row, p.c, pitch, row, rows, cudaMemcpyDeviceToHost));
        offset += rows * row;
      }
      const int64_t count = int64_t(OutputElems());
      const ErrorStats st =
          form_.c == DataType::kFp32
              ? CompareToReference(reinterpret_cast<const float*>(out.data()), host_ref_.data(),
                                   count)
          : form_.c == DataType::kBf16
              ? CompareBf16ToReference(reinterpret_cast<const uint16_t*>(out.data()),
                                       host_ref_.data(), count)
              : CompareToReference(reinterpret_cast<const uint16_t*>(out.data()), host_ref_.data(),
                                   count);
      r.rel_err = st.rel_frobenius;
      const double bar = testing::ToleranceFor(form_.c, acc);
      if (st.nan_count > 0) {
        r.note = "WRONG " + st.ToString();
        return r;
      }
      if (!(st.rel_frobenius <= bar))
        r.note = "WRONG (over the error bar, timed anyway) " + st.ToString();
    }
    for (int i = 0; i < warmup_; ++i) launch(i);
    std::vector<float> ms(repeats_);
    for (int i = 0; i < repeats_; ++i) {
      HGEMM_CHECK_CUDA(cudaEventRecord(start_, stream_));
      if (std::string e = launch(i + 1); !e.empty()) {
        r.note = e;
        return r;
      }
      HGEMM_CHECK_CUDA(cudaEventRecord(stop_, stream_));
      HGEMM_CHECK_CUDA(cudaEventSynchronize(stop_));
      HGEMM_CHECK_CUDA(cudaEventElapsedTime(&ms[i], start_, stop_));
    }
    r.median_ms = bench::Median(ms);
    r.tflops = case_.Flops() / (r.median_ms * 1e-3) / 1e12;
    r.tbps = case_.MinimalBytes(DataTypeBytes(form_.ab), DataTypeBytes(form_.c)) /
             (r.median_ms * 1e-3) / 1e12;
    r.ok = true;
    return r;
  }

 private:
  // Elements to allocate per part: either layout's stored rows with their padding.
  size_t ElemsA(const Part& p) const {
    return size_t(p.batch) * (p.m + case_.pad) * (p.k + case_.pad);
  }
  size_t ElemsB(const Part& p) const {
    return size_t(p.batch) * (p.k + case_.pad) * (p.n + case_.pad);
  }
  size_t ElemsC(const Part& p) const { return size_t(p.batch) * p.m * (p.n + case_.pad); }
  size_t OutputElems() const {
    size_t n = 0;
    for (const Part& p : case_.parts) n += size_t(p.batch) * p.m * p.n;
    return n;
  }

  void* Alloc(size_t bytes) {
    void* p = nullptr;
    HGEMM_CHECK_CUDA(cudaMalloc(&p, bytes));
    owned_.push_back(p);
    return p;
  }

  // C_in (scaled cases): random values in [-1, 1) of C's type, packed like C, kept on the
  // host as floats for the reference.
  void FillCIn() {
    if (case_.mode != Mode::kScaled) return;
    host_c_in_.clear();
    uint32_t state = 12345;
    for (size_t j = 0; j < case_.parts.size(); ++j) {
      const size_t count = ElemsC(case_.parts[j]);
      std::vector<float> values(count);
      for (float& v : values) {
        state = state * 1664525u + 1013904223u;  // an LCG is enough for operand values
        v = float(state >> 8) / float(1u << 24) * 2.f - 1.f;
      }
      std::vector<uint16_t> bits(count);
      const void* src = values.data();
      if (form_.c == DataType::kFp16) {
        FloatToHalf(values.data(), bits.data(), count);
        HalfToFloat(bits.data(), values.data(), count);  // the reference sees the rounded C_in
        src = bits.data();
      } else if (form_.c == DataType::kBf16) {
        FloatToBf16(values.data(), bits.data(), count);
        Bf16ToFloat(bits.data(), values.data(), count);
        src = bits.data();
      }
      HGEMM_CHECK_CUDA(
          cudaMemcpy(c_in_[j], src, count * DataTypeBytes(form_.c), cudaMemcpyHostToDevice));
      host_c_in_.insert(host_c_in_.end(), values.begin(), values.end());
    }
  }

  void Free() {
    for (void* p : owned_) cudaFree(p);
    owned_.clear();
    sets_.clear();
    c_in_.clear();
    t_.clear();
    ref_ = nullptr;
  }

  int warmup_, repeats_;
  bool check_;
  float alpha_, beta_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cudaDeviceProp prop_{};
  Case case_;
  Form form_;
  bool form_valid_ = false;
  std::vector<void*> owned_;  // every device allocation of the case
  std::vector<Buffers> sets_;
  std::vector<void*> c_in_;  // per part (scaled)
  std::vector<float*> t_;    // per part (scaled): the fp32 T of our path
  float* ref_ = nullptr;
  std::vector<float> host_ref_, host_c_in_;
};

// The device's copy bandwidth, the bound of mode skinny (its target: >= 85 % of it): the median
// of `repeats` cudaMemcpyAsync's of 512 MiB device to device, counted as read + write, in TB/s.
// 512 MiB: ten times an H200's L2, so the copy streams from memory as a skinny B does.
double DeviceCopyTbps(cudaStream_t stream, int repeats) {
  constexpr size_t kBytes = size_t{512} << 20;
  void* src = nullptr;
  void* dst = nullptr;
  HGEMM_CHECK_CUDA(cudaMalloc(&src, kBytes));
  HGEMM_CHECK_CUDA(cudaMalloc(&dst, kBytes));
  HGEMM_CHECK_CUDA(cudaMemsetAsync(src, 0x3c, kBytes, stream));
  cudaEvent_t start, stop;
  HGEMM_CHECK_CUDA(cudaEventCreate(&start));
  HGEMM_CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms(repeats);
  for (int i = -2; i < repeats; ++i) {  // two untimed copies first
    HGEMM_CHECK_CUDA(cudaEventRecord(start, stream));
    HGEMM_CHECK_CUDA(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream));
    HGEMM_CHECK_CUDA(cudaEventRecord(stop, stream));
    HGEMM_CHECK_CUDA(cudaEventSynchronize(stop));
    if (i >= 0) HGEMM_CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  HGEMM_CHECK_CUDA(cudaEventDestroy(start));
  HGEMM_CHECK_CUDA(cudaEventDestroy(stop));
  HGEMM_CHECK_CUDA(cudaFree(src));
  HGEMM_CHECK_CUDA(cudaFree(dst));
  return 2.0 * kBytes / (bench::Median(ms) * 1e-3) / 1e12;
}

// "BxMxNxK" (batched cases) or "MxNxK"; "" or what is wrong.
std::string ParsePart(const std::string& text, bool batched, Part* part) {
  std::string dims_text = text;
  if (batched) {
    const size_t x = text.find('x');
    if (x == std::string::npos || x == 0) return "expected BxMxNxK";
    for (size_t i = 0; i < x; ++i)
      if (text[i] < '0' || text[i] > '9') return "batch is not a number";
    if (x > 9) return "batch over 999999999";
    part->batch = std::stoi(text.substr(0, x));
    if (part->batch < 1) return "batch must be >= 1";
    dims_text = text.substr(x + 1);
  }
  GemmDims dims;
  std::string e = ParseGemmDims(dims_text, &dims);
  if (!e.empty() && batched) e = "after the batch count: " + e;
  if (e.empty() && std::max({dims.m, dims.n, dims.k}) > uint32_t(INT_MAX))
    e = "the kernels take dimensions up to 2^31 - 1";  // GemmProblem's int
  part->m = int(dims.m);
  part->n = int(dims.n);
  part->k = int(dims.k);
  return e;
}

// The default group: 64 shapes with each of M, N and K drawn from 64, 128, ..., 2048 (issue
// 29's "mix of 64 shapes from 64 to 2048"), the same every run.
std::vector<Part> DefaultGroup() {
  std::vector<Part> parts;
  uint32_t state = 29;
  auto draw = [&] {
    state = state * 1664525u + 1013904223u;
    return 64 << ((state >> 16) % 6);
  };
  for (int i = 0; i < 64; ++i) {
    Part p;
    p.m = draw();
    p.n = draw();
    p.k = draw();
    parts.push_back(p);
  }
  return parts;
}

int Main(int argc, char** argv) {
  CLI::App app{"hgemm kernel benchmark"};
  std::string csv_path, variants_arg, acc_arg = "both";
  std::string shapes_arg =
      "2048x2048x2048,4096x4096x4096,8192x8192x8192,4096x8192x2048,8192x2048x8192,"
      "16384x1024x4096,8192x64x4096,1000x1000x1000,4097x4096x4095,4096x4096x4096";  // 4096^3 twice:
                                                                                    // run-to-run
                                                                                    // spread
  std::string layouts_arg = "NN", types_arg = "fp16", modes_arg = "plain";
  std::string batched_arg = "64x512x512x512,16x1024x1024x1024,8x2048x2048x2048,256x128x128x128";
  std::string grouped_arg;
  std::string skinny_arg =
      "1x8192x8192,8x8192x8192,16x8192x8192,32x8192x8192,64x8192x8192,128x8192x8192";
  int warmup = 5, repeats = 20, ld_pad = 64;
  float alpha = 0.75f, beta = 0.5f;
  bool no_check = false;
  app.add_option("--csv", csv_path, "write results as CSV to this path");
  app.add_option("--variants", variants_arg,
                 "comma-separated variant names (default: every kernel and cublas)");
  app.add_option("--shapes", shapes_arg, "comma-separated MxNxK (modes plain, scaled, ld)");
  app.add_option("--acc", acc_arg, "fp16, fp32 or both");
  app.add_option("--layouts", layouts_arg,
                 "comma-separated NN, NT, TN, TT (A then B; T = transposed)");
  app.add_option("--types", types_arg,
                 "comma-separated fp16, bf16 (C of the input type), fp16_fp32, bf16_fp32 (fp32 C)");
  app.add_option("--modes", modes_arg,
                 "comma-separated plain, scaled (alpha/beta with C_in), ld (padded row strides), "
                 "batched (--batched), grouped (--grouped), skinny (--skinny)");
  app.add_option("--batched", batched_arg,
                 "comma-separated BxMxNxK strided batches (mode batched)");
  app.add_option(
      "--grouped", grouped_arg,
      "comma-separated MxNxK of one group (mode grouped; default: 64 shapes from 64 to 2048)");
  app.add_option("--skinny", skinny_arg,
                 "comma-separated MxNxK of mode skinny (default: M = 1, 8, 16, 32, 64, 128 by "
                 "8192x8192); rows: the splitk variants, their kernels, auto and cublas unless "
                 "--variants");
  app.add_option("--ld_pad", ld_pad,
                 "elements added to every stored row in mode ld (a multiple of 8)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--alpha", alpha, "alpha of mode scaled");
  app.add_option("--beta", beta, "beta of mode scaled (C_in is read when it is not 0)");
  app.add_option("--warmup", warmup, "untimed launches per variant and shape");
  app.add_option("--repeats", repeats, "timed launches per variant and shape (median taken)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--no-check", no_check, "skip the correctness check before timing");
  CLI11_PARSE(app, argc, argv);

  std::vector<const VariantInfo*> variants;
  if (variants_arg.empty()) {
    for (const VariantInfo& v : Variants())
      if (v.kind != VariantKind::kAuto) variants.push_back(&v);
  } else {
    for (const std::string& name : Split(variants_arg, ',')) {
      const VariantInfo* v = FindVariant(name);
      if (v == nullptr) {
        std::fprintf(stderr, "unknown variant %s\n", name.c_str());
        return 2;
      }
      variants.push_back(v);
    }
  }
  // cuBLAS first in every shape, so that each ratio has its denominator.
  std::stable_partition(variants.begin(), variants.end(),
                        [](const VariantInfo* v) { return v->kind == VariantKind::kCublas; });
  // Mode skinny's rows unless --variants: cuBLAS, the kernels the splitk variants wrap (what
  // runs without a split), the splitk variants, skinny_m16, and auto (which measures all of
  // them).
  std::vector<const VariantInfo*> skinny_variants = variants;
  if (variants_arg.empty()) {
    skinny_variants = {FindVariant("cublas")};
    for (const VariantInfo& v : Variants()) {
      if (v.kind != VariantKind::kSplitK) continue;
      const VariantInfo* inner = FindVariant(v.inner);
      if (std::find(skinny_variants.begin(), skinny_variants.end(), inner) == skinny_variants.end())
        skinny_variants.push_back(inner);
    }
    for (const VariantInfo& v : Variants())
      if (v.kind == VariantKind::kSplitK || v.kind == VariantKind::kAuto || v.name == "skinny_m16")
        skinny_variants.push_back(&v);
  }
  // The cases, mode by mode in the order given.
  std::vector<Case> cases;
  auto parse_parts = [](const std::string& list, bool batched, std::vector<Part>* parts) {
    for (const std::string& s : Split(list, ',')) {
      Part part;
      if (std::string e = ParsePart(s, batched, &part); !e.empty()) {
        std::fprintf(stderr, "bad shape %s: %s\n", s.c_str(), e.c_str());
        return false;
      }
      parts->push_back(part);
    }
    return true;
  };
  for (const std::string& name : Split(modes_arg, ',')) {
    const auto* found = std::find(std::begin(kModeNames), std::end(kModeNames), name);
    if (found == std::end(kModeNames)) {
      std::fprintf(stderr, "bad mode %s (plain, scaled, ld, batched, grouped or skinny)\n",
                   name.c_str());
      return 2;
    }
    const Mode mode = Mode(found - std::begin(kModeNames));
    std::vector<Part> parts;
    if (!parse_parts(mode == Mode::kBatched   ? batched_arg
                     : mode == Mode::kGrouped ? grouped_arg
                     : mode == Mode::kSkinny  ? skinny_arg
                                              : shapes_arg,
                     mode == Mode::kBatched, &parts))
      return 2;
    if (mode == Mode::kGrouped) {
      Case c{mode, parts.empty() ? DefaultGroup() : parts};
      int lo = INT_MAX, hi = 0;
      for (const Part& p : c.parts) {
        lo = std::min({lo, p.m, p.n, p.k});
        hi = std::max({hi, p.m, p.n, p.k});
      }
      c.label = std::to_string(c.parts.size()) + " shapes " + std::to_string(lo) + ".." +
                std::to_string(hi);
      cases.push_back(c);
      continue;
    }
    for (const Part& p : parts) {
      Case c{mode, {p}, mode == Mode::kLd ? ld_pad : 0};
      c.label = (p.batch > 1 ? std::to_string(p.batch) + "x" : "") + std::to_string(p.m) + "x" +
                std::to_string(p.n) + "x" + std::to_string(p.k);
      cases.push_back(c);
    }
  }
  std::vector<Form> forms;
  for (const std::string& l : Split(layouts_arg, ','))
    for (const std::string& t : Split(types_arg, ',')) {
      Form f;
      if (l.size() != 2 || (l[0] != 'N' && l[0] != 'T') || (l[1] != 'N' && l[1] != 'T')) {
        std::fprintf(stderr, "bad layout %s (NN, NT, TN or TT)\n", l.c_str());
        return 2;
      }
      f.ta = l[0] == 'T';
      f.tb = l[1] == 'T';
      if (t == "fp16" || t == "fp16_fp32")
        f.ab = DataType::kFp16;
      else if (t == "bf16" || t == "bf16_fp32")
        f.ab = DataType::kBf16;
      else {
        std::fprintf(stderr, "bad type %s (fp16, bf16, fp16_fp32 or bf16_fp32)\n", t.c_str());
        return 2;
      }
      f.c = t.size() > 4 ? DataType::kFp32 : f.ab;
      forms.push_back(f);
    }
  std::vector<Accumulation> accs;
  if (acc_arg != "fp32") accs.push_back(Accumulation::kFp16);
  if (acc_arg != "fp16") accs.push_back(Accumulation::kFp32);

  cudaStream_t stream;
  HGEMM_CHECK_CUDA(cudaStreamCreate(&stream));
  Bench bench(stream, warmup, repeats, !no_check, alpha, beta);
  const cudaDeviceProp& prop = bench.prop();
  std::printf("device: %s, %d SMs, sm_%d%d, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.major, prop.minor, prop.l2CacheSize >> 20);
  double copy_tbps = 0;  // mode skinny's bound, measured when a skinny case runs
  if (std::any_of(cases.begin(), cases.end(),
                  [](const Case& c) { return c.mode == Mode::kSkinny; })) {
    copy_tbps = DeviceCopyTbps(stream, repeats);
    std::printf(
        "device copy: %.2f TB/s (cudaMemcpyAsync device to device, 512 MiB, "
        "read + write)\n",
        copy_tbps);
  }
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (!csv_path.empty() && csv == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
    return 2;
  }
  // m, n, k: the shape of a one-part case (0 for a group); batch: its batch count.
  if (csv)
    std::fprintf(csv,
                 "device,variant,acc,layout,types,m,n,k,median_ms,tflops,ratio_to_cublas,"
                 "cublas_rel_err,rel_err,status,mode,batch,case,error_ratio,tbps,scale_path\n");

  int wrong = 0;
  std::vector<std::string> best_lines;  // per case, form and accumulation: the fastest own kernel
  {
    LaunchContext ctx(stream);
    const VariantInfo& cublas = *FindVariant("cublas");
    for (const Case& c : cases) {
      bench.Prepare(c);
      const Part& shape = c.parts.size() == 1 ? c.parts[0] : Part{1, 0, 0, 0};
      const std::string label = std::string(ModeName(c.mode)) + " " + c.label;
      for (const Form& form : forms) {
        bench.SetForm(form);
        const std::string types = TypesName(form.ab, form.c);
        for (Accumulation acc : accs) {
          if (!bench.Refusal(cublas, acc).empty()) continue;  // e.g. bf16 with fp16 accumulation
          if (c.mode == Mode::kScaled || c.mode == Mode::kGrouped) {
            if (acc != Accumulation::kFp32) continue;  // cuBLAS's scaled and grouped calls: fp32
          }
          double cublas_tflops = 0, cublas_err = 0;
          Result best;
          const std::vector<ScalePath> paths =
              c.mode == Mode::kScaled ? std::vector{ScalePath::kFused, ScalePath::kSeparate}
                                      : std::vector{ScalePath::kNone};
          for (const VariantInfo* v : c.mode == Mode::kSkinny ? skinny_variants : variants)
            for (ScalePath path : paths) {
              if (!bench.Refusal(*v, acc, path).empty()) continue;
              if (v->min_sm > prop.major * 10 + prop.minor) continue;
              Result r = bench.Run(*v, acc, ctx, path);
              if (v->kind == VariantKind::kCublas && r.ok) {
                cublas_tflops = r.tflops;
                cublas_err = r.rel_err;
              }
              const double ratio = cublas_tflops > 0 && r.ok ? r.tflops / cublas_tflops : 0;
              const double err_ratio = cublas_err > 0 ? r.rel_err / cublas_err : 0;
              if (r.note.rfind("WRONG", 0) == 0) ++wrong;
              if (r.ok && v->kind != VariantKind::kCublas && r.tflops > best.tflops) best = r;
              std::printf(
                  "%-34s %-8s %s %s %-9s %-26s %9.4f ms %7.1f TFLOP/s %5.2f TB/s %5.3fx cublas err "
                  "%.2e (%.2fx cublas's) %s\n",
                  v->name.c_str(), ScalePathName(path), AccumulationName(acc),
                  LayoutName(form.ta, form.tb), types.c_str(), label.c_str(), r.median_ms, r.tflops,
                  r.tbps, ratio, r.rel_err, err_ratio, r.note.c_str());
              std::fflush(stdout);
              if (csv)
                std::fprintf(
                    csv,
                    "%s,%s,%s,%s,%s,%d,%d,%d,%.5f,%.2f,%.4f,%.3e,%.3e,%s,%s,%d,%s,%.3f,%.3f,%s\n",
                    prop.name, v->name.c_str(), AccumulationName(acc), LayoutName(form.ta, form.tb),
                    types.c_str(), shape.m, shape.n, shape.k, r.median_ms, r.tflops, ratio,
                    cublas_err, r.rel_err, r.note.empty() ? "ok" : r.note.c_str(), ModeName(c.mode),
                    shape.batch, c.label.c_str(), err_ratio, r.tbps, ScalePathName(path));
              if (csv) std::fflush(csv);  // rows survive a run cut short by a device-call limit
            }
          char line[384];
          std::snprintf(
              line, sizeof line,
              "%-26s %s %s %-9s cublas %6.1f  best %-32s %6.1f TFLOP/s %5.2f TB/s %5.3fx  err %.2e "
              "vs cublas %.2e",
              label.c_str(), AccumulationName(acc), LayoutName(form.ta, form.tb), types.c_str(),
              cublas_tflops,
              (best.variant +
               (best.path == ScalePath::kNone ? "" : std::string("/") + ScalePathName(best.path)))
                  .c_str(),
              best.tflops, best.tbps, cublas_tflops > 0 ? best.tflops / cublas_tflops : 0.0,
              best.rel_err, cublas_err);
          std::string best_line = line;
          if (c.mode == Mode::kSkinny && copy_tbps > 0) {
            std::snprintf(line, sizeof line, "  %.0f %% of copy", 100 * best.tbps / copy_tbps);
            best_line += line;
          }
          best_lines.push_back(best_line);
        }
      }
    }
  }
  if (csv) std::fclose(csv);
  std::printf(
      "\nfastest own kernel per case, layout and types (TFLOP/s, ratio to cuBLAS in this run):\n");
  for (const std::string& line : best_lines) std::printf("%s\n", line.c_str());
  std::printf("%d wrong results\n", wrong);
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace hgemm::kernels

int main(int argc, char** argv) { return hgemm::kernels::Main(argc, argv); }
