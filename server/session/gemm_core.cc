#include "server/session/gemm_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "server/core/status.h"

namespace hgemm {

absl::Status ClientPendingBudget::Charge(const std::string& owner, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_bytes_.find(owner);
  const int64_t held = it == pending_bytes_.end() ? 0 : it->second;
  if (bytes > max_bytes_per_client_ - held) {
    return status::OverLimit("max_client_pending_bytes", fmt::format(
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

GemmCore::GemmCore(Scheduler* scheduler, Backend* backend, MatrixStore* store,
                   UploadQueue* uploads, GemmCoreOptions options)
    : scheduler_(scheduler),
      backend_(backend),
      store_(store),
      uploads_(uploads),
      options_(std::move(options)),
      resolver_(store, scheduler),
      client_pending_(options_.max_client_pending_bytes),
      host_buffers_(options_.result_buffer_pool_bytes),
      regions_(options_.regions, backend) {}

absl::Status GemmCore::Admit(const std::string& owner, GemmOrder order,
                             AdmittedGemm* admitted) const {
  using Kind = OperandSource::Kind;
  AdmittedGemm gemm;
  gemm.owner_ = owner;
  gemm.job_ = std::move(order.job);
  GemmJob& job = gemm.job_;
  job.owner = RegionStore::Account(owner);
  // Before C's buffer is made: the size limits say whether it may be.
  if (absl::Status s = scheduler_->CheckSize(job.shape); !s.ok()) return s;
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
                                      AdmittedGemm* gemm) const {
  using Kind = OperandSource::Kind;
  const bool c_region = order.c.kind == ResultSink::Kind::kRegion;
  if (order.a.kind != Kind::kRegion && order.b.kind != Kind::kRegion &&
      order.c_in.kind != Kind::kRegion && !c_region) {
    return absl::OkStatus();
  }
  if (absl::Status s = regions_.CheckAllowed(order.over_unix_socket); !s.ok()) return s;
  GemmJob& job = gemm->job_;
  const int resident_device = job.device_index;  // of resident operands, or -1
  std::string ipc_field;                          // the first CUDA IPC region's field
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
                                        std::shared_ptr<ResidentBuffer>* buffer) const {
  // Through the store: with LRU eviction on, resident matrices make room for it as for an upload.
  absl::Status s = store_->AllocateBuffer(device_index, bytes, buffer);
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    // The GEMM fits the limits (CheckSize): the memory is taken by other work for now.
    return status::QueueFull("device memory is busy: " + status::Message(s));
  }
  return s;
}

absl::Status GemmCore::Run(AdmittedGemm admitted, GemmFinished done) const {
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

int GemmCore::DeviceId(const ResidentMatrix& matrix) const {
  return backend_->Devices()[matrix.buffer->device_index].id;
}

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

}  // namespace hgemm
