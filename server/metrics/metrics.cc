#include "server/metrics/metrics.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "server/core/status.h"

namespace hgemm {
namespace {

constexpr std::array<const char*, kNumRpcs> kRpcNames = {
    "Gemm",           "GemmStream",       "ListKernels",   "GetServerInfo",
    "UploadMatrix",   "ReleaseMatrix",    "ListMatrices",  "DownloadMatrix",
    "RegisterRegion", "UnregisterRegion", "ListRegions",   "CreateUpload",
    "UploadPart",     "AttachRing",       "BindRingSlots", "OpenBulk",
};

constexpr std::array<const char*, 5> kStageNames = {
    "queue_wait", "host_to_device", "kernel", "device_to_host", "server_total",
};

// 10 µs to 60 s, 1-2.5-5 per decade.
const prometheus::Histogram::BucketBoundaries& StageBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 0.1,   0.25,  0.5,    1,      2.5,    5,    10,     20,   30,    60,
  };
  return buckets;
}

int CodeIndex(absl::StatusCode code) {
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? i : static_cast<int>(absl::StatusCode::kUnknown);
}

}  // namespace

const char* RpcName(Rpc rpc) { return kRpcNames[static_cast<int>(rpc)]; }

ServiceMetrics::ServiceMetrics(const std::string& version, const std::string& backend,
                               const std::vector<DeviceDescription>& devices,
                               LoadSampler sample_load)
    : backend_(backend),
      sample_load_(std::move(sample_load)),
      requests_(prometheus::BuildCounter()
                    .Name("hgemm_requests_total")
                    .Help("Finished calls of hgemm.v1.GemmService by method and gRPC status; "
                          "a GemmStream counts once per GEMM it answers")
                    .Register(registry_)),
      stream_calls_(prometheus::BuildCounter()
                        .Name("hgemm_stream_calls_total")
                        .Help("GemmStream calls by the status they ended with")
                        .Register(registry_)),
      ring_entries_(prometheus::BuildCounter()
                        .Name("hgemm_ring_entries_total")
                        .Help("GEMMs submitted through submission rings, by the status of "
                              "their completion")
                        .Register(registry_)),
      stage_seconds_(prometheus::BuildHistogram()
                         .Name("hgemm_gemm_stage_seconds")
                         .Help("Seconds per stage of the GEMMs that ran")
                         .Register(registry_)),
      kernel_tflops_(prometheus::BuildGauge()
                         .Name("hgemm_kernel_tflops")
                         .Help("TFLOP/s of the last GEMM run with each kernel")
                         .Register(registry_)),
      resident_bytes_(prometheus::BuildGauge()
                          .Name("hgemm_resident_bytes")
                          .Help("Bytes of resident matrices per device")
                          .Register(registry_)),
      resident_matrices_(prometheus::BuildGauge()
                             .Name("hgemm_resident_matrices")
                             .Help("Resident matrices per device")
                             .Register(registry_)),
      device_failed_(prometheus::BuildGauge()
                         .Name("hgemm_device_failed")
                         .Help("1 once a device has failed for good (a sticky CUDA error: its "
                               "GEMMs are refused with UNAVAILABLE until the server restarts)")
                         .Register(registry_)),
      queued_(prometheus::BuildGauge()
                  .Name("hgemm_queued_gemms")
                  .Help("GEMMs admitted and waiting for an execution slot")
                  .Register(registry_)
                  .Add({})),
      running_(prometheus::BuildGauge()
                   .Name("hgemm_running_gemms")
                   .Help("GEMMs running now")
                   .Register(registry_)
                   .Add({})),
      admitted_bytes_(
          prometheus::BuildGauge()
              .Name("hgemm_admitted_bytes")
              .Help("Operand and result bytes of the admitted GEMMs (queued or running)")
              .Register(registry_)
              .Add({})),
      upload_queue_writes_(prometheus::BuildGauge()
                               .Name("hgemm_upload_queue_writes")
                               .Help("Chunk copies to the device waiting for an upload thread")
                               .Register(registry_)
                               .Add({})),
      staged_regions_(prometheus::BuildGauge()
                          .Name("hgemm_shared_regions_staged")
                          .Help("Registered shared-memory regions the backend failed to pin for "
                                "DMA: their GEMMs copy through staging buffers")
                          .Register(registry_)
                          .Add({})),
      rings_attached_(prometheus::BuildGauge()
                          .Name("hgemm_rings_attached")
                          .Help("Submission rings attached now (AttachRing calls open)")
                          .Register(registry_)
                          .Add({})) {
  auto& received = prometheus::BuildCounter()
                       .Name("hgemm_received_bytes_total")
                       .Help("Operand bytes received (A, B, streamed chunks, uploaded matrices)")
                       .Register(registry_);
  auto& sent = prometheus::BuildCounter()
                   .Name("hgemm_sent_bytes_total")
                   .Help("Result bytes sent (C, downloaded matrices)")
                   .Register(registry_);
  // Only the methods that move matrices, each way.
  for (Rpc rpc : {Rpc::kGemm, Rpc::kGemmStream, Rpc::kUploadMatrix, Rpc::kUploadPart}) {
    received_bytes_[int(rpc)] = &received.Add({{"rpc", RpcName(rpc)}});
  }
  for (Rpc rpc : {Rpc::kGemm, Rpc::kGemmStream, Rpc::kDownloadMatrix}) {
    sent_bytes_[int(rpc)] = &sent.Add({{"rpc", RpcName(rpc)}});
  }
  auto& transport = prometheus::BuildCounter()
                        .Name("hgemm_transport_bytes_total")
                        .Help(
                            "Matrix bytes by how they travelled: gRPC over tcp or unix, shm "
                            "(shared-memory regions), or bulk (the bulk channel)")
                        .Register(registry_);
  constexpr std::array<const char*, kNumDataPaths> kPathNames = {"tcp", "unix", "shm", "bulk"};
  for (DataPath path : {DataPath::kTcp, DataPath::kUnix, DataPath::kShm, DataPath::kBulk}) {
    const char* name = kPathNames[int(path)];
    transport_bytes_[int(path)][0] =
        &transport.Add({{"transport", name}, {"direction", "received"}});
    transport_bytes_[int(path)][1] = &transport.Add({{"transport", name}, {"direction", "sent"}});
  }
  prometheus::BuildGauge()
      .Name("hgemm_build_info")
      .Help("Always 1; the server's version and backend as labels")
      .Register(registry_)
      .Add({{"version", version}, {"backend", backend}})
      .Set(1);
  auto& device_info = prometheus::BuildGauge()
                          .Name("hgemm_device_info")
                          .Help("Always 1; each device's name and compute capability as labels")
                          .Register(registry_);
  auto& device_memory = prometheus::BuildGauge()
                            .Name("hgemm_device_memory_bytes")
                            .Help("Memory of each device")
                            .Register(registry_);
  for (const DeviceDescription& d : devices) {
    const std::string id = std::to_string(d.id);
    device_info
        .Add({{"device", id}, {"name", d.name}, {"compute_capability", d.compute_capability}})
        .Set(1);
    device_memory.Add({{"device", id}}).Set(double(d.memory_bytes));
    device_failed_.Add({{"device", id}}).Set(0);  // present before any failure, for alerts
  }
}

void ServiceMetrics::CountCall(Rpc rpc, absl::StatusCode code) {
  const int c = CodeIndex(code);
  std::atomic<prometheus::Counter*>& slot = request_counters_[int(rpc)][c];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {  // Family::Add returns the same counter to racing callers
    counter =
        &requests_.Add({{"rpc", RpcName(rpc)}, {"code", status::CodeName(absl::StatusCode(c))}});
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void ServiceMetrics::CountStreamCall(absl::StatusCode code) {
  const int c = CodeIndex(code);
  prometheus::Counter* counter = stream_call_counters_[c].load(std::memory_order_acquire);
  if (counter == nullptr) {
    counter = &stream_calls_.Add({{"code", status::CodeName(absl::StatusCode(c))}});
    stream_call_counters_[c].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void ServiceMetrics::CountRingEntry(absl::StatusCode code) {
  const int c = CodeIndex(code);
  prometheus::Counter* counter = ring_entry_counters_[c].load(std::memory_order_acquire);
  if (counter == nullptr) {
    counter = &ring_entries_.Add({{"code", status::CodeName(absl::StatusCode(c))}});
    ring_entry_counters_[c].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void ServiceMetrics::AddReceivedBytes(Rpc rpc, int64_t bytes) {
  if (prometheus::Counter* c = received_bytes_[int(rpc)]; c != nullptr && bytes > 0) {
    c->Increment(double(bytes));
  }
}

void ServiceMetrics::AddSentBytes(Rpc rpc, int64_t bytes) {
  if (prometheus::Counter* c = sent_bytes_[int(rpc)]; c != nullptr && bytes > 0) {
    c->Increment(double(bytes));
  }
}

void ServiceMetrics::AddTransportBytes(DataPath path, bool sent, int64_t bytes) {
  if (bytes > 0) transport_bytes_[int(path)][sent ? 1 : 0]->Increment(double(bytes));
}

std::vector<prometheus::MetricFamily> ServiceMetrics::RegionFamilies(
    std::vector<LoadSample::RegionOwner> owners) {
  std::sort(owners.begin(), owners.end(), [](const auto& x, const auto& y) {
    return x.bytes != y.bytes ? x.bytes > y.bytes : x.principal < y.principal;
  });
  if (owners.size() > kMaxRegionOwners) {
    LoadSample::RegionOwner other{.principal = "other"};
    for (size_t i = kMaxRegionOwners; i < owners.size(); ++i) {
      other.regions += owners[i].regions;
      other.bytes += owners[i].bytes;
    }
    owners.resize(kMaxRegionOwners);
    owners.push_back(std::move(other));
  }
  prometheus::MetricFamily regions{"hgemm_shared_regions",
                                   "Registered shared-memory regions per owner",
                                   prometheus::MetricType::Gauge,
                                   {}};
  prometheus::MetricFamily bytes{"hgemm_shared_region_bytes",
                                 "Bytes of the registered shared-memory regions per owner",
                                 prometheus::MetricType::Gauge,
                                 {}};
  for (const LoadSample::RegionOwner& owner : owners) {
    prometheus::ClientMetric metric;
    metric.label = {{"principal", owner.principal}};
    metric.gauge.value = double(owner.regions);
    regions.metric.push_back(metric);
    metric.gauge.value = double(owner.bytes);
    bytes.metric.push_back(metric);
  }
  return {std::move(regions), std::move(bytes)};
}

ServiceMetrics::KernelSeries& ServiceMetrics::SeriesFor(const std::string& kernel) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kernels_.find(kernel);
  if (it != kernels_.end()) return it->second;
  const std::string label = kernels_.size() < kMaxKernels ? kernel : "other";
  if (label != kernel) {
    if (auto other = kernels_.find(label); other != kernels_.end()) return other->second;
  }
  KernelSeries series;
  for (size_t i = 0; i < kStageNames.size(); ++i) {
    series.stages[i] = &stage_seconds_.Add(
        {{"stage", kStageNames[i]}, {"backend", backend_}, {"kernel", label}}, StageBuckets());
  }
  series.tflops = &kernel_tflops_.Add({{"backend", backend_}, {"kernel", label}});
  return kernels_.emplace(label, series).first->second;
}

void ServiceMetrics::ObserveGemm(const GemmReport& report, double tflops) {
  KernelSeries& series = SeriesFor(report.kernel);
  const double ms[] = {report.queue_wait_ms, report.host_to_device_ms, report.kernel_ms,
                       report.device_to_host_ms, report.server_total_ms};
  for (size_t i = 0; i < kStageNames.size(); ++i) series.stages[i]->Observe(ms[i] * 1e-3);
  series.tflops->Set(tflops);
}

std::vector<prometheus::MetricFamily> ServiceMetrics::VerifyFamilies(
    const std::vector<LoadSample::Device>& devices) {
  struct Counted {
    const char* name;
    const char* help;
    int64_t LoadSample::Device::*count;
  };
  static constexpr Counted kCounted[] = {
      {"hgemm_verified_gemms_total", "GEMMs whose C passed its Freivalds check on the device",
       &LoadSample::Device::verified},
      {"hgemm_verify_failures_total", "Freivalds checks of C that failed on the device",
       &LoadSample::Device::verify_failures},
      {"hgemm_verify_reruns_total",
       "Reruns on the device of GEMMs whose C failed its Freivalds check elsewhere",
       &LoadSample::Device::verify_reruns},
      {"hgemm_verify_suspect_total",
       "Failed Freivalds checks on the device whose rerun on another slot passed",
       &LoadSample::Device::verify_suspect},
  };
  std::vector<prometheus::MetricFamily> families;
  for (const Counted& counted : kCounted) {
    prometheus::MetricFamily family{
        counted.name, counted.help, prometheus::MetricType::Counter, {}};
    for (const LoadSample::Device& d : devices) {
      prometheus::ClientMetric metric;
      metric.label = {{"device", d.id}};
      metric.counter.value = double(d.*counted.count);
      family.metric.push_back(metric);
    }
    families.push_back(std::move(family));
  }
  return families;
}

namespace {

// A histogram of exact counts (value → observations) over the buckets `bounds` (and +Inf).
prometheus::MetricFamily HistogramOf(const char* name, const char* help,
                                     const std::map<int64_t, int64_t>& counts,
                                     const std::vector<double>& bounds) {
  prometheus::ClientMetric metric;
  for (const auto& [value, count] : counts) {
    metric.histogram.sample_count += uint64_t(count);
    metric.histogram.sample_sum += double(value) * double(count);
  }
  std::vector<double> upper = bounds;
  upper.push_back(std::numeric_limits<double>::infinity());
  for (double bound : upper) {
    uint64_t cumulative = 0;
    for (auto it = counts.begin(); it != counts.end() && double(it->first) <= bound; ++it) {
      cumulative += uint64_t(it->second);
    }
    metric.histogram.bucket.push_back({.cumulative_count = cumulative, .upper_bound = bound});
  }
  return {name, help, prometheus::MetricType::Histogram, {metric}};
}

}  // namespace

std::vector<prometheus::MetricFamily> ServiceMetrics::BatchFamilies(const LoadSample& load) {
  // Powers of two: a batch has at least two members; rows run up to --max_batch_rows.
  static const std::vector<double> kMembers = {2, 4, 8, 16, 32, 64, 128, 256, 512};
  static const std::vector<double> kRows = {8,    16,   32,   64,   128,   256,  512,
                                            1024, 2048, 4096, 8192, 16384, 65536};
  return {HistogramOf("hgemm_batch_members",
                      "GEMMs per batched launch (GEMMs sharing a resident B run as one GEMM)",
                      load.batch_members, kMembers),
          HistogramOf("hgemm_batch_rows", "Rows (the members' m summed) per batched launch",
                      load.batch_rows, kRows)};
}

std::vector<prometheus::MetricFamily> ServiceMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> regions;
  if (sample_load_) {
    LoadSample load = sample_load_();
    regions = RegionFamilies(std::move(load.region_owners));
    for (prometheus::MetricFamily& family : VerifyFamilies(load.devices)) {
      regions.push_back(std::move(family));
    }
    for (prometheus::MetricFamily& family : BatchFamilies(load)) {
      regions.push_back(std::move(family));
    }
    queued_.Set(double(load.queued));
    running_.Set(double(load.running));
    admitted_bytes_.Set(double(load.admitted_bytes));
    upload_queue_writes_.Set(double(load.upload_queue_writes));
    staged_regions_.Set(double(load.staged_regions));
    rings_attached_.Set(double(load.rings_attached));
    for (const LoadSample::Device& d : load.devices) {
      resident_bytes_.Add({{"device", d.id}}).Set(double(d.resident_bytes));
      resident_matrices_.Add({{"device", d.id}}).Set(double(d.resident_matrices));
      device_failed_.Add({{"device", d.id}}).Set(d.failed ? 1 : 0);
    }
  }
  std::vector<prometheus::MetricFamily> families = registry_.Collect();
  for (prometheus::MetricFamily& family : regions) families.push_back(std::move(family));
  return families;
}

}  // namespace hgemm
