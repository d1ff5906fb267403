#include "server/session/gemm_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string_view>
#include <utility>

#include "server/core/status.h"

namespace hgemm {

absl::Status ClientPendingBudget::Charge(const std::string& owner, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_bytes_.find(owner);
  const int64_t held = it == pending_bytes_.end() ? 0 : it->second;
  if (bytes > max_bytes_per_client_ - held) {
    return status::OverLimit(
        "max_client_pending_bytes",
        fmt::format(
            "its operands ({} bytes) would put this client's incomplete streamed GEMMs over {} "
            "bytes (--max_client_pending_bytes; {} pending now)",
            bytes, max_bytes_per_client_, held));
  }
  pending_bytes_[owner] = held + bytes;
  return absl::OkStatus();
}

void ClientPendingBudget::Release(const std::string& owner, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_bytes_.find(owner);
  if (it != pending_bytes_.end() && (it->second -= bytes) <= 0) pending_bytes_.erase(it);
}

AdmittedGemm& AdmittedGemm::operator=(AdmittedGemm&& other) noexcept {
  if (this == &other) return *this;
  ReleasePending();
  owner_ = std::move(other.owner_);
  job_ = std::move(other.job_);
  arriving_bytes_ = other.arriving_bytes_;
  c_quota_ = std::move(other.c_quota_);
  c_ttl_seconds_ = other.c_ttl_seconds_;
  c_transient_ = other.c_transient_;
  transient_operands_ = std::move(other.transient_operands_);
  pending_budget_ = std::exchange(other.pending_budget_, nullptr);
  regions_ = std::move(other.regions_);
  return *this;
}

void AdmittedGemm::ReleasePending() {
  if (pending_budget_ != nullptr) {
    std::exchange(pending_budget_, nullptr)->Release(owner_, arriving_bytes_);
  }
}

GemmCore::GemmCore(Scheduler* scheduler, Backend* backend, MatrixStore* store, UploadQueue* uploads,
                   GemmCoreOptions options)
    : scheduler_(scheduler),
      backend_(backend),
      store_(store),
      uploads_(uploads),
      options_(std::move(options)),
      resolver_(store, scheduler),
      client_pending_(options_.max_client_pending_bytes),
      host_buffers_(options_.result_buffer_pool_bytes),
      regions_(options_.regions, backend) {}

absl::Status GemmCore::Admit(const std::string& owner, GemmOrder order, AdmittedGemm* admitted) {
  using Kind = OperandSource::Kind;
  AdmittedGemm gemm;
  gemm.owner_ = owner;
  gemm.job_ = std::move(order.job);
  GemmJob& job = gemm.job_;
  job.owner = RegionStore::Account(owner);
  // Before C's buffer is made: the size limits say whether it may be.
  if (absl::Status s =
          scheduler_->CheckSize(job.shape, {.a = order.a.kind == Kind::kResident,
                                            .b = order.b.kind == Kind::kResident,
                                            .c_in = order.c_in.kind == Kind::kResident});
      !s.ok()) {
    return s;
  }
  const bool keep_c = order.c.kind == ResultSink::Kind::kKeepResident;
  // Without beta, C_in is never read: whatever the order names for it is left alone.
  if (!job.shape.c_input) order.c_in = OperandSource::None();
  if (absl::Status s = resolver_.Resolve(
          owner,
          {.a_handle = order.a.kind == Kind::kResident ? order.a.handle : "",
           .b_handle = order.b.kind == Kind::kResident ? order.b.handle : "",
           .c_in_handle = order.c_in.kind == Kind::kResident ? order.c_in.handle : "",
           .c_handle = order.c.kind == ResultSink::Kind::kIntoResident ? order.c.region : "",
           .keep_c = keep_c},
          &job, &gemm.c_quota_, &gemm.transient_operands_);
      !s.ok()) {
    return s;
  }
  gemm.c_ttl_seconds_ = order.c.ttl_seconds;
  gemm.c_transient_ = order.c.transient;
  if (order.a.kind == Kind::kInline) job.a = order.a.data;
  if (order.b.kind == Kind::kInline) job.b = order.b.data;
  if (order.c_in.kind == Kind::kInline) job.c_in = order.c_in.data;
  if (absl::Status s = AcquireRegions(owner, order, &gemm); !s.ok()) return s;
  gemm.arriving_bytes_ = (order.a.kind == Kind::kArriving ? job.shape.ABytes() : 0) +
                         (order.b.kind == Kind::kArriving ? job.shape.BBytes() : 0) +
                         (order.c_in.kind == Kind::kArriving ? job.shape.CInBytes() : 0);
  if (gemm.arriving_bytes_ > 0) {
    if (absl::Status s = client_pending_.Charge(owner, gemm.arriving_bytes_); !s.ok()) return s;
    gemm.pending_budget_ = &client_pending_;
    resolver_.PlaceArriving(&job);
  }
  *admitted = std::move(gemm);
  return absl::OkStatus();
}

absl::Status GemmCore::AcquireRegions(const std::string& owner, const GemmOrder& order,
                                      AdmittedGemm* gemm) {
  using Kind = OperandSource::Kind;
  const bool c_region = order.c.kind == ResultSink::Kind::kRegion;
  if (order.a.kind != Kind::kRegion && order.b.kind != Kind::kRegion &&
      order.c_in.kind != Kind::kRegion && !c_region) {
    return absl::OkStatus();
  }
  if (absl::Status s = regions_.CheckAllowed(order.over_unix_socket); !s.ok()) return s;
  GemmJob& job = gemm->job_;
  const int resident_device = job.device_index;  // of resident operands, or -1
  std::string ipc_field;                         // the first CUDA IPC region's field
  // Leases `bytes` at `offset` of `region` for `field`: a region of host memory gives
  // `*host` (and whether it is pinned); a CUDA IPC region gives `*on_device`, and places the
  // GEMM on its device, refusing operands on another one.
  auto lease = [&](const std::string& region, uint64_t offset, int64_t bytes,
                   const std::string& field, void** host, bool* pinned,
                   std::shared_ptr<ResidentBuffer>* on_device) -> absl::Status {
    RegionLease taken;
    if (absl::Status s = regions_.Acquire(owner, region, offset, bytes, field, &taken); !s.ok()) {
      return s;
    }
    if (const std::shared_ptr<ResidentBuffer>& view = taken.device_view()) {
      const int device = view->device_index;
      if (job.device_index >= 0 && job.device_index != device) {
        const int other = job.device_index;
        const auto devices = backend_->Devices();
        return status::FailedPrecondition(fmt::format(
            "{}: the CUDA IPC region is on device {}, but {} is on device {}; a GEMM runs on "
            "one device and never copies a client's device memory to another",
            field, devices[device].id,
            ipc_field.empty() && resident_device >= 0 ? "a resident operand" : ipc_field,
            devices[other].id));
      }
      job.device_index = device;
      job.stay_on_device = true;
      if (ipc_field.empty()) ipc_field = field;
      *on_device = view;
    } else {
      *host = taken.data();
      *pinned = taken.pinned();
    }
    gemm->regions_.push_back(std::move(taken));
    return absl::OkStatus();
  };
  // The mapped bytes are used in place: the CPU backend reads and writes them, the CUDA one
  // copies from and to them, by DMA when it pinned the region (job.pinned); CUDA IPC memory is
  // read as a resident operand and C written into it, on its device.
  void* host = nullptr;
  if (order.a.kind == Kind::kRegion) {
    if (absl::Status s = lease(order.a.handle, order.a.offset, job.shape.ABytes(), "a_region",
                               &host, &job.pinned.a, &job.a_resident);
        !s.ok()) {
      return s;
    }
    job.a = static_cast<const uint16_t*>(host);
  }
  host = nullptr;
  if (order.b.kind == Kind::kRegion) {
    if (absl::Status s = lease(order.b.handle, order.b.offset, job.shape.BBytes(), "b_region",
                               &host, &job.pinned.b, &job.b_resident);
        !s.ok()) {
      return s;
    }
    job.b = static_cast<const uint16_t*>(host);
  }
  host = nullptr;
  if (order.c_in.kind == Kind::kRegion) {
    if (absl::Status s = lease(order.c_in.handle, order.c_in.offset, job.shape.CInBytes(),
                               "c_in_region", &host, &job.pinned.c_in, &job.c_in_resident);
        !s.ok()) {
      return s;
    }
    job.c_in = host;
  }
  host = nullptr;
  if (c_region) {
    if (absl::Status s = lease(order.c.region, order.c.offset, job.shape.CBytes(), "c_region",
                               &host, &job.pinned.c, &job.c_device);
        !s.ok()) {
      return s;
    }
    if (!job.c_device) job.c = host;
  }
  return absl::OkStatus();
}

absl::Status GemmCore::AllocateArriving(int device_index, int64_t bytes,
                                        std::shared_ptr<ResidentBuffer>* buffer) {
  // Through the store: with LRU eviction on, resident matrices make room for it as for an upload.
  absl::Status s = store_->AllocateBuffer(device_index, bytes, buffer);
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    // The GEMM fits the limits (CheckSize): the memory is taken by other work for now.
    return status::QueueFull("device memory is busy: " + status::Message(s));
  }
  return s;
}

absl::Status GemmCore::Run(AdmittedGemm admitted, GemmFinished done) {
  admitted.ReleasePending();  // its operands are all in
  const GemmShape shape = admitted.job_.shape;
  // Shared: the scheduler's callback must be copyable, and the quota is given back if the
  // scheduler refuses the job.
  auto c_quota = std::make_shared<QuotaReservation>(std::move(admitted.c_quota_));
  const uint32_t c_ttl = admitted.c_ttl_seconds_;
  const bool c_transient = admitted.c_transient_;
  std::string owner = admitted.owner_;
  std::vector<std::string> transient_operands = std::move(admitted.transient_operands_);
  auto regions = std::make_shared<std::vector<RegionLease>>(std::move(admitted.regions_));
  return scheduler_->Enqueue(
      std::move(admitted.job_),
      [this, shape, c_quota, c_ttl, c_transient, owner = std::move(owner),
       transient_operands = std::move(transient_operands), regions,
       done = std::move(done)](const absl::Status& status, const GemmReport& report) {
        GemmResult result{.report = report, .backend = backend_->Name()};
        absl::Status answer = status;
        try {
          if (status.ok() && report.c_resident) {
            result.kept_c = resolver_.KeepC(std::move(*c_quota), shape, report, c_ttl, c_transient);
          }
          for (const std::string& handle : transient_operands) {
            if (!status.ok()) break;  // kept for a retry (or the idle timeout)
            int64_t freed = 0;
            // Another GEMM that used it may have released it already: nothing to report.
            (void)store_->Release(owner, handle, &freed);
          }
        } catch (...) {
          answer = status::FromCurrentException("keeping C");
        }
        result.report.c_resident.reset();  // the store holds a kept C now
        // The backend is done with the regions: given back before the answer, so that a
        // client unregistering right after it finds them free.
        regions->clear();
        done(answer, std::move(result));
      });
}

std::string GemmCore::BackendName() const { return backend_->Name(); }

std::vector<DeviceDescription> GemmCore::Devices() const { return backend_->Devices(); }

absl::Status GemmCore::FindDevice(int device_id, const std::string& field,
                                  int* device_index) const {
  const std::vector<DeviceDescription> devices = backend_->Devices();
  auto it = std::find_if(devices.begin(), devices.end(),
                         [&](const DeviceDescription& d) { return d.id == device_id; });
  if (it == devices.end()) {
    return status::InvalidArgument(field, fmt::format("no device {} on this server", device_id));
  }
  *device_index = int(it - devices.begin());
  return absl::OkStatus();
}

Scheduler::Stats GemmCore::SchedulerStats() const { return scheduler_->GetStats(); }

int GemmCore::DeviceId(const ResidentMatrix& matrix) const {
  return backend_->Devices()[matrix.buffer->device_index].id;
}

absl::Status GemmCore::CheckMatrixHeader(const MatrixSpec& header, const std::string& field,
                                         int* device_index, ElementType* dtype) const {
  GemmShape shape;  // validate rows x cols as the m x k of a GEMM
  if (header.rows == 0) return status::InvalidArgument(field + ".rows", "must be at least 1");
  if (header.cols == 0) return status::InvalidArgument(field + ".cols", "must be at least 1");
  if (absl::Status s = ValidateShape(header.rows, 1, header.cols, options_.rules, &shape);
      !s.ok()) {
    return s;
  }
  if (header.label.size() > kMaxRequestIdBytes) {
    return status::InvalidArgument(field + ".label", "at most 128 bytes");
  }
  *device_index = -1;
  if (header.device_id) {
    if (absl::Status s = FindDevice(*header.device_id, field + ".device_id", device_index);
        !s.ok()) {
      return s;
    }
  }
  *dtype = header.dtype.value.value_or(ElementType::kFp16);
  if (!header.dtype.known || *dtype == ElementType::kFp32) {
    return status::InvalidArgument(
        field + ".dtype",
        fmt::format("enum value {} is not a type of a resident operand (DATA_TYPE_FP16 or "
                    "DATA_TYPE_BF16)",
                    header.dtype.number));
  }
  return absl::OkStatus();
}

absl::Status GemmCore::ReserveMatrix(const std::string& owner, int64_t bytes,
                                     QuotaReservation* quota) {
  return store_->Reserve(owner, bytes, quota);
}

absl::Status GemmCore::AllocateMatrixBuffer(int device_index, int64_t bytes,
                                            std::shared_ptr<ResidentBuffer>* buffer) {
  return store_->AllocateBuffer(device_index, bytes, buffer);
}

ResidentMatrix GemmCore::AddMatrix(QuotaReservation quota, const MatrixSpec& header,
                                   ElementType dtype, std::shared_ptr<ResidentBuffer> buffer) {
  return store_->Add(std::move(quota), header.rows, header.cols, dtype, std::move(buffer),
                     std::chrono::seconds(header.ttl_seconds), header.label);
}

void GemmCore::CreateUpload(const std::string& owner, const MatrixSpec& header, bool transient,
                            UploadCreated done) {
  int device_index = -1;
  ElementType dtype = ElementType::kFp16;
  if (absl::Status s = CheckMatrixHeader(header, "header", &device_index, &dtype); !s.ok()) {
    return done(s, {});
  }
  const int64_t bytes = MatrixBytes(header.rows, header.cols, dtype);
  auto quota = std::make_shared<QuotaReservation>();
  if (absl::Status s = store_->Reserve(owner, bytes, quota.get()); !s.ok()) return done(s, {});
  // The allocation is a device call (cudaMalloc): on an upload thread, never in a reaction.
  uploads_->Post([this, header, transient, device_index, dtype, bytes, quota,
                  done = std::move(done)] {
    std::shared_ptr<ResidentBuffer> buffer;
    absl::Status s;
    try {
      s = store_->AllocateBuffer(device_index, bytes, &buffer);
    } catch (...) {
      s = status::FromCurrentException("CreateUpload");
    }
    if (!s.ok()) return done(s, {});
    done(s, store_->AddUpload(std::move(*quota), header.rows, header.cols, dtype, std::move(buffer),
                              std::chrono::seconds(header.ttl_seconds), header.label, transient));
  });
}

absl::Status GemmCore::BeginPart(const std::string& owner, const std::string& handle,
                                 int64_t offset, int64_t length, const std::string& field,
                                 std::shared_ptr<ResidentBuffer>* buffer) {
  return store_->BeginPart(owner, handle, offset, length, field, buffer);
}

absl::Status GemmCore::EndPart(const std::string& owner, const std::string& handle, int64_t offset,
                               int64_t length, bool landed, int64_t* missing_bytes) {
  return store_->EndPart(owner, handle, offset, length, landed, missing_bytes);
}

absl::Status GemmCore::LookupMatrix(const std::string& owner, const std::string& handle,
                                    const std::string& field, ResidentMatrix* matrix) {
  return store_->Lookup(owner, handle, field, matrix);
}

absl::Status GemmCore::ReadMatrix(const ResidentBuffer& buffer, int64_t offset, int64_t bytes,
                                  void* host) {
  // The whole matrix in one copy where the backend has one for it.
  return bytes == buffer.bytes ? backend_->ReadResident(buffer, host)
                               : backend_->ReadResidentRange(buffer, offset, bytes, host);
}

absl::Status GemmCore::ReleaseMatrix(const std::string& owner, const std::string& handle,
                                     bool admin, int64_t* freed_bytes) {
  return store_->Release(owner, handle, freed_bytes, admin);
}

MatrixList GemmCore::ListMatrices(const std::string& owner, bool admin) {
  MatrixList list;
  list.matrices = admin ? store_->ListAll() : store_->List(owner);
  list.client_bytes = store_->ClientBytes(owner);
  list.quota_bytes = store_->options().quota_bytes_per_client;
  return list;
}

absl::Status GemmCore::CheckRegionsAllowed(bool over_unix_socket) const {
  return regions_.CheckAllowed(over_unix_socket);
}

void GemmCore::RegisterRegion(const std::string& owner, bool over_unix_socket,
                              const RegionSpec& spec, std::optional<RegisteringProcess> process,
                              RegionRegistered done) {
  absl::Status s = regions_.CheckAllowed(over_unix_socket);
  if (s.ok() && spec.byte_size > uint64_t(INT64_MAX)) {
    s = status::InvalidArgument("byte_size", "larger than 2^63 - 1");
  }
  if (s.ok() && spec.cuda_ipc && !spec.path.empty()) {
    s = status::InvalidArgument("path", "give either path or cuda_ipc, not both");
  }
  // Only the caller's own file descriptors may be registered: the kernel must say who it is.
  if (s.ok() && !spec.cuda_ipc && !process) {
    s = status::PermissionDenied(
        "this connection has no kernel credentials (SO_PEERCRED): register over a unix: "
        "listener of the server's own");
  }
  if (!s.ok()) return done(s, {});
  // Mapping and pinning a large region takes a while: not on an RPC thread.
  uploads_->Post([this, owner, spec, process = std::move(process), done = std::move(done)] {
    RegionInfo info;
    absl::Status s;
    try {
      s = spec.cuda_ipc
              ? regions_.RegisterCudaIpc(owner, spec.cuda_ipc->handle, spec.cuda_ipc->device,
                                         int64_t(spec.byte_size), spec.label, &info)
              : regions_.Register(owner, *process, spec.path, int64_t(spec.byte_size), spec.label,
                                  &info);
    } catch (...) {
      s = status::FromCurrentException("RegisterRegion");
    }
    done(s, info);
  });
}

absl::Status GemmCore::UnregisterRegion(const std::string& owner, bool over_unix_socket,
                                        const std::string& handle, int64_t* freed_bytes) {
  if (absl::Status s = regions_.CheckAllowed(over_unix_socket); !s.ok()) return s;
  return regions_.Unregister(owner, handle, freed_bytes);
}

absl::Status GemmCore::ListRegions(const std::string& owner, bool over_unix_socket,
                                   RegionList* list) {
  if (absl::Status s = regions_.CheckAllowed(over_unix_socket); !s.ok()) return s;
  list->regions = regions_.List(owner);
  list->owner_bytes = regions_.OwnerBytes(owner);
  list->quota_bytes = regions_.options().max_bytes_per_owner;
  list->quota_regions = regions_.options().max_regions_per_owner;
  return absl::OkStatus();
}

absl::Status GemmCore::LeaseRegion(const std::string& owner, bool over_unix_socket,
                                   const std::string& handle, uint64_t offset, int64_t bytes,
                                   const std::string& field, RegionLease* lease) {
  if (absl::Status s = regions_.CheckAllowed(over_unix_socket); !s.ok()) return s;
  return regions_.Acquire(owner, handle, offset, bytes, field, lease);
}

absl::Status GemmCore::ReadRegion(const std::string& owner, bool over_unix_socket,
                                  const std::string& handle, uint64_t offset, int64_t bytes,
                                  const std::string& field, WireBytes* data) {
  auto lease = std::make_shared<RegionLease>();
  if (absl::Status s =
          LeaseRegion(owner, over_unix_socket, handle, offset, bytes, field, lease.get());
      !s.ok()) {
    return s;
  }
  if (const std::shared_ptr<ResidentBuffer>& view = lease->device_view()) {
    // CUDA IPC memory: read off its device.
    std::string copy(size_t(bytes), '\0');
    if (absl::Status s = backend_->ReadResidentRange(*view, 0, bytes, copy.data()); !s.ok()) {
      return status::WithContext(field, s);
    }
    *data = WireBytes(std::move(copy));
  } else {
    // In place: the bytes travel with the lease, which holds the region until they are used.
    const std::string_view leased(reinterpret_cast<const char*>(lease->data()), size_t(bytes));
    *data = WireBytes({leased}, std::move(lease));
  }
  return absl::OkStatus();
}

std::vector<RegionStore::OwnerUsage> GemmCore::RegionUsageByOwner() {
  return regions_.UsageByOwner();
}

int64_t GemmCore::StagedRegions() { return regions_.StagedRegions(); }

}  // namespace hgemm
