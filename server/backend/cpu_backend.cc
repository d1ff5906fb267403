#include "server/backend/cpu_backend.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/core/status.h"

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
      return status::OverLimit(fmt::format(
          "{} more bytes of resident memory would pass the CPU backend's budget of {} bytes "
          "({} in use)",
          bytes, options_.resident_budget_bytes, resident_bytes_.load()));
    }
    // The budget is host memory the machine may not have: a failed allocation is a refusal.
    char* data = TakeReusable(bytes);
    if (data == nullptr) data = new (std::nothrow) char[bytes];
    if (data == nullptr) {
      resident_bytes_ -= bytes;
      return status::OverLimit(fmt::format("out of host memory for {} bytes", bytes));
    }
    *buffer = std::make_shared<ResidentBuffer>(device_index, bytes, data,
                                               [this, bytes](void* p) {
                                                 KeepForReuse(static_cast<char*>(p), bytes);
                                                 resident_bytes_ -= bytes;
                                               });
    return absl::OkStatus();
  }

  absl::Status WriteResident(ResidentBuffer& buffer, int64_t offset, const void* host,
                             int64_t bytes) override {
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

  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    const GemmShape& shape = job.shape;
    // Its "device" memory is host memory: a C on the device is written like any C.
    void* c = job.c_device ? job.c_device->data : job.c;
    if (job.keep_c) {
      absl::Status s = AllocateResident(0, shape.CBytes(), &report->c_resident);
      if (!s.ok()) return s;
      c = report->c_resident->data;
    }
    const auto* a = job.a_resident ? static_cast<const uint16_t*>(job.a_resident->data) : job.a;
    const auto* b = job.b_resident ? static_cast<const uint16_t*>(job.b_resident->data) : job.b;
    const auto* c_in = static_cast<const char*>(job.c_in_resident ? job.c_in_resident->data
                                                                   : job.c_in);
    const GemmForm form{.transpose_a = job.transpose_a,
                        .transpose_b = job.transpose_b,
                        .bf16 = shape.ab_type == ElementType::kBf16,
                        .c_fp32 = shape.c_type == ElementType::kFp32};
    auto start = Clock::now();
    // A batch or a group: its matrices one after the other in each buffer.
    const int64_t c_element_bytes = ElementBytes(shape.c_type);
    int64_t a_offset = 0, b_offset = 0, c_offset = 0;  // elements
    for (const ProblemDims& p : shape.Problems()) {
      CpuGemm(a + a_offset, b + b_offset, static_cast<char*>(c) + c_offset * c_element_bytes,
              p.m, p.n, p.k, form,
              {.alpha = job.alpha,
               .beta = job.beta,
               .c_in = shape.c_input ? c_in + c_offset * c_element_bytes : nullptr});
      a_offset += p.m * p.k;
      b_offset += p.k * p.n;
      c_offset += p.m * p.n;
    }
    report->kernel_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
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

  const CpuBackendOptions options_;
  std::atomic<int64_t> resident_bytes_{0};
  std::mutex reuse_mu_;
  std::vector<std::pair<int64_t, char*>> reusable_;  // guarded by reuse_mu_; bytes, data
  int64_t reusable_bytes_ = 0;                       // guarded by reuse_mu_
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace hgemm
