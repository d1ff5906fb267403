#include "server/backend/cpu_backend.h"

#include "kernels/host/cpu_gemm.h"

namespace hgemm {
namespace {

constexpr char kKernelName[] = "openblas_sgemm";

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {}

  std::string Name() const override { return "cpu"; }

  std::vector<DeviceDescription> Devices() const override {
    return {{.id = -1, .name = "cpu", .memory_bytes = 0, .slots = options_.workers}};
  }

  std::vector<KernelDescription> Kernels() const override {
    return {{.name = kKernelName,
             .description = "OpenBLAS cblas_sgemm on fp32 copies of A and B; C rounded to fp16",
             .fp16_accumulation = false,
             .fp32_accumulation = true}};
  }

  int NumSlots() const override { return options_.workers; }
  int SlotDevice(int) const override { return 0; }
  int64_t MaxJobBytes() const override { return options_.max_job_bytes; }

  grpc::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    auto start = Clock::now();
    CpuGemm(job.a, job.b, job.c, job.shape.m, job.shape.n, job.shape.k);
    report->kernel_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    report->kernel = kKernelName;
    report->accumulation = Accumulation::kFp32;
    report->device_id = -1;
    report->device_name = "cpu";
    report->stream_id = slot;
    return grpc::Status::OK;
  }

 private:
  const CpuBackendOptions options_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace hgemm
