// GemmCore: the service without its transport. It takes one GEMM of an owner (already
// identified) from its validated job and operand sources to a finished GemmResult that names
// the device, backend and kernel that ran it: admission (the size limits, resident operands,
// the quota of a kept C, the owner's budget of operand bytes still arriving), placement of
// arriving operands, the run on the scheduler and what happens to C afterwards. It owns the
// resident resolver, the per-client budget and the pool of host buffers for results.
//
// A request's transport (the unary Gemm handler, StreamSession, the submission ring) only says
// where each operand comes from (OperandSource) and where C goes (ResultSink): a GemmOrder
// (gemm_spec.h); a new kind of source is resolved here, in Admit, and touches no transport
// code.
//
// Thread safety: all methods are thread-safe. Every pointer given at construction must
// outlive the core.
#ifndef HGEMM_SERVER_SESSION_GEMM_CORE_H_
#define HGEMM_SERVER_SESSION_GEMM_CORE_H_

#include <absl/status/status.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/backend/backend.h"
#include "server/core/job.h"
#include "server/resident/matrix_store.h"
#include "server/resident/region_store.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/upload_queue.h"
#include "server/session/gemm_spec.h"
#include "server/session/host_buffer_pool.h"
#include "server/session/resident_resolver.h"
#include "server/session/validation.h"

namespace hgemm {

// What a GEMM came to, once it ran.
struct GemmResult {
  GemmReport report;    // its c_resident is moved into kept_c
  std::string backend;  // Backend::Name()
  ResidentMatrix kept_c;  // for ResultSink::kKeepResident: the matrix now in the store
};

// Called exactly once per GEMM that Run accepted, on a scheduler thread.
using GemmFinished = std::function<void(const absl::Status&, GemmResult)>;

// Operand bytes that each client's GEMMs hold while they are still arriving (over all of the
// client's streams), bounded per client.
// Thread safety: all methods are thread-safe.
class ClientPendingBudget {
 public:
  explicit ClientPendingBudget(int64_t max_bytes_per_client)
      : max_bytes_per_client_(max_bytes_per_client) {}

  // Takes `bytes` of `owner`'s budget, or RESOURCE_EXHAUSTED (nothing taken).
  absl::Status Charge(const std::string& owner, int64_t bytes);
  // Gives back `bytes` that Charge took for `owner`.
  void Release(const std::string& owner, int64_t bytes);

 private:
  const int64_t max_bytes_per_client_;
  std::mutex mu_;
  std::map<std::string, int64_t> pending_bytes_;  // guarded by mu_; owners with > 0
};

// An admitted GEMM: its job (with resident operands set) and what it holds until it runs or is
// dropped (the kept C's quota, its arriving bytes of the owner's budget). Move-only; dropping
// it gives everything back.
class AdmittedGemm {
 public:
  AdmittedGemm() = default;
  AdmittedGemm(AdmittedGemm&& other) noexcept { *this = std::move(other); }
  // Gives back what this one held, then takes what `other` holds.
  AdmittedGemm& operator=(AdmittedGemm&& other) noexcept;
  ~AdmittedGemm() { ReleasePending(); }

  GemmJob& job() { return job_; }
  const GemmJob& job() const { return job_; }
  // Bytes of the operands that arrive in pieces.
  int64_t arriving_bytes() const { return arriving_bytes_; }

 private:
  friend class GemmCore;
  void ReleasePending();

  std::string owner_;
  GemmJob job_;
  int64_t arriving_bytes_ = 0;
  QuotaReservation c_quota_;
  uint32_t c_ttl_seconds_ = 0;
  bool c_transient_ = false;
  std::vector<std::string> transient_operands_;  // handles released once it has run
  ClientPendingBudget* pending_budget_ = nullptr;  // set while arriving bytes are charged
  std::vector<RegionLease> regions_;  // held until the GEMM is answered
};

struct GemmCoreOptions {
  RequestRules rules;
  // Operand bytes all GEMMs of one client may hold while they are still arriving; more is
  // refused (RESOURCE_EXHAUSTED).
  int64_t max_client_pending_bytes = int64_t{8} << 30;
  // Idle host buffers kept for the next C or download (see HostBufferPool).
  int64_t result_buffer_pool_bytes = int64_t{1} << 30;
  // This server's replica address, named in handles ("" without replicas).
  std::string replica;
  // Shared-memory regions: whether they are allowed, quotas, time to live.
  RegionStoreOptions regions;
};

class GemmCore {
 public:
  GemmCore(Scheduler* scheduler, Backend* backend, MatrixStore* store, UploadQueue* uploads,
           GemmCoreOptions options);
  GemmCore(const GemmCore&) = delete;
  GemmCore& operator=(const GemmCore&) = delete;

  // Admits `order` of `owner`: the size limits, its resident operands (their shapes), the
  // quota of a kept C and the owner's budget of arriving bytes; places a GEMM with arriving
  // operands on the device they will be written to (job().device_index). Errors:
  // RESOURCE_EXHAUSTED (a limit), NOT_FOUND (a handle), INVALID_ARGUMENT (a matrix of the
  // wrong shape); for regions (OperandSource/ResultSink::kRegion) those of
  // RegionStore::CheckAllowed and RegionStore::Acquire: a lease on each region is held until
  // the GEMM is answered. Nothing stays held on an error. REQUIRES: order.job.shape is
  // validated.
  absl::Status Admit(const std::string& owner, GemmOrder order, AdmittedGemm* admitted) const;

  // On an upload thread: where `bytes` of an arriving operand go, on the device an admitted
  // GEMM was placed on (its job().device_index), evicting least recently used resident
  // matrices first when the store's LRU eviction is on. UNAVAILABLE when the device memory is
  // busy for now.
  absl::Status AllocateArriving(int device_index, int64_t bytes,
                                std::shared_ptr<ResidentBuffer>* buffer) const;

  // Runs an admitted GEMM whose operands are all in (job().a/b or a_resident/b_resident, and
  // job().c for ResultSink::kHost): OK once the scheduler took it (then `done` runs once,
  // later, on a scheduler thread), else why not (UNAVAILABLE: the queue is full) and
  // everything is given back. Transient resident operands are released once it has run OK.
  absl::Status Run(AdmittedGemm admitted, GemmFinished done) const;

  // The device id (as in DeviceDescription) a resident matrix lives on.
  int DeviceId(const ResidentMatrix& matrix) const;
  // The index of the device with id `device_id`, or INVALID_ARGUMENT naming `field`.
  absl::Status FindDevice(int device_id, const std::string& field, int* device_index) const;

  const RequestRules& rules() const { return options_.rules; }
  const std::string& replica() const { return options_.replica; }
  Backend& backend() const { return *backend_; }
  Scheduler& scheduler() const { return *scheduler_; }
  MatrixStore& store() const { return *store_; }
  UploadQueue& uploads() const { return *uploads_; }
  HostBufferPool& host_buffers() const { return host_buffers_; }
  RegionStore& regions() const { return regions_; }

 private:
  // The leases of `order`'s regions into `gemm`: its job's a, b, c_in and c point into regions
  // of host memory (job.pinned saying which the backend pinned); CUDA IPC regions become its
  // resident operands and c_device, and keep the job on their device (FAILED_PRECONDITION for
  // operands on another one).
  absl::Status AcquireRegions(const std::string& owner, const GemmOrder& order,
                              AdmittedGemm* gemm) const;

  Scheduler* const scheduler_;
  Backend* const backend_;
  MatrixStore* const store_;
  UploadQueue* const uploads_;
  const GemmCoreOptions options_;
  const ResidentResolver resolver_;
  mutable ClientPendingBudget client_pending_;
  mutable HostBufferPool host_buffers_;
  mutable RegionStore regions_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_GEMM_CORE_H_
