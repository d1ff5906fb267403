#include "server/backend/cpu_backend.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/core/status.h"
#include "server/verify/freivalds.h"

namespace hgemm {
namespace {

constexpr char kKernelName[] = "openblas_sgemm";

// Resident buffers this small are left to malloc, whose heap reuses them anyway.
constexpr int64_t kMinReusedBytes = int64_t{1} << 20;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {}
  ~CpuBackend() override {
    for (const auto& [bytes, data] : reusable_) delete[] data;
  }

  std::string Name() const override { return "cpu"; }

  std::vector<DeviceDescription> Devices() const override {
    return {{.id = -1, .name = "cpu", .memory_bytes = 0, .slots = options_.workers}};
  }

  std::vector<KernelDescription> Kernels() const override {
    return {{.name = kKernelName,
             .description = "OpenBLAS cblas_sgemm (its transposes) on fp32 copies of A and B "
                            "(fp16 or bf16), alpha/beta on an fp32 copy of C_in; C rounded to the "
                            "inputs' type, or fp32",
             .fp16_accumulation = false,
             .fp32_accumulation = true,
             .layouts = kAllLayoutBits,
             .types = kAllTypesBits,
             .scaled_types = kAllTypesBits,
             .grouped = true,
             .fused_scale = true}};  // cblas_sgemm's own alpha and beta
  }

  int NumSlots() const override { return options_.workers; }
  int SlotDevice(int) const override { return 0; }
  int64_t MaxJobBytes() const override { return options_.max_job_bytes; }

  absl::Status AllocateResident(int device_index, int64_t bytes,
                                std::shared_ptr<ResidentBuffer>* buffer) override {
    if (bytes <= 0) {
      return status::BackendFailure(fmt::format("resident buffer of {} bytes", bytes));
    }
    if (resident_bytes_.fetch_add(bytes) + bytes > options_.resident_budget_bytes) {
      resident_bytes_ -= bytes;
      return status::OverLimit(
          "device_memory",
          fmt::format(
              "{} more bytes of resident memory would pass the CPU backend's budget of {} bytes "
              "({} in use)",
              bytes, options_.resident_budget_bytes, resident_bytes_.load()));
    }
    // The budget is host memory the machine may not have: a failed allocation is a refusal.
    char* data = TakeReusable(bytes);
    if (data == nullptr) data = new (std::nothrow) char[bytes];
    if (data == nullptr) {
      resident_bytes_ -= bytes;
      return status::OverLimit("host_memory",
                               fmt::format("out of host memory for {} bytes", bytes));
    }
    *buffer = std::make_shared<ResidentBuffer>(device_index, bytes, data, [this, bytes](void* p) {
      KeepForReuse(static_cast<char*>(p), bytes);
      resident_bytes_ -= bytes;
    });
    return absl::OkStatus();
  }

  absl::Status WriteResident(ResidentBuffer& buffer, int64_t offset, const void* host,
                             int64_t bytes) override {
    b_sides_.Forget(&buffer);
    std::memcpy(static_cast<char*>(buffer.data) + offset, host, bytes);
    return absl::OkStatus();
  }

  absl::Status ReadResident(const ResidentBuffer& buffer, void* host) override {
    std::memcpy(host, buffer.data, buffer.bytes);
    return absl::OkStatus();
  }

  absl::Status ReadResidentRange(const ResidentBuffer& buffer, int64_t offset, int64_t bytes,
                                 void* host) override {
    std::memcpy(host, static_cast<const char*>(buffer.data) + offset, bytes);
    return absl::OkStatus();
  }

  bool DeviceHealthy(int) const override { return healthy_.load(); }

  void TakeOutOfService(int, const std::string& why) override {
    if (!healthy_.exchange(false)) return;
    spdlog::critical("the CPU backend is taken out of service: {}", why);
  }

  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    if (!healthy_) return status::DeviceFailed("the CPU backend was taken out of service");
    const GemmShape& shape = job.shape;
    // Its "device" memory is host memory: a C on the device is written like any C.
    void* c = job.c_device ? job.c_device->data : job.c;
    if (job.c_device) b_sides_.Forget(job.c_device.get());
    if (job.keep_c) {
      absl::Status s = AllocateResident(0, shape.CBytes(), &report->c_resident);
      if (!s.ok()) return s;
      c = report->c_resident->data;
    }
    const auto* a = job.a_resident ? static_cast<const uint16_t*>(job.a_resident->data) : job.a;
    const auto* b = job.b_resident ? static_cast<const uint16_t*>(job.b_resident->data) : job.b;
    const auto* c_in =
        static_cast<const char*>(job.c_in_resident ? job.c_in_resident->data : job.c_in);
    // A batch or a group: its matrices one after the other in each buffer.
    struct Problem {
      ProblemDims dims;
      const uint16_t* a;
      const uint16_t* b;
      const char* c_in;
      char* c;
    };
    std::vector<Problem> problems;
    const int64_t c_element_bytes = ElementBytes(shape.c_type);
    int64_t a_offset = 0, b_offset = 0, c_offset = 0;  // elements
    for (const ProblemDims& p : shape.Problems()) {
      problems.push_back({p, a + a_offset, b + b_offset,
                          shape.c_input ? c_in + c_offset * c_element_bytes : nullptr,
                          static_cast<char*>(c) + c_offset * c_element_bytes});
      a_offset += p.m * p.k;
      b_offset += p.k * p.n;
      c_offset += p.m * p.n;
    }
    // The check's side that reads A, B and C_in comes first: C_in may be C's own memory.
    const int repetitions = job.verify_repetitions;
    std::vector<std::vector<verify::RowSums>> sums(repetitions,
                                                   std::vector<verify::RowSums>(problems.size()));
    std::vector<std::vector<uint64_t>> seeds(repetitions, std::vector<uint64_t>(problems.size()));
    auto verify_start = Clock::now();
    for (int rep = 0; rep < repetitions; ++rep) {
      for (size_t i = 0; i < problems.size(); ++i) {
        const verify::Form form = verify::FormOf(job, problems[i].dims);
        const std::shared_ptr<const verify::HostBSide> side =
            BSide(job, form, problems.size() == 1, problems[i].b, rep);
        seeds[rep][i] = side->seed;
        verify::HostExpected(form, problems[i].a, problems[i].c_in, *side, &sums[rep][i]);
      }
    }
    report->verify_ms = repetitions > 0 ? MillisecondsSince(verify_start) : 0;

    const GemmForm form{.transpose_a = job.transpose_a,
                        .transpose_b = job.transpose_b,
                        .bf16 = shape.ab_type == ElementType::kBf16,
                        .c_fp32 = shape.c_type == ElementType::kFp32};
    auto start = Clock::now();
    for (const Problem& p : problems) {
      CpuGemm(p.a, p.b, p.c, p.dims.m, p.dims.n, p.dims.k, form,
              {.alpha = job.alpha, .beta = job.beta, .c_in = p.c_in});
    }
    report->kernel_ms = MillisecondsSince(start);
    if (options_.after_gemm) options_.after_gemm(slot, job, c);

    verify_start = Clock::now();
    for (int rep = 0; rep < repetitions && report->verify_failure.empty(); ++rep) {
      for (size_t i = 0; i < problems.size(); ++i) {
        const verify::Form form = verify::FormOf(job, problems[i].dims);
        verify::HostCr(form, problems[i].c, seeds[rep][i], &sums[rep][i]);
        if (std::string failed = verify::CheckRows(form, sums[rep][i]); !failed.empty()) {
          report->verify_failure =
              fmt::format("problem {}, repetition {} of {}: {}", i, rep + 1, repetitions, failed);
          break;
        }
      }
    }
    if (repetitions > 0) {
      report->verify_ms += MillisecondsSince(verify_start);
      report->verified_repetitions = report->verify_failure.empty() ? repetitions : 0;
    }
    report->kernel = kKernelName;
    report->accumulation = Accumulation::kFp32;
    report->device_id = -1;
    report->device_name = "cpu";
    report->stream_id = slot;
    return absl::OkStatus();
  }

 private:
  // A kept buffer of exactly `bytes` (the newest), else nullptr.
  char* TakeReusable(int64_t bytes) {
    std::lock_guard<std::mutex> lock(reuse_mu_);
    for (auto it = reusable_.rbegin(); it != reusable_.rend(); ++it) {
      if (it->first != bytes) continue;
      char* data = it->second;
      reusable_bytes_ -= bytes;
      reusable_.erase(std::next(it).base());
      return data;
    }
    return nullptr;
  }

  // Keeps a released buffer for reuse, dropping the oldest kept ones past
  // options_.resident_reuse_bytes; frees it instead if it is small or alone over the limit.
  void KeepForReuse(char* data, int64_t bytes) {
    std::vector<char*> freed;
    {
      std::lock_guard<std::mutex> lock(reuse_mu_);
      if (bytes < kMinReusedBytes || bytes > options_.resident_reuse_bytes) {
        freed.push_back(data);
      } else {
        reusable_.emplace_back(bytes, data);
        reusable_bytes_ += bytes;
        while (reusable_bytes_ > options_.resident_reuse_bytes) {
          freed.push_back(reusable_.front().second);
          reusable_bytes_ -= reusable_.front().first;
          reusable_.erase(reusable_.begin());
        }
      }
    }
    for (char* p : freed) delete[] p;  // unmapping takes a while: not under the mutex
  }

  // The B side of repetition `rep` of the check of a problem `form` of `job` whose B is at `b`:
  // kept per resident B (a job of one problem), else drawn afresh.
  std::shared_ptr<const verify::HostBSide> BSide(const GemmJob& job, const verify::Form& form,
                                                 bool one_problem, const uint16_t* b, int rep) {
    const bool cached = job.b_resident && one_problem;
    const verify::ResidentBCache<verify::HostBSide>::Key key{.k = form.k,
                                                             .n = form.n,
                                                             .type = form.ab_type,
                                                             .transposed = form.transpose_b,
                                                             .repetition = rep};
    if (cached) {
      if (auto side = b_sides_.Find(job.b_resident, key)) return side;
    }
    auto side =
        std::make_shared<const verify::HostBSide>(verify::HostB(form, b, verify::FreshSeed()));
    if (cached) b_sides_.Put(job.b_resident, key, side);
    return side;
  }

  const CpuBackendOptions options_;
  std::atomic<int64_t> resident_bytes_{0};
  std::mutex reuse_mu_;
  std::vector<std::pair<int64_t, char*>> reusable_;  // guarded by reuse_mu_; bytes, data
  int64_t reusable_bytes_ = 0;                       // guarded by reuse_mu_
  std::atomic<bool> healthy_{true};
  verify::ResidentBCache<verify::HostBSide> b_sides_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace hgemm
