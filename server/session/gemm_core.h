// GemmCore: the service without its transport. It takes one GEMM of an owner (already
// identified) from its validated job and operand sources to a finished GemmResult that names
// the device, backend and kernel that ran it: admission (the size limits, resident operands,
// the quota of a kept C, the owner's budget of operand bytes still arriving), placement of
// arriving operands, the run on the scheduler and what happens to C afterwards. Beside GEMMs it
// answers for an owner's resident matrices (uploads, parts, downloads, listing, release) and
// shared-memory regions (registration, leases, listing), so that a transport never reaches into
// the stores behind it. It owns the resident resolver, the per-client budget, the pool of host
// buffers for results and the region store.
//
// A request's transport (the unary Gemm handler, StreamSession, the submission ring) only says
// where each operand comes from (OperandSource) and where C goes (ResultSink): a GemmOrder
// (gemm_spec.h); a new kind of source is resolved here, in Admit, and touches no transport
// code.
//
// GemmCoreInterface is what the transport and the sessions see of the core. The server builds
// one GemmCore (server/server.cc) and hands the transport a pointer to it, which the transport
// does not own; transport tests hand it a mock instead (server/testing/mock_gemm_core.h).
//
// Thread safety: all methods are thread-safe. Ownership: every pointer given at construction
// must outlive the core, and the core must outlive every call, session and lease that uses it.
#ifndef HGEMM_SERVER_SESSION_GEMM_CORE_H_
#define HGEMM_SERVER_SESSION_GEMM_CORE_H_

#include <absl/status/status.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/backend/backend.h"
#include "server/core/job.h"
#include "server/core/wire_bytes.h"
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
  GemmReport report;      // its c_resident is moved into kept_c
  std::string backend;    // Backend::Name()
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
  std::vector<std::string> transient_operands_;    // handles released once it has run
  ClientPendingBudget* pending_budget_ = nullptr;  // set while arriving bytes are charged
  std::vector<RegionLease> regions_;               // held until the GEMM is answered
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

// Answers a CreateUpload, once: OK with the incomplete matrix now in the store, or why not.
using UploadCreated = std::function<void(const absl::Status&, const ResidentMatrix&)>;
// Answers a RegisterRegion, once: OK with the new region, or why not.
using RegionRegistered = std::function<void(const absl::Status&, const RegionInfo&)>;

// An owner's resident matrices, as ListMatrices answers.
struct MatrixList {
  std::vector<ResidentMatrix> matrices;  // for an administrator: every owner's
  int64_t client_bytes = 0;              // the caller's own, against its quota
  int64_t quota_bytes = 0;               // per client
};

// An owner's regions, as ListRegions answers.
struct RegionList {
  std::vector<RegionInfo> regions;
  int64_t owner_bytes = 0;  // of the owner's account, against its quota
  int64_t quota_bytes = 0;  // per account
  int quota_regions = 0;    // per account
};

// What a transport (and the sessions under it) may ask of the core. Owners are principals the
// transport has already identified; `field` arguments name the request field that refusals
// name. Statuses are the core's (server/core/status.h); the transport maps them once, at its
// edge.
// Thread safety: implementations are thread-safe.
class GemmCoreInterface {
 public:
  GemmCoreInterface() = default;
  GemmCoreInterface(const GemmCoreInterface&) = delete;
  GemmCoreInterface& operator=(const GemmCoreInterface&) = delete;
  virtual ~GemmCoreInterface() = default;

  // ---- GEMMs

  // The rules requests are validated against (ValidateGemm).
  virtual const RequestRules& rules() const = 0;

  // Admits `order` of `owner`: the size limits, its resident operands (their shapes), the
  // quota of a kept C and the owner's budget of arriving bytes; places a GEMM with arriving
  // operands on the device they will be written to (job().device_index). Errors:
  // RESOURCE_EXHAUSTED (a limit, named), NOT_FOUND (a handle), INVALID_ARGUMENT (a matrix of
  // the wrong shape); for regions (OperandSource/ResultSink::kRegion) those of
  // CheckRegionsAllowed and LeaseRegion: a lease on each region is held until the GEMM is
  // answered. Nothing stays held on an error. REQUIRES: order.job.shape is validated.
  virtual absl::Status Admit(const std::string& owner, GemmOrder order, AdmittedGemm* admitted) = 0;

  // On an upload thread: where `bytes` of an arriving operand go, on the device an admitted
  // GEMM was placed on (its job().device_index), evicting least recently used resident
  // matrices first when the store's LRU eviction is on. UNAVAILABLE when the device memory is
  // busy for now.
  virtual absl::Status AllocateArriving(int device_index, int64_t bytes,
                                        std::shared_ptr<ResidentBuffer>* buffer) = 0;

  // Runs an admitted GEMM whose operands are all in (job().a/b or a_resident/b_resident, and
  // job().c for ResultSink::kHost): OK once the scheduler took it (then `done` runs once,
  // later, on a scheduler thread), else why not (UNAVAILABLE: the queue is full) and
  // everything is given back. Transient resident operands are released once it has run OK.
  // REQUIRES: `admitted` came from this core's Admit.
  virtual absl::Status Run(AdmittedGemm admitted, GemmFinished done) = 0;

  // ---- The server's devices and load

  // Backend::Name() and Backend::Devices() of the backend GEMMs run on.
  virtual std::string BackendName() const = 0;
  virtual std::vector<DeviceDescription> Devices() const = 0;
  // The index of the device with id `device_id`, or INVALID_ARGUMENT naming `field`.
  virtual absl::Status FindDevice(int device_id, const std::string& field,
                                  int* device_index) const = 0;
  // The scheduler's counts now (queued, running, admitted, completed).
  virtual Scheduler::Stats SchedulerStats() const = 0;

  // ---- Resident matrices

  // The device id (as in DeviceDescription) a resident matrix lives on.
  virtual int DeviceId(const ResidentMatrix& matrix) const = 0;
  // This server's replica address, named in handles ("" without replicas).
  virtual const std::string& replica() const = 0;

  // Checks a matrix's header (UploadMatrix, CreateUpload; messages name `field`.rows, ...):
  // its shape, label, device (*device_index: a Devices() index, or -1 when unset) and dtype.
  // INVALID_ARGUMENT naming the field.
  virtual absl::Status CheckMatrixHeader(const MatrixSpec& header, const std::string& field,
                                         int* device_index, ElementType* dtype) const = 0;
  // Takes `bytes` of `owner`'s resident quota into `quota` (given back when it is dropped
  // unused), or RESOURCE_EXHAUSTED naming the quota.
  virtual absl::Status ReserveMatrix(const std::string& owner, int64_t bytes,
                                     QuotaReservation* quota) = 0;
  // A device buffer of `bytes` for a matrix, on `device_index` (-1: the store picks), evicting
  // least recently used matrices first when LRU eviction is on; RESOURCE_EXHAUSTED when the
  // device budget is full. A device call: on an upload thread, never in a reaction.
  virtual absl::Status AllocateMatrixBuffer(int device_index, int64_t bytes,
                                            std::shared_ptr<ResidentBuffer>* buffer) = 0;
  // Registers a filled buffer as a matrix of `header` (rows, cols, ttl, label) of `dtype`
  // under the quota's owner; returns it. REQUIRES: quota.bytes() == buffer->bytes.
  virtual ResidentMatrix AddMatrix(QuotaReservation quota, const MatrixSpec& header,
                                   ElementType dtype, std::shared_ptr<ResidentBuffer> buffer) = 0;
  // CreateUpload of `owner`: checks the header (INVALID_ARGUMENT naming header.*), takes the
  // matrix's bytes of the owner's quota (RESOURCE_EXHAUSTED), allocates its buffer on an upload
  // thread (RESOURCE_EXHAUSTED: the device budget) and registers it with every byte missing,
  // `transient` or not. `done` runs inside this call when the request is refused before the
  // allocation, else on an upload thread.
  virtual void CreateUpload(const std::string& owner, const MatrixSpec& header, bool transient,
                            UploadCreated done) = 0;
  // Claims bytes [offset, offset + length) of `owner`'s upload `handle` for one part and gives
  // its buffer; EndPart ends the claim (see MatrixStore::BeginPart and EndPart for the errors).
  virtual absl::Status BeginPart(const std::string& owner, const std::string& handle,
                                 int64_t offset, int64_t length, const std::string& field,
                                 std::shared_ptr<ResidentBuffer>* buffer) = 0;
  virtual absl::Status EndPart(const std::string& owner, const std::string& handle, int64_t offset,
                               int64_t length, bool landed, int64_t* missing_bytes) = 0;
  // `owner`'s matrix `handle`, marked used: NOT_FOUND (unknown, released, expired, evicted, of
  // another replica or another owner) naming `field`.
  virtual absl::Status LookupMatrix(const std::string& owner, const std::string& handle,
                                    const std::string& field, ResidentMatrix* matrix) = 0;
  // Copies `bytes` of `buffer` from byte `offset` into host memory at `host`. A device copy:
  // on an upload thread, never in a reaction. REQUIRES: the range is inside the buffer.
  virtual absl::Status ReadMatrix(const ResidentBuffer& buffer, int64_t offset, int64_t bytes,
                                  void* host) = 0;
  // Drops `owner`'s matrix `handle` (its memory is freed once no running GEMM uses it) and says
  // how many bytes it held: NOT_FOUND as LookupMatrix; an `admin` releases any owner's.
  virtual absl::Status ReleaseMatrix(const std::string& owner, const std::string& handle,
                                     bool admin, int64_t* freed_bytes) = 0;
  // `owner`'s matrices (an `admin`'s: every owner's), its bytes and the quota.
  virtual MatrixList ListMatrices(const std::string& owner, bool admin) = 0;

  // ---- Shared-memory regions (every call: refused as CheckRegionsAllowed refuses)

  // Whether a call may use shared memory: FAILED_PRECONDITION when the server was started
  // without it, PERMISSION_DENIED when the call did not come `over_unix_socket`.
  virtual absl::Status CheckRegionsAllowed(bool over_unix_socket) const = 0;
  // Registers `spec` as a new region of `owner`, registered by `process`: the caller as the
  // kernel knows it (SO_PEERCRED), nullopt when its connection has no such word. Refused at
  // once, with `done` called inside this call: as CheckRegionsAllowed, then INVALID_ARGUMENT (a
  // byte_size past 2^63 - 1, or both a path and cuda_ipc), then PERMISSION_DENIED (a path
  // without `process`: only the caller's own files may be registered). Else the registration
  // (it maps and pins: slow) runs on an upload thread, which calls `done` with the answer of
  // RegionStore::Register or RegisterCudaIpc.
  virtual void RegisterRegion(const std::string& owner, bool over_unix_socket,
                              const RegionSpec& spec, std::optional<RegisteringProcess> process,
                              RegionRegistered done) = 0;
  // Unregisters `owner`'s region `handle`: NOT_FOUND (none of this owner's),
  // FAILED_PRECONDITION (GEMMs hold it).
  virtual absl::Status UnregisterRegion(const std::string& owner, bool over_unix_socket,
                                        const std::string& handle, int64_t* freed_bytes) = 0;
  virtual absl::Status ListRegions(const std::string& owner, bool over_unix_socket,
                                   RegionList* list) = 0;
  // A lease on `bytes` at `offset` of `owner`'s region `handle`, for the request's `field`
  // (see RegionStore::Acquire for the errors).
  virtual absl::Status LeaseRegion(const std::string& owner, bool over_unix_socket,
                                   const std::string& handle, uint64_t offset, int64_t bytes,
                                   const std::string& field, RegionLease* lease) = 0;
  // `bytes` at `offset` of `owner`'s region `handle`, as LeaseRegion leases them: a region of
  // host memory's bytes in place (*data holds the lease until it is dropped), a CUDA IPC
  // region's copied off its device (an error then names `field`).
  virtual absl::Status ReadRegion(const std::string& owner, bool over_unix_socket,
                                  const std::string& handle, uint64_t offset, int64_t bytes,
                                  const std::string& field, WireBytes* data) = 0;

  // ---- Shared by every call
  //
  // Two parts of the core are handed out whole, as their users call them many times per request
  // and a method for each of their calls would only forward it.

  // The upload threads: where sessions queue their device copies and allocations
  // (ArrivingBuffer, PartSession, downloads), never on an RPC thread.
  virtual UploadQueue& uploads() = 0;
  // Host buffers for results on their way out (a stream's C, a download), one pool for the
  // whole server so that its bound covers every call.
  virtual HostBufferPool& host_buffers() = 0;
};

// The core over a scheduler, backend, resident store and upload queue of the server's.
class GemmCore final : public GemmCoreInterface {
 public:
  // `scheduler`, `backend`, `store` and `uploads` are not owned and must outlive the core.
  GemmCore(Scheduler* scheduler, Backend* backend, MatrixStore* store, UploadQueue* uploads,
           GemmCoreOptions options);

  const RequestRules& rules() const override { return options_.rules; }
  absl::Status Admit(const std::string& owner, GemmOrder order, AdmittedGemm* admitted) override;
  absl::Status AllocateArriving(int device_index, int64_t bytes,
                                std::shared_ptr<ResidentBuffer>* buffer) override;
  absl::Status Run(AdmittedGemm admitted, GemmFinished done) override;

  std::string BackendName() const override;
  std::vector<DeviceDescription> Devices() const override;
  absl::Status FindDevice(int device_id, const std::string& field,
                          int* device_index) const override;
  Scheduler::Stats SchedulerStats() const override;

  int DeviceId(const ResidentMatrix& matrix) const override;
  const std::string& replica() const override { return options_.replica; }
  absl::Status CheckMatrixHeader(const MatrixSpec& header, const std::string& field,
                                 int* device_index, ElementType* dtype) const override;
  absl::Status ReserveMatrix(const std::string& owner, int64_t bytes,
                             QuotaReservation* quota) override;
  absl::Status AllocateMatrixBuffer(int device_index, int64_t bytes,
                                    std::shared_ptr<ResidentBuffer>* buffer) override;
  ResidentMatrix AddMatrix(QuotaReservation quota, const MatrixSpec& header, ElementType dtype,
                           std::shared_ptr<ResidentBuffer> buffer) override;
  void CreateUpload(const std::string& owner, const MatrixSpec& header, bool transient,
                    UploadCreated done) override;
  absl::Status BeginPart(const std::string& owner, const std::string& handle, int64_t offset,
                         int64_t length, const std::string& field,
                         std::shared_ptr<ResidentBuffer>* buffer) override;
  absl::Status EndPart(const std::string& owner, const std::string& handle, int64_t offset,
                       int64_t length, bool landed, int64_t* missing_bytes) override;
  absl::Status LookupMatrix(const std::string& owner, const std::string& handle,
                            const std::string& field, ResidentMatrix* matrix) override;
  absl::Status ReadMatrix(const ResidentBuffer& buffer, int64_t offset, int64_t bytes,
                          void* host) override;
  absl::Status ReleaseMatrix(const std::string& owner, const std::string& handle, bool admin,
                             int64_t* freed_bytes) override;
  MatrixList ListMatrices(const std::string& owner, bool admin) override;

  absl::Status CheckRegionsAllowed(bool over_unix_socket) const override;
  void RegisterRegion(const std::string& owner, bool over_unix_socket, const RegionSpec& spec,
                      std::optional<RegisteringProcess> process, RegionRegistered done) override;
  absl::Status UnregisterRegion(const std::string& owner, bool over_unix_socket,
                                const std::string& handle, int64_t* freed_bytes) override;
  absl::Status ListRegions(const std::string& owner, bool over_unix_socket,
                           RegionList* list) override;
  absl::Status LeaseRegion(const std::string& owner, bool over_unix_socket,
                           const std::string& handle, uint64_t offset, int64_t bytes,
                           const std::string& field, RegionLease* lease) override;
  absl::Status ReadRegion(const std::string& owner, bool over_unix_socket,
                          const std::string& handle, uint64_t offset, int64_t bytes,
                          const std::string& field, WireBytes* data) override;

  UploadQueue& uploads() override { return *uploads_; }
  HostBufferPool& host_buffers() override { return host_buffers_; }

  // For the server's metrics (not the transport's): every owner with regions, and the regions
  // the backend failed to pin (RegionStore::UsageByOwner, StagedRegions).
  std::vector<RegionStore::OwnerUsage> RegionUsageByOwner();
  int64_t StagedRegions();

 private:
  // The leases of `order`'s regions into `gemm`: its job's a, b, c_in and c point into regions
  // of host memory (job.pinned saying which the backend pinned); CUDA IPC regions become its
  // resident operands and c_device, and keep the job on their device (FAILED_PRECONDITION for
  // operands on another one).
  absl::Status AcquireRegions(const std::string& owner, const GemmOrder& order, AdmittedGemm* gemm);

  Scheduler* const scheduler_;
  Backend* const backend_;
  MatrixStore* const store_;
  UploadQueue* const uploads_;
  const GemmCoreOptions options_;
  const ResidentResolver resolver_;
  ClientPendingBudget client_pending_;
  HostBufferPool host_buffers_;
  RegionStore regions_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_GEMM_CORE_H_
