// Kernel benchmark: every registered variant (or a chosen few) on a set of shapes, layouts
// (NN, NT, TN, TT: transposed A and/or B, as cuBLAS's transa/transb on row-major storage) and
// element types (fp16, bf16; C of the input type or fp32), both accumulations, timed with CUDA
// events (median of --repeats launches after --warmup), and reported as TFLOP/s and as a ratio
// to cuBLAS (cublasGemmEx with the same ops, types and accumulation), measured in the same run.
// Each variant's output is checked against an fp32 reference of the same inputs before it is
// timed. Inputs rotate among enough buffer sets to exceed L2, so no launch reads operands the
// previous one left in cache.
//
//   kernel_bench [--csv out.csv] [--variants a,b] [--shapes 4096x4096x4096,...] [--acc fp16|fp32|both]
//                [--layouts NN,NT,TN,TT] [--types fp16,bf16,fp16_fp32,bf16_fp32]
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/stats.h"
#include "client/gemm_dims.h"
#include "kernels/cuda_check.h"
#include "kernels/fill.h"
#include "proto/numerics/error_stats.h"
#include "kernels/registry.h"
#include "kernels/testing.h"

namespace hgemm::kernels {
namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

struct Buffers {
  void* a;
  void* b;
  void* c;
};

// One layout and type pair of a shape.
struct Form {
  bool ta = false, tb = false;
  DataType ab = DataType::kFp16, c = DataType::kFp16;
};

struct Result {
  std::string variant;
  Accumulation acc;
  GemmDims shape;
  double median_ms = 0, tflops = 0, rel_err = 0;
  bool ok = false;
  std::string note;
};

class Bench {
 public:
  // Launches and events go to `stream`, the LaunchContext's stream; the caller owns it.
  Bench(cudaStream_t stream, int warmup, int repeats, bool check)
      : warmup_(warmup), repeats_(repeats), check_(check), stream_(stream) {
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

  // Allocates rotating buffer sets for `s` (C sized for fp32, so that every form fits).
  void Prepare(const GemmDims& s) {
    Free();
    shape_ = s;
    const size_t a = size_t(s.m) * s.k, b = size_t(s.k) * s.n, c = size_t(s.m) * s.n;
    const size_t set_bytes = (a + b) * 2 + c * 4;
    const size_t want = 4 * size_t(prop_.l2CacheSize);
    const int sets = int(std::min<size_t>(8, std::max<size_t>(1, (want + set_bytes - 1) / set_bytes)));
    for (int i = 0; i < sets; ++i) {
      Buffers buf;
      HGEMM_CHECK_CUDA(cudaMalloc(&buf.a, a * 2));
      HGEMM_CHECK_CUDA(cudaMalloc(&buf.b, b * 2));
      HGEMM_CHECK_CUDA(cudaMalloc(&buf.c, c * 4));
      sets_.push_back(buf);
    }
    if (check_) HGEMM_CHECK_CUDA(cudaMalloc(&ref_, c * sizeof(float)));
    form_valid_ = false;
  }

  // Fills the buffer sets with random elements of the form's input type (the stored layout
  // does not change the counts), and computes the fp32 reference of op(A)·op(B) for set 0.
  void SetForm(const Form& f) {
    const GemmDims& s = shape_;
    const size_t a = size_t(s.m) * s.k, b = size_t(s.k) * s.n, c = size_t(s.m) * s.n;
    const bool refill = !form_valid_ || f.ab != form_.ab;
    form_ = f;
    form_valid_ = true;
    if (refill) {
      for (size_t i = 0; i < sets_.size(); ++i) {
        if (f.ab == DataType::kBf16) {
          HGEMM_CHECK_CUDA(FillUniform(static_cast<__nv_bfloat16*>(sets_[i].a), a, 100 + 2 * i,
                                       -1.f, 1.f, stream_));
          HGEMM_CHECK_CUDA(FillUniform(static_cast<__nv_bfloat16*>(sets_[i].b), b, 101 + 2 * i,
                                       -1.f, 1.f, stream_));
        } else {
          HGEMM_CHECK_CUDA(
              FillUniform(static_cast<__half*>(sets_[i].a), a, 100 + 2 * i, -1.f, 1.f, stream_));
          HGEMM_CHECK_CUDA(
              FillUniform(static_cast<__half*>(sets_[i].b), b, 101 + 2 * i, -1.f, 1.f, stream_));
        }
      }
    }
    if (check_) {
      HGEMM_CHECK_CUDA(testing::ReferenceGemmEx(sets_[0].a, sets_[0].b, ref_, s.m, s.n, s.k, f.ta,
                                                f.tb, 0, 0, f.ab == DataType::kBf16, stream_));
      host_ref_.resize(c);
      HGEMM_CHECK_CUDA(cudaMemcpyAsync(host_ref_.data(), ref_, c * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
    }
    HGEMM_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

  GemmProblem Problem(int i, Accumulation acc) const {
    const Buffers& b = sets_[i % sets_.size()];
    const GemmDims& s = shape_;
    GemmProblem p{b.a, b.b, b.c, int(s.m), int(s.n), int(s.k), acc};
    p.transpose_a = form_.ta;
    p.transpose_b = form_.tb;
    p.ab_type = form_.ab;
    p.c_type = form_.c;
    return p;
  }

  Result Run(const VariantInfo& v, Accumulation acc, LaunchContext& ctx) {
    Result r{v.name, acc, shape_};
    const GemmDims& s = shape_;
    const size_t c_elems = size_t(s.m) * s.n;
    const size_t c_bytes = DataTypeBytes(form_.c);
    auto problem = [&](int i) { return Problem(i, acc); };
    // Correctness first (this also warms up, tunes "auto" and creates the cuBLAS handle). NaN
    // poison: 0x7E00 is an fp16 NaN, 0x7FC0 a bf16 one and, in both halves, an fp32 one.
    HGEMM_CHECK_CUDA(FillBits(static_cast<__half*>(sets_[0].c), c_elems * c_bytes / 2,
                              form_.c == DataType::kFp16 ? 0x7E00 : 0x7FC0, stream_));
    if (std::string e = Launch(v, problem(0), ctx); !e.empty()) {
      r.note = e;
      return r;
    }
    HGEMM_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (check_) {
      std::vector<unsigned char> out(c_elems * c_bytes);
      HGEMM_CHECK_CUDA(cudaMemcpy(out.data(), sets_[0].c, out.size(), cudaMemcpyDeviceToHost));
      const int64_t count = int64_t(c_elems);
      const ErrorStats st =
          form_.c == DataType::kFp32
              ? CompareToReference(reinterpret_cast<const float*>(out.data()), host_ref_.data(),
                                   count)
          : form_.c == DataType::kBf16
              ? CompareBf16ToReference(reinterpret_cast<const uint16_t*>(out.data()),
                                       host_ref_.data(), count)
              : CompareToReference(reinterpret_cast<const uint16_t*>(out.data()),
                                   host_ref_.data(), count);
      r.rel_err = st.rel_frobenius;
      const double bar = form_.c == DataType::kBf16   ? kKernelToleranceBf16
                         : form_.c == DataType::kFp32 ? kKernelTolerance.fp32_acc
                                                      : kKernelTolerance.For(acc == Accumulation::kFp16);
      if (st.nan_count > 0) {
        r.note = "WRONG " + st.ToString();
        return r;
      }
      if (!(st.rel_frobenius <= bar)) r.note = "WRONG (over the error bar, timed anyway) " +
                                               st.ToString();
    }
    for (int i = 0; i < warmup_; ++i) Launch(v, problem(i), ctx);
    std::vector<float> ms(repeats_);
    for (int i = 0; i < repeats_; ++i) {
      HGEMM_CHECK_CUDA(cudaEventRecord(start_, stream_));
      if (std::string e = Launch(v, problem(i + 1), ctx); !e.empty()) {
        r.note = e;
        return r;
      }
      HGEMM_CHECK_CUDA(cudaEventRecord(stop_, stream_));
      HGEMM_CHECK_CUDA(cudaEventSynchronize(stop_));
      HGEMM_CHECK_CUDA(cudaEventElapsedTime(&ms[i], start_, stop_));
    }
    r.median_ms = bench::Median(ms);
    r.tflops = s.Flops() / (r.median_ms * 1e-3) / 1e12;
    r.ok = true;
    return r;
  }

 private:
  void Free() {
    for (Buffers& b : sets_) {
      cudaFree(b.a);
      cudaFree(b.b);
      cudaFree(b.c);
    }
    sets_.clear();
    if (ref_ != nullptr) cudaFree(ref_);
    ref_ = nullptr;
  }

  int warmup_, repeats_;
  bool check_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cudaDeviceProp prop_{};
  GemmDims shape_{};
  Form form_;
  bool form_valid_ = false;
  std::vector<Buffers> sets_;
  float* ref_ = nullptr;
  std::vector<float> host_ref_;
};

int Main(int argc, char** argv) {
  CLI::App app{"hgemm kernel benchmark"};
  std::string csv_path, variants_arg, acc_arg = "both";
  std::string shapes_arg =
      "2048x2048x2048,4096x4096x4096,8192x8192x8192,4096x8192x2048,8192x2048x8192,"
      "16384x1024x4096,8192x64x4096,1000x1000x1000,4097x4096x4095,4096x4096x4096";  // 4096^3 twice: run-to-run spread
  std::string layouts_arg = "NN", types_arg = "fp16";
  int warmup = 5, repeats = 20;
  bool no_check = false;
  app.add_option("--csv", csv_path, "write results as CSV to this path");
  app.add_option("--variants", variants_arg,
                 "comma-separated variant names (default: every kernel and cublas)");
  app.add_option("--shapes", shapes_arg, "comma-separated MxNxK");
  app.add_option("--acc", acc_arg, "fp16, fp32 or both");
  app.add_option("--layouts", layouts_arg, "comma-separated NN, NT, TN, TT (A then B; T = transposed)");
  app.add_option("--types", types_arg,
                 "comma-separated fp16, bf16 (C of the input type), fp16_fp32, bf16_fp32 (fp32 C)");
  app.add_option("--warmup", warmup, "untimed launches per variant and shape");
  app.add_option("--repeats", repeats, "timed launches per variant and shape (median taken)");
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
  std::vector<GemmDims> shapes;
  for (const std::string& s : Split(shapes_arg, ',')) {
    GemmDims dims;
    std::string e = ParseGemmDims(s, &dims);
    if (e.empty() && std::max({dims.m, dims.n, dims.k}) > uint32_t(INT_MAX)) {
      e = "the kernels take dimensions up to 2^31 - 1";  // GemmProblem's int
    }
    if (!e.empty()) {
      std::fprintf(stderr, "bad shape %s: %s\n", s.c_str(), e.c_str());
      return 2;
    }
    shapes.push_back(dims);
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
      if (t == "fp16" || t == "fp16_fp32") f.ab = DataType::kFp16;
      else if (t == "bf16" || t == "bf16_fp32") f.ab = DataType::kBf16;
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
  Bench bench(stream, warmup, repeats, !no_check);
  const cudaDeviceProp& prop = bench.prop();
  std::printf("device: %s, %d SMs, sm_%d%d, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.major, prop.minor, prop.l2CacheSize >> 20);
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (!csv_path.empty() && csv == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
    return 2;
  }
  if (csv)
    std::fprintf(csv,
                 "device,variant,acc,layout,types,m,n,k,median_ms,tflops,ratio_to_cublas,"
                 "cublas_rel_err,rel_err,status\n");

  int wrong = 0;
  std::vector<std::string> best_lines;  // per shape, form and accumulation: the fastest own kernel
  {
    LaunchContext ctx(stream);
    for (const GemmDims& s : shapes) {
      bench.Prepare(s);
      for (const Form& form : forms) {
        bench.SetForm(form);
        const std::string types = TypesName(form.ab, form.c);
        for (Accumulation acc : accs) {
          if (!CheckProblem(*FindVariant("cublas"), bench.Problem(0, acc)).empty())
            continue;  // e.g. bf16 with fp16 accumulation: no such GEMM
          double cublas_tflops = 0, cublas_err = 0;
          Result best;
          for (const VariantInfo* v : variants) {
            if (!CheckProblem(*v, bench.Problem(0, acc)).empty()) continue;
            if (v->min_sm > prop.major * 10 + prop.minor) continue;
            Result r = bench.Run(*v, acc, ctx);
            if (v->kind == VariantKind::kCublas && r.ok) {
              cublas_tflops = r.tflops;
              cublas_err = r.rel_err;
            }
            const double ratio = cublas_tflops > 0 && r.ok ? r.tflops / cublas_tflops : 0;
            if (r.note.rfind("WRONG", 0) == 0) ++wrong;
            if (r.ok && v->kind != VariantKind::kCublas && r.tflops > best.tflops) best = r;
            std::printf("%-34s %s %s %-9s %5ux%5ux%5u %9.4f ms %7.1f TFLOP/s %5.3fx cublas err %.2e (cublas %.2e) %s\n",
                        v->name.c_str(), AccumulationName(acc), LayoutName(form.ta, form.tb),
                        types.c_str(), s.m, s.n, s.k, r.median_ms, r.tflops, ratio, r.rel_err,
                        cublas_err, r.note.c_str());
            std::fflush(stdout);
            if (csv)
              std::fprintf(csv, "%s,%s,%s,%s,%s,%u,%u,%u,%.5f,%.2f,%.4f,%.3e,%.3e,%s\n", prop.name,
                           v->name.c_str(), AccumulationName(acc), LayoutName(form.ta, form.tb),
                           types.c_str(), s.m, s.n, s.k, r.median_ms, r.tflops, ratio, cublas_err,
                           r.rel_err, r.note.empty() ? "ok" : r.note.c_str());
          }
          char line[320];
          std::snprintf(line, sizeof line,
                        "%5ux%5ux%5u %s %s %-9s cublas %6.1f  best %-32s %6.1f TFLOP/s %5.3fx  err %.2e vs cublas %.2e",
                        s.m, s.n, s.k, AccumulationName(acc), LayoutName(form.ta, form.tb),
                        types.c_str(), cublas_tflops, best.variant.c_str(), best.tflops,
                        cublas_tflops > 0 ? best.tflops / cublas_tflops : 0.0, best.rel_err,
                        cublas_err);
          best_lines.push_back(line);
        }
      }
    }
  }
  if (csv) std::fclose(csv);
  std::printf("\nfastest own kernel per shape, layout and types (TFLOP/s, ratio to cuBLAS in this run):\n");
  for (const std::string& line : best_lines) std::printf("%s\n", line.c_str());
  std::printf("%d wrong results\n", wrong);
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace hgemm::kernels

int main(int argc, char** argv) { return hgemm::kernels::Main(argc, argv); }
