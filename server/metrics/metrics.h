// ServiceMetrics: the Prometheus metrics of hgemm-serve, served as text at /metrics by the
// MetricsHttpServer of HgemmServer (ServerOptions::metrics_listen). The transport calls it at the
// one place each call (and each GEMM of a stream) is answered; load gauges are sampled at scrape
// time through a LoadSampler, so the scheduler and the resident store know nothing of it.
//
// Metrics (label values are bounded: method and status names, the backend, kernel and device
// names the backend reports; never request ids, handles or shapes):
//   hgemm_requests_total{rpc,code}        finished calls of hgemm.v1.GemmService. A GemmStream
//                                         counts once per GEMM it answers (rpc="GemmStream",
//                                         the GemmDone's code); the stream call itself is not
//                                         counted here but in hgemm_stream_calls_total. GEMMs
//                                         whose answer could not be written (the client went
//                                         away) are not counted: their stream ends CANCELLED.
//   hgemm_stream_calls_total{code}        GemmStream calls, by the status they ended with
//   hgemm_received_bytes_total{rpc}       operand bytes received (A and B, streamed chunks,
//                                         uploaded matrices); protobuf framing not included
//   hgemm_sent_bytes_total{rpc}           result bytes sent (C, downloaded matrices)
//   hgemm_transport_bytes_total{transport,direction}
//                                         the same bytes by how they travelled: in gRPC
//                                         messages over TCP ("tcp") or a Unix socket ("unix"),
//                                         or through shared-memory regions ("shm": A and B read
//                                         from them, C written into them); direction
//                                         "received" or "sent"
//   hgemm_shared_regions{principal}, hgemm_shared_region_bytes{principal}
//                                         registered shared-memory regions and their bytes per
//                                         owner: the kMaxRegionOwners largest owners by name,
//                                         the rest summed as "other"
//   hgemm_ring_entries_total{code}       GEMMs submitted through submission rings (AttachRing),
//                                         by the status of their completion
//   hgemm_rings_attached                  submission rings attached now
//   hgemm_shared_regions_staged          registered regions the backend failed to pin for DMA
//                                         (cudaHostRegister, e.g. over RLIMIT_MEMLOCK): their
//                                         GEMMs copy through staging buffers instead
//   hgemm_gemm_stage_seconds{stage,backend,kernel}
//                                         histogram per stage (queue_wait, host_to_device,
//                                         kernel, device_to_host, server_total) of GEMMs that
//                                         ran (status OK); buckets 10 µs to 60 s
//   hgemm_kernel_tflops{backend,kernel}   TFLOP/s of the last GEMM run with that kernel
//   hgemm_queued_gemms, hgemm_running_gemms, hgemm_admitted_bytes
//                                         the scheduler's load (Scheduler::GetStats)
//   hgemm_upload_queue_writes             chunk copies waiting for an upload thread
//   hgemm_resident_bytes{device}, hgemm_resident_matrices{device}
//   hgemm_device_memory_bytes{device}     each device's memory (DeviceDescription)
//   hgemm_device_failed{device}           1 once the device has failed for good (a sticky
//                                         CUDA error, Backend::DeviceHealthy), else 0
//   hgemm_verified_gemms_total{device}    GEMMs whose C passed its Freivalds check there
//   hgemm_verify_failures_total{device}   Freivalds checks of C that failed there
//   hgemm_verify_reruns_total{device}     reruns run there after a check failed elsewhere
//   hgemm_verify_suspect_total{device}    failed checks there whose rerun passed: the device,
//                                         not the inputs, was wrong (Scheduler::VerifyStats)
//   hgemm_batch_members, hgemm_batch_rows
//                                         histograms of the batched launches (GEMMs sharing a
//                                         resident B run as one, Scheduler::BatchStats): their
//                                         members and their rows (the members' m summed); the
//                                         _count of either is the launches since start
//   hgemm_build_info{version,backend} 1
//   hgemm_device_info{device,name,compute_capability} 1
//
// Thread safety: every method may be called from any thread at once (counters, gauges and
// histograms are prometheus-cpp's, which are thread-safe; the label caches take a mutex only
// the first time a label set is seen). Collect() may run concurrently with everything else.
//
// Ownership: held in a std::shared_ptr (shared with the MetricsHttpServer serving it). The
// sampler passed in must stay callable for as long as Collect() can be called, i.e. until
// that server is destroyed.
#ifndef HGEMM_SERVER_METRICS_METRICS_H_
#define HGEMM_SERVER_METRICS_METRICS_H_

#include <absl/status/status.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/backend/backend.h"
#include "server/core/job.h"

namespace hgemm {

// The methods of hgemm.v1.GemmService.
enum class Rpc {
  kGemm,
  kGemmStream,
  kListKernels,
  kGetServerInfo,
  kUploadMatrix,
  kReleaseMatrix,
  kListMatrices,
  kDownloadMatrix,
  kRegisterRegion,
  kUnregisterRegion,
  kListRegions,
  kCreateUpload,
  kUploadPart,
  kAttachRing,
  kBindRingSlots,
  kOpenBulk,
};
inline constexpr int kNumRpcs = 16;

// How a call's matrix bytes travel (hgemm_transport_bytes_total's label): gRPC over TCP or a
// Unix socket, shared-memory regions, or the bulk channel's connections.
enum class DataPath { kTcp, kUnix, kShm, kBulk };
inline constexpr int kNumDataPaths = 4;
// The method's name as in the .proto ("Gemm", "GemmStream", ...).
const char* RpcName(Rpc rpc);

// The load at one instant, for the gauges.
struct LoadSample {
  int64_t queued = 0;
  int64_t running = 0;
  int64_t admitted_bytes = 0;
  int64_t upload_queue_writes = 0;
  int64_t staged_regions = 0;  // RegionStore::StagedRegions
  int64_t rings_attached = 0;  // RingRegistry::Attached
  struct Device {
    std::string id;  // DeviceDescription::id, as a string
    int64_t resident_bytes = 0;
    int64_t resident_matrices = 0;
    bool failed = false;  // !Backend::DeviceHealthy
    // Freivalds' checks there since start (Scheduler::VerifyStats).
    int64_t verified = 0, verify_failures = 0, verify_reruns = 0, verify_suspect = 0;
  };
  std::vector<Device> devices;
  struct RegionOwner {
    std::string principal;
    int64_t regions = 0;
    int64_t bytes = 0;
  };
  std::vector<RegionOwner> region_owners;  // owners with registered regions, any order
  // The batched launches since start by members and by rows: value → launches
  // (Scheduler::BatchStats).
  std::map<int64_t, int64_t> batch_members, batch_rows;
};
using LoadSampler = std::function<LoadSample()>;

class ServiceMetrics final : public prometheus::Collectable {
 public:
  // `sample_load` (may be empty: no load gauges) is called once per Collect().
  ServiceMetrics(const std::string& version, const std::string& backend,
                 const std::vector<DeviceDescription>& devices, LoadSampler sample_load);
  ServiceMetrics(const ServiceMetrics&) = delete;
  ServiceMetrics& operator=(const ServiceMetrics&) = delete;

  // One finished call of `rpc` (for GemmStream: one answered GEMM) with `code`.
  void CountCall(Rpc rpc, absl::StatusCode code);
  // One GemmStream call ended with `code`.
  void CountStreamCall(absl::StatusCode code);
  // One GEMM of a submission ring completed with `code`.
  void CountRingEntry(absl::StatusCode code);
  void AddReceivedBytes(Rpc rpc, int64_t bytes);
  void AddSentBytes(Rpc rpc, int64_t bytes);
  // Matrix bytes received or sent (`sent`) by way of `path`.
  void AddTransportBytes(DataPath path, bool sent, int64_t bytes);
  // The stage times of a GEMM that ran; `tflops` its rate (GemmReport::Tflops).
  void ObserveGemm(const GemmReport& report, double tflops);

  // The samples of every metric, the gauges just refreshed from the sampler.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  static constexpr int kNumCodes = 17;  // absl::StatusCode kOk .. kUnauthenticated
  // Distinct kernels given their own label value; past that they count as "other".
  static constexpr size_t kMaxKernels = 64;
  // Region owners given their own label value (the largest by bytes); the rest are "other".
  static constexpr size_t kMaxRegionOwners = 16;
  // hgemm_shared_regions and hgemm_shared_region_bytes of `owners`, made at each scrape (so
  // that owners who left disappear).
  static std::vector<prometheus::MetricFamily> RegionFamilies(
      std::vector<LoadSample::RegionOwner> owners);
  // The hgemm_verif* counters of `devices`, made at each scrape from the scheduler's counts.
  static std::vector<prometheus::MetricFamily> VerifyFamilies(
      const std::vector<LoadSample::Device>& devices);
  // The hgemm_batch_* histograms of `load`, made at each scrape from the scheduler's counts.
  static std::vector<prometheus::MetricFamily> BatchFamilies(const LoadSample& load);
  struct KernelSeries {
    std::array<prometheus::Histogram*, 5> stages;  // in the order of kStageNames
    prometheus::Gauge* tflops;
  };
  KernelSeries& SeriesFor(const std::string& kernel);

  const std::string backend_;
  const LoadSampler sample_load_;
  prometheus::Registry registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& stream_calls_;
  prometheus::Family<prometheus::Counter>& ring_entries_;
  prometheus::Family<prometheus::Histogram>& stage_seconds_;
  prometheus::Family<prometheus::Gauge>& kernel_tflops_;
  prometheus::Family<prometheus::Gauge>& resident_bytes_;
  prometheus::Family<prometheus::Gauge>& resident_matrices_;
  prometheus::Family<prometheus::Gauge>& device_failed_;
  prometheus::Gauge& queued_;
  prometheus::Gauge& running_;
  prometheus::Gauge& admitted_bytes_;
  prometheus::Gauge& upload_queue_writes_;
  prometheus::Gauge& staged_regions_;
  prometheus::Gauge& rings_attached_;
  std::array<prometheus::Counter*, kNumRpcs>
      received_bytes_{};  // null: the method moves no matrices
  std::array<prometheus::Counter*, kNumRpcs> sent_bytes_{};
  // [path][0: received, 1: sent]
  std::array<std::array<prometheus::Counter*, 2>, kNumDataPaths> transport_bytes_{};
  // Created on first use: only the (rpc, code) pairs seen appear in the text.
  std::array<std::array<std::atomic<prometheus::Counter*>, kNumCodes>, kNumRpcs>
      request_counters_{};
  std::array<std::atomic<prometheus::Counter*>, kNumCodes> stream_call_counters_{};
  std::array<std::atomic<prometheus::Counter*>, kNumCodes> ring_entry_counters_{};

  std::mutex mu_;
  std::map<std::string, KernelSeries> kernels_;  // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_METRICS_METRICS_H_
