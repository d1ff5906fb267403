#include "server/resident/matrix_store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <random>
#include <utility>

#include "proto/handle.h"
#include "server/core/status.h"

namespace hgemm {
namespace {

constexpr size_t kRememberedGoneHandles = 100000;

}  // namespace

MatrixStore::MatrixStore(Backend* backend, const MatrixStoreOptions& options)
    : backend_(backend), options_(options) {}

// Holds mu_; the buffers of the matrices forgotten meanwhile are let go only after mu_ is
// released, so that no lookup waits for a device free (a cudaFree, or the backend's cache).
class MatrixStore::StoreLock {
 public:
  explicit StoreLock(MatrixStore* store) : store_(store), lock_(store->mu_) {}
  ~StoreLock() {
    std::vector<std::shared_ptr<ResidentBuffer>> dropped;
    dropped.swap(store_->dropped_);
    lock_.unlock();
  }  // `dropped` goes here, without mu_

 private:
  MatrixStore* const store_;
  std::unique_lock<std::mutex> lock_;
};

absl::Status CheckByteRange(const ResidentMatrix& matrix, uint64_t offset, uint64_t length) {
  const uint64_t bytes = uint64_t(matrix.buffer->bytes);
  if (offset <= bytes && length <= bytes - offset) return absl::OkStatus();
  return status::OutOfRange("offset", fmt::format("bytes [{}, {} + {}) of a {}-byte matrix", offset,
                                                  offset, length, bytes));
}

std::string MatrixStore::NewHandle() const {
  static std::mutex mu;
  static std::random_device entropy;
  std::lock_guard<std::mutex> lock(mu);
  return MakeHandle(
      fmt::format("m-{:08x}{:08x}{:08x}{:08x}", entropy(), entropy(), entropy(), entropy()),
      options_.replica);
}

QuotaReservation& QuotaReservation::operator=(QuotaReservation&& other) noexcept {
  if (this != &other) {
    GiveBack();
    store_ = std::exchange(other.store_, nullptr);
    owner_ = std::move(other.owner_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

QuotaReservation::~QuotaReservation() { GiveBack(); }

void QuotaReservation::GiveBack() {
  if (store_ != nullptr) std::exchange(store_, nullptr)->Unreserve(owner_, bytes_);
}

absl::Status MatrixStore::Reserve(const std::string& owner, int64_t bytes,
                                  QuotaReservation* reservation) {
  StoreLock lock(this);
  ExpireLocked(Clock::now());
  auto it = client_bytes_.find(owner);
  const int64_t held = it == client_bytes_.end() ? 0 : it->second;
  if (bytes > options_.quota_bytes_per_client - held) {
    return status::OverLimit(
        "resident_quota_bytes",
        fmt::format("client {} holds {} resident bytes; {} more would pass its quota of {}",
                    status::Quote(owner), held, bytes, options_.quota_bytes_per_client));
  }
  client_bytes_[owner] = held + bytes;
  *reservation = QuotaReservation();
  reservation->store_ = this;
  reservation->owner_ = owner;
  reservation->bytes_ = bytes;
  return absl::OkStatus();
}

void MatrixStore::Unreserve(const std::string& owner, int64_t bytes) {
  StoreLock lock(this);
  UnchargeLocked(owner, bytes);
}

void MatrixStore::UnchargeLocked(const std::string& owner, int64_t bytes) {
  auto it = client_bytes_.find(owner);
  if (it == client_bytes_.end()) return;
  if ((it->second -= bytes) <= 0) client_bytes_.erase(it);
}

absl::Status MatrixStore::Allocate(const std::string& owner, int device_index, uint32_t rows,
                                   uint32_t cols, std::shared_ptr<ResidentBuffer>* buffer,
                                   QuotaReservation* reservation) {
  const int64_t bytes = MatrixBytes(rows, cols);
  QuotaReservation quota;
  if (absl::Status s = Reserve(owner, bytes, &quota); !s.ok()) return s;
  if (absl::Status s = AllocateBuffer(device_index, bytes, buffer); !s.ok()) return s;
  *reservation = std::move(quota);
  return absl::OkStatus();
}

absl::Status MatrixStore::AllocateBuffer(int device_index, int64_t bytes,
                                         std::shared_ptr<ResidentBuffer>* buffer) {
  if (device_index < 0) {  // the device with the least resident data
    StoreLock lock(this);
    std::vector<double> loads(backend_->Devices().size(), 0);
    for (const auto& [handle, m] : matrices_) loads[m.buffer->device_index] += m.buffer->bytes;
    device_index = int(std::min_element(loads.begin(), loads.end()) - loads.begin());
  }
  // The device allocation runs without mu_: cudaMalloc can take milliseconds, and other
  // clients' lookups must not wait for it.
  while (true) {
    absl::Status s = backend_->AllocateResident(device_index, bytes, buffer);
    if (s.ok()) return s;
    if (s.code() != absl::StatusCode::kResourceExhausted || !options_.lru_eviction) return s;
    StoreLock lock(this);
    if (!EvictOneLocked(device_index)) return s;
  }
}

ResidentMatrix MatrixStore::NewEntry(const std::string& owner, uint32_t rows, uint32_t cols,
                                     ElementType dtype, std::shared_ptr<ResidentBuffer> buffer,
                                     std::chrono::seconds ttl, const std::string& label,
                                     bool transient) const {
  ResidentMatrix m;
  m.handle = NewHandle();
  m.owner = owner;
  m.rows = rows;
  m.cols = cols;
  m.dtype = dtype;
  m.buffer = std::move(buffer);
  m.label = label;
  m.created = m.last_used = Clock::now();
  m.transient = transient;
  m.ttl = transient ? options_.upload_idle_timeout : ttl.count() > 0 ? ttl : options_.default_ttl;
  return m;
}

ResidentMatrix MatrixStore::Register(QuotaReservation reservation, const ResidentMatrix& m,
                                     const Parts* parts) {
  StoreLock lock(this);
  reservation.store_ = nullptr;  // its bytes now count for the matrix, until it is forgotten
  matrices_[m.handle] = m;
  if (parts != nullptr) parts_[m.handle] = *parts;
  spdlog::debug("resident {} {}x{} {} on device {} for {}{}", m.handle, m.rows, m.cols,
                ElementTypeName(m.dtype), m.buffer->device_index, status::Quote(m.owner),
                parts != nullptr ? " (an upload by parts)" : "");
  return m;
}

ResidentMatrix MatrixStore::Add(QuotaReservation reservation, uint32_t rows, uint32_t cols,
                                ElementType dtype, std::shared_ptr<ResidentBuffer> buffer,
                                std::chrono::seconds ttl, const std::string& label,
                                bool transient) {
  const ResidentMatrix m =
      NewEntry(reservation.owner(), rows, cols, dtype, std::move(buffer), ttl, label, transient);
  return Register(std::move(reservation), m, nullptr);
}

ResidentMatrix MatrixStore::AddUpload(QuotaReservation reservation, uint32_t rows, uint32_t cols,
                                      ElementType dtype, std::shared_ptr<ResidentBuffer> buffer,
                                      std::chrono::seconds ttl, const std::string& label,
                                      bool transient) {
  ResidentMatrix m =
      NewEntry(reservation.owner(), rows, cols, dtype, std::move(buffer), ttl, label, transient);
  const Parts parts{.ttl_when_complete = m.ttl};
  m.missing_bytes = m.buffer->bytes;
  m.ttl = options_.upload_idle_timeout;  // until complete
  return Register(std::move(reservation), m, &parts);
}

absl::Status MatrixStore::BeginPart(const std::string& owner, const std::string& handle,
                                    int64_t offset, int64_t length, const std::string& field,
                                    std::shared_ptr<ResidentBuffer>* buffer) {
  StoreLock lock(this);
  std::map<std::string, ResidentMatrix>::iterator it;
  if (absl::Status s = FindLocked(owner, handle, field + ".handle", false, &it); !s.ok()) return s;
  auto parts = parts_.find(handle);
  if (parts == parts_.end()) {
    return status::NotFound(fmt::format("{}.handle: matrix {} is complete: it takes no more parts",
                                        field, status::Quote(handle)));
  }
  const int64_t bytes = it->second.buffer->bytes;
  if (length <= 0) return status::InvalidArgument(field + ".length", "must be at least 1");
  if (offset < 0 || offset > bytes || length > bytes - offset) {
    return status::InvalidArgument(
        field, fmt::format("bytes [{}, {} + {}) go past the end of the {}-byte matrix", offset,
                           offset, length, bytes));
  }
  std::map<int64_t, int64_t>& claimed = parts->second.claimed;
  auto next = claimed.lower_bound(offset);  // the first part at or after `offset`
  const bool overlaps_next = next != claimed.end() && next->first < offset + length;
  const bool overlaps_previous = next != claimed.begin() && std::prev(next)->second > offset;
  if (overlaps_next || overlaps_previous) {
    const auto& [other_offset, other_end] = overlaps_next ? *next : *std::prev(next);
    return status::InvalidArgument(
        field, fmt::format("bytes [{}, {}) overlap the part [{}, {}) sent before", offset,
                           offset + length, other_offset, other_end));
  }
  if (int64_t(claimed.size()) >= options_.max_parts_per_upload) {
    return status::OverLimit("max_parts_per_upload",
                             fmt::format("{}: matrix {} has taken its {} parts", field,
                                         status::Quote(handle), options_.max_parts_per_upload));
  }
  claimed.emplace(offset, offset + length);
  it->second.last_used = Clock::now();
  *buffer = it->second.buffer;
  return absl::OkStatus();
}

absl::Status MatrixStore::EndPart(const std::string& owner, const std::string& handle,
                                  int64_t offset, int64_t length, bool landed,
                                  int64_t* missing_bytes) {
  StoreLock lock(this);
  std::map<std::string, ResidentMatrix>::iterator it;
  if (absl::Status s = FindLocked(owner, handle, "header.handle", false, &it); !s.ok()) return s;
  auto parts = parts_.find(handle);
  if (parts == parts_.end()) return absl::OkStatus();  // not one of its claims: nothing to do
  ResidentMatrix& m = it->second;
  m.last_used = Clock::now();
  if (!landed) {
    parts->second.claimed.erase(offset);
  } else if ((m.missing_bytes -= length) == 0) {
    m.ttl = m.transient ? options_.upload_idle_timeout : parts->second.ttl_when_complete;
    parts_.erase(parts);
  }
  *missing_bytes = m.missing_bytes;
  return absl::OkStatus();
}

absl::Status MatrixStore::FindLocked(const std::string& owner, const std::string& handle,
                                     const std::string& field, bool any_owner,
                                     std::map<std::string, ResidentMatrix>::iterator* found) {
  ExpireLocked(Clock::now());
  auto it = matrices_.find(handle);
  if (it != matrices_.end() && (any_owner || it->second.owner == owner)) {
    *found = it;
    return absl::OkStatus();
  }
  if (const std::string_view replica = HandleReplica(handle);
      it == matrices_.end() && !replica.empty() && replica != options_.replica) {
    // A client that does not route (grpcurl, an old client) sent it to the wrong replica.
    return status::NotFound(
        fmt::format("{}: matrix {} lives on replica {}, not on this one ({}); send calls naming "
                    "it there",
                    field, status::Quote(handle), status::Quote(replica),
                    options_.replica.empty() ? "which advertises no address"
                                             : status::Quote(options_.replica)));
  }
  // Why a handle is gone is told only to its owner: to anyone else it never existed.
  auto gone = gone_.find(handle);
  const bool told = gone != gone_.end() && (any_owner || gone->second.owner == owner);
  return status::NotFound(fmt::format("{}: matrix {} {}; upload it again", field,
                                      status::Quote(handle),
                                      told ? gone->second.why : "does not exist"));
}

absl::Status MatrixStore::Lookup(const std::string& owner, const std::string& handle,
                                 const std::string& field, ResidentMatrix* matrix) {
  StoreLock lock(this);
  std::map<std::string, ResidentMatrix>::iterator it;
  if (absl::Status s = FindLocked(owner, handle, field, false, &it); !s.ok()) return s;
  if (it->second.missing_bytes > 0) {
    return status::FailedPrecondition(fmt::format(
        "{}: matrix {} is an upload still missing {} of its {} bytes; send its remaining parts "
        "first",
        field, status::Quote(handle), it->second.missing_bytes, it->second.buffer->bytes));
  }
  it->second.last_used = Clock::now();
  *matrix = it->second;
  return absl::OkStatus();
}

absl::Status MatrixStore::Release(const std::string& owner, const std::string& handle,
                                  int64_t* freed_bytes, bool any_owner) {
  StoreLock lock(this);
  std::map<std::string, ResidentMatrix>::iterator it;
  if (absl::Status s = FindLocked(owner, handle, "handle", any_owner, &it); !s.ok()) return s;
  *freed_bytes = it->second.buffer->bytes;
  ForgetLocked(it, "was released");
  return absl::OkStatus();
}

std::vector<ResidentMatrix> MatrixStore::List(const std::string& owner) {
  StoreLock lock(this);
  ExpireLocked(Clock::now());
  std::vector<ResidentMatrix> out;
  for (const auto& [handle, m] : matrices_) {
    if (m.owner == owner) out.push_back(m);
  }
  return out;
}

std::vector<ResidentMatrix> MatrixStore::ListAll() {
  StoreLock lock(this);
  ExpireLocked(Clock::now());
  std::vector<ResidentMatrix> out;
  for (const auto& [handle, m] : matrices_) out.push_back(m);
  return out;
}

int64_t MatrixStore::ClientBytes(const std::string& owner) {
  StoreLock lock(this);
  ExpireLocked(Clock::now());
  auto it = client_bytes_.find(owner);
  return it == client_bytes_.end() ? 0 : it->second;
}

std::vector<MatrixStore::DeviceUsage> MatrixStore::UsageByDevice() {
  std::vector<DeviceUsage> usage(backend_->Devices().size());
  StoreLock lock(this);
  ExpireLocked(Clock::now());
  for (const auto& [handle, m] : matrices_) {
    const int device = m.buffer->device_index;
    if (device < 0 || device >= int(usage.size())) continue;
    usage[device].bytes += m.buffer->bytes;
    usage[device].matrices++;
  }
  return usage;
}

void MatrixStore::ExpireLocked(Clock::time_point now) {
  for (auto it = matrices_.begin(); it != matrices_.end();) {
    auto next = std::next(it);
    const ResidentMatrix& m = it->second;
    if (m.ttl.count() > 0 && now - m.last_used > m.ttl) {
      ForgetLocked(it, m.missing_bytes > 0 ? "was an upload that got no part in time (dropped)"
                       : m.transient       ? "was transient and unused (dropped)"
                                           : "expired (time to live)");
    }
    it = next;
  }
}

bool MatrixStore::EvictOneLocked(int device_index) {
  auto victim = matrices_.end();
  for (auto it = matrices_.begin(); it != matrices_.end(); ++it) {
    if (it->second.buffer->device_index != device_index) continue;
    if (victim == matrices_.end() || it->second.last_used < victim->second.last_used) victim = it;
  }
  if (victim == matrices_.end()) return false;
  spdlog::info("evicting resident matrix {} ({} bytes) of {}", victim->first,
               victim->second.buffer->bytes, status::Quote(victim->second.owner));
  ForgetLocked(victim, "was evicted (device memory full)");
  return true;
}

void MatrixStore::ForgetLocked(std::map<std::string, ResidentMatrix>::iterator it,
                               const char* why) {
  UnchargeLocked(it->second.owner, it->second.buffer->bytes);
  parts_.erase(it->first);
  dropped_.push_back(std::move(it->second.buffer));
  gone_[it->first] = Gone{it->second.owner, why};
  gone_order_.push_back(it->first);
  if (gone_order_.size() > kRememberedGoneHandles) {
    gone_.erase(gone_order_.front());
    gone_order_.pop_front();
  }
  matrices_.erase(it);
}

}  // namespace hgemm
