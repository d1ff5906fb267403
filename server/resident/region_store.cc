#include "server/resident/region_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <utility>

#include <spdlog/spdlog.h>

#include "server/core/status.h"

namespace hgemm {
namespace {

// A file descriptor closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  const int fd_;
};

// True for "/proc/<digits>/fd/<digits>": the only files a client may name, so that it cannot
// make the server open anything but a file descriptor of a process.
bool IsProcFdPath(const std::string& path) {
  auto digits = [&](size_t from, size_t* end) {
    size_t i = from;
    while (i < path.size() && path[i] >= '0' && path[i] <= '9') ++i;
    *end = i;
    return i > from && i - from <= 10;
  };
  constexpr char kProc[] = "/proc/", kFd[] = "/fd/";
  if (path.rfind(kProc, 0) != 0) return false;
  size_t end = 0;
  if (!digits(sizeof(kProc) - 1, &end) || path.compare(end, sizeof(kFd) - 1, kFd) != 0)
    return false;
  return digits(end + sizeof(kFd) - 1, &end) && end == path.size();
}

std::string NewRegionHandle() {
  static std::mutex mu;
  static std::random_device entropy;
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("r-{:08x}{:08x}{:08x}{:08x}", entropy(), entropy(), entropy(), entropy());
}

absl::Status UnknownRegion(const std::string& handle) {
  return status::NotFound(
      fmt::format("region {} does not exist (never registered, unregistered, or expired after "
                  "--region_ttl_s without use)",
                  status::Quote(handle)));
}

// The pid of a path IsProcFdPath accepted.
pid_t PathPid(const std::string& path) {
  return pid_t(std::strtoll(path.c_str() + sizeof("/proc/") - 1, nullptr, 10));
}

}  // namespace

RegionLease& RegionLease::operator=(RegionLease&& other) noexcept {
  if (this != &other) {
    Release();
    store_ = std::exchange(other.store_, nullptr);
    mapping_ = std::move(other.mapping_);
    handle_ = std::move(other.handle_);
    data_ = std::exchange(other.data_, nullptr);
    pinned_ = std::exchange(other.pinned_, false);
    device_view_ = std::move(other.device_view_);
  }
  return *this;
}

void RegionLease::Release() {
  if (store_ == nullptr) return;
  std::exchange(store_, nullptr)->Unlease(handle_);
  mapping_.reset();
  data_ = nullptr;
  pinned_ = false;
  device_view_.reset();
}

RegionStore::RegionStore(RegionStoreOptions options, Backend* backend)
    : options_(std::move(options)), backend_(backend) {}

RegionStore::~RegionStore() = default;

absl::Status RegionStore::CheckAllowed(bool over_unix_socket) const {
  if (!options_.allow_shared_memory) {
    return status::FailedPrecondition(
        "shared memory is off on this server (start it with --allow_shared_memory)");
  }
  if (!over_unix_socket) {
    return status::PermissionDenied(
        "shared memory is accepted only on calls over the server's Unix socket (--listen="
        "unix:PATH), from the same host");
  }
  return absl::OkStatus();
}

class RegionStore::Reservation {
 public:
  Reservation(RegionStore* store, std::string account, int64_t bytes, bool host_memory)
      : store_(store), account_(std::move(account)), bytes_(bytes), host_memory_(host_memory) {}
  ~Reservation() {
    std::lock_guard<std::mutex> lock(store_->mu_);
    auto it = store_->reserved_.find(account_);
    if (--it->second.first == 0) {
      store_->reserved_.erase(it);
    } else {
      it->second.second -= bytes_;
    }
    if (host_memory_) store_->reserved_host_bytes_ -= bytes_;
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

 private:
  RegionStore* const store_;
  const std::string account_;
  const int64_t bytes_;
  const bool host_memory_;
};

std::string RegionStore::Account(const std::string& owner) {
  return owner.substr(0, owner.find('/'));
}

absl::Status RegionStore::Register(const std::string& owner, const RegisteringProcess& caller,
                                   const std::string& path, int64_t bytes, const std::string& label,
                                   RegionInfo* info) {
  if (!IsProcFdPath(path)) {
    return status::InvalidArgument(
        "path",
        fmt::format("{}: expected /proc/<pid>/fd/<fd> of a sealed memfd", status::Quote(path)));
  }
  if (absl::Status s = CheckSizeAndLabel(bytes, label); !s.ok()) return s;
  // Nothing is opened unless the path is the caller's own: otherwise the server would read or
  // write another process's memory for it, and its answers would tell which fds exist.
  if (PathPid(path) != caller.pid) {
    return status::PermissionDenied(fmt::format(
        "path {}: only the calling process's own file descriptors can be registered (the "
        "caller is pid {})",
        status::Quote(path), caller.pid));
  }
  if (!caller.alive) {
    return status::FailedPrecondition(
        "this kernel offers no pidfd for the caller (Linux 5.3 or newer is needed), so the "
        "server cannot tell its /proc/<pid> from a reused pid's");
  }
  // O_PATH first: no open side effects (a FIFO, a device) before the file is known to be a
  // regular one.
  Fd probe(open(path.c_str(), O_PATH | O_CLOEXEC));
  const int open_error = errno;
  // After the open: if the caller still lives, its pid was never reused, so the file opened
  // was the caller's.
  if (!caller.alive()) {
    return status::PermissionDenied(
        fmt::format("path {}: the calling process has exited", status::Quote(path)));
  }
  if (probe.get() < 0) {
    if (open_error == EACCES || open_error == EPERM) {
      return status::PermissionDenied(
          fmt::format("path {}: {}", status::Quote(path), strerror(open_error)));
    }
    return status::InvalidArgument(
        "path", fmt::format("{}: {}", status::Quote(path), strerror(open_error)));
  }
  struct stat st {};
  if (fstat(probe.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return status::InvalidArgument("path", fmt::format("{} is not a memfd", status::Quote(path)));
  }
  Fd fd(open(fmt::format("/proc/self/fd/{}", probe.get()).c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) {
    return status::PermissionDenied(
        fmt::format("path {}: cannot open it for reading and writing: {}", status::Quote(path),
                    strerror(errno)));
  }
  // tmpfs only: a hugetlbfs memfd can have a huge page freed under the mapping (a punched
  // hole), and the server's next touch of it would be SIGBUS; files on disk can fail I/O.
  struct statfs fs {};
  if (fstatfs(fd.get(), &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    return status::FailedPrecondition(fmt::format(
        "path {}: not a memfd on tmpfs (memfd_create without MFD_HUGETLB); hugetlb memfds and "
        "files on disk are refused",
        status::Quote(path)));
  }
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return status::FailedPrecondition(fmt::format(
        "path {}: the file is not sealed against shrinking (create it with memfd_create(..., "
        "MFD_ALLOW_SEALING), then fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK))",
        status::Quote(path)));
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return status::FailedPrecondition(
        fmt::format("path {}: the file is sealed against writing; C could not be written there",
                    status::Quote(path)));
  }
  // After the seal: the size can only grow from here.
  if (fstat(fd.get(), &st) != 0 || st.st_size < bytes) {
    return status::InvalidArgument(
        "byte_size", fmt::format("{} bytes, but the file has {}", bytes, int64_t(st.st_size)));
  }
  // Pages the client never allocated would be allocated by the server's pinning or reads, in
  // the server's memory: the client pays for its regions by allocating all of the file first
  // (st_blocks counts written and fallocate()d pages alike; SEEK_HOLE sees the latter as holes).
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t allocated = int64_t(st.st_blocks) * 512;
  if (allocated < (int64_t(st.st_size) + page - 1) / page * page) {
    return status::FailedPrecondition(
        fmt::format("path {}: only {} of its {} bytes are allocated (a sparse file): write them or "
                    "fallocate(fd, 0, 0, size) before registering",
                    status::Quote(path), allocated, int64_t(st.st_size)));
  }
  std::unique_ptr<Reservation> reservation;
  if (absl::Status s = Reserve(owner, bytes, /*host_memory=*/true, &reservation); !s.ok()) {
    return s;
  }
  // Mapped and pinned without mu_ (pinning a large region takes a while, and GEMMs acquire
  // leases under mu_), under the reservation.
  void* base = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    if (e == ENOMEM) {
      return status::OverLimit("host_memory",
                               fmt::format("mapping {} bytes: {}", bytes, strerror(e)));
    }
    return status::FailedPrecondition(
        fmt::format("path {}: cannot map it: {}", status::Quote(path), strerror(e)));
  }
  std::function<void()> unpin;
  absl::Status pinned = backend_ != nullptr && options_.pin_for_dma
                            ? backend_->PinHostMemory(base, bytes, &unpin)
                            : absl::UnimplementedError("not pinned");
  const bool dma_failed = !pinned.ok() && pinned.code() != absl::StatusCode::kUnimplemented;
  if (dma_failed) {
    spdlog::warn("region of {} bytes for {}: GEMMs copy through staging, not by DMA: {}", bytes,
                 owner, status::Message(pinned));
  }
  Entry entry;
  entry.base = static_cast<uint8_t*>(base);
  entry.mapping = std::shared_ptr<void>(base, [bytes, unpin = std::move(unpin)](void* p) {
    if (unpin) unpin();
    if (munmap(p, size_t(bytes)) != 0) {
      spdlog::error("munmap of a region of {} bytes: {}", bytes, strerror(errno));
    }
  });
  entry.info.dma = pinned.ok();
  entry.info.dma_failed = dma_failed;
  Add(owner, label, bytes, std::move(entry), std::move(reservation), info);
  return absl::OkStatus();
}

absl::Status RegionStore::RegisterCudaIpc(const std::string& owner, const std::string& ipc_handle,
                                          const std::string& device, int64_t bytes,
                                          const std::string& label, RegionInfo* info) {
  if (!options_.allow_cuda_ipc) {
    return status::FailedPrecondition(
        "CUDA IPC regions are off on this server (--allow_cuda_ipc: for trusted clients only, "
        "since the server cannot check what a handle names, see docs/same_host_security.md)");
  }
  if (absl::Status s = CheckSizeAndLabel(bytes, label); !s.ok()) return s;
  if (backend_ == nullptr) {
    return status::FailedPrecondition("CUDA IPC needs the CUDA backend (this server has none)");
  }
  std::unique_ptr<Reservation> reservation;
  if (absl::Status s = Reserve(owner, bytes, /*host_memory=*/false, &reservation); !s.ok()) {
    return s;
  }
  Entry entry;
  if (absl::Status s = backend_->OpenIpcMemory(ipc_handle, device, bytes, &entry.device_memory);
      !s.ok()) {
    return s;
  }
  entry.mapping = entry.device_memory;
  entry.base = static_cast<uint8_t*>(entry.device_memory->data);
  entry.info.cuda_ipc = true;
  entry.info.device_index = entry.device_memory->device_index;
  entry.info.device_id = backend_->Devices()[entry.info.device_index].id;
  Add(owner, label, bytes, std::move(entry), std::move(reservation), info);
  return absl::OkStatus();
}

absl::Status RegionStore::CheckSizeAndLabel(int64_t bytes, const std::string& label) {
  if (bytes <= 0) return status::InvalidArgument("byte_size", "must be at least 1");
  if (label.size() > 128) return status::InvalidArgument("label", "longer than 128 bytes");
  return absl::OkStatus();
}

absl::Status RegionStore::Reserve(const std::string& owner, int64_t bytes, bool host_memory,
                                  std::unique_ptr<Reservation>* reservation) {
  Released released;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Clock::now(), &released);
  const std::string account = Account(owner);
  if (absl::Status s = CheckQuotaLocked(account, bytes, host_memory); !s.ok()) return s;
  auto& [regions, held] = reserved_[account];
  ++regions;
  held += bytes;
  if (host_memory) reserved_host_bytes_ += bytes;
  *reservation = std::make_unique<Reservation>(this, account, bytes, host_memory);
  return absl::OkStatus();
}

void RegionStore::Add(const std::string& owner, const std::string& label, int64_t bytes,
                      Entry entry, std::unique_ptr<Reservation> reservation, RegionInfo* info) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    entry.info.handle = NewRegionHandle();
    entry.info.owner = owner;
    entry.info.label = label;
    entry.info.bytes = bytes;
    entry.info.created = entry.info.last_used = now;
    entry.info.ttl = options_.ttl;
    *info = entry.info;
    regions_.emplace(entry.info.handle, std::move(entry));
  }
  reservation.reset();  // the region counts in its place now (takes mu_)
}

absl::Status RegionStore::CheckQuotaLocked(const std::string& account, int64_t bytes,
                                           bool host_memory) const {
  int regions = 0;
  int64_t held = 0, host_bytes = reserved_host_bytes_;
  if (auto it = reserved_.find(account); it != reserved_.end()) {
    regions += it->second.first;
    held += it->second.second;
  }
  for (const auto& [handle, entry] : regions_) {
    if (!entry.info.cuda_ipc) host_bytes += entry.info.bytes;
    if (Account(entry.info.owner) != account) continue;
    ++regions;
    held += entry.info.bytes;
  }
  if (regions >= options_.max_regions_per_owner) {
    return status::OverLimit("max_regions_per_client",
                             fmt::format("this client has {} regions registered, the most it "
                                         "may (--max_regions_per_client)",
                                         regions));
  }
  if (bytes > options_.max_bytes_per_owner - held) {
    return status::OverLimit(
        "max_region_bytes_per_client",
        fmt::format(
            "{} more bytes would put this client's regions over {} (--max_region_bytes_per_client; "
            "{} registered)",
            bytes, options_.max_bytes_per_owner, held));
  }
  if (host_memory && bytes > options_.max_host_bytes - host_bytes) {
    return status::OverLimit(
        "max_region_bytes_total",
        fmt::format(
            "{} more bytes would put the regions of all clients over {} (--max_region_bytes_total; "
            "{} registered)",
            bytes, options_.max_host_bytes, host_bytes));
  }
  return absl::OkStatus();
}

absl::Status RegionStore::Unregister(const std::string& owner, const std::string& handle,
                                     int64_t* freed) {
  *freed = 0;
  Released released;  // unmapped after mu_ is released
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Clock::now(), &released);
  auto it = regions_.find(handle);
  if (it == regions_.end() || it->second.info.owner != owner) return UnknownRegion(handle);
  if (it->second.info.leases > 0) {
    return status::FailedPrecondition(
        fmt::format("region {} is in use by {} GEMM(s); unregister it once they are answered",
                    status::Quote(handle), it->second.info.leases));
  }
  *freed = it->second.info.bytes;
  released.push_back(std::move(it->second.mapping));
  regions_.erase(it);
  return absl::OkStatus();
}

absl::Status RegionStore::Acquire(const std::string& owner, const std::string& handle,
                                  uint64_t offset, int64_t bytes, const std::string& field,
                                  RegionLease* lease) {
  lease->Release();  // before mu_: giving a lease back takes it
  Released released;
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  ExpireLocked(now, &released);
  auto it = regions_.find(handle);
  if (it == regions_.end() || it->second.info.owner != owner) {
    return status::WithContext(field, UnknownRegion(handle));
  }
  Entry& entry = it->second;
  if (offset % kRegionAlignment != 0) {
    return status::InvalidArgument(
        field + ".offset",
        fmt::format("{} is not a multiple of {}: operands are used in place by DMA and the "
                    "kernels, which need {}-byte alignment",
                    offset, kRegionAlignment, kRegionAlignment));
  }
  // Neither side can overflow: both are at most the region's size (an int64_t > 0).
  const uint64_t size = uint64_t(entry.info.bytes);
  if (bytes < 0 || offset > size || uint64_t(bytes) > size - offset) {
    return status::OutOfRange(
        field, fmt::format("{} bytes at offset {} pass the end of region {} ({} bytes)", bytes,
                           offset, status::Quote(handle), size));
  }
  RegionLease taken;
  taken.store_ = this;
  taken.mapping_ = entry.mapping;
  taken.handle_ = handle;
  taken.data_ = entry.base + offset;
  taken.pinned_ = entry.info.dma;
  if (entry.device_memory) {
    // A view of the leased bytes that holds the region open.
    taken.device_view_ =
        std::make_shared<ResidentBuffer>(entry.info.device_index, bytes, entry.base + offset,
                                         [open = entry.device_memory](void*) {});
    taken.data_ = nullptr;  // device memory: no host pointer
  }
  ++entry.info.leases;
  entry.info.last_used = now;
  *lease = std::move(taken);
  return absl::OkStatus();
}

void RegionStore::Unlease(const std::string& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) return;
  --it->second.info.leases;
  it->second.info.last_used = Clock::now();
}

std::vector<RegionInfo> RegionStore::List(const std::string& owner) {
  Released released;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Clock::now(), &released);
  std::vector<RegionInfo> out;
  for (const auto& [handle, entry] : regions_) {
    if (entry.info.owner == owner) out.push_back(entry.info);
  }
  return out;
}

int64_t RegionStore::OwnerBytes(const std::string& owner) {
  Released released;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Clock::now(), &released);
  const std::string account = Account(owner);
  int64_t bytes = 0;
  for (const auto& [handle, entry] : regions_) {
    if (Account(entry.info.owner) == account) bytes += entry.info.bytes;
  }
  return bytes;
}

std::vector<RegionStore::OwnerUsage> RegionStore::UsageByOwner() {
  Released released;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Clock::now(), &released);
  std::map<std::string, OwnerUsage> by_owner;
  for (const auto& [handle, entry] : regions_) {
    OwnerUsage& usage = by_owner[entry.info.owner];
    usage.owner = entry.info.owner;
    ++usage.regions;
    usage.bytes += entry.info.bytes;
  }
  std::vector<OwnerUsage> out;
  for (auto& [owner, usage] : by_owner) out.push_back(std::move(usage));
  return out;
}

int64_t RegionStore::StagedRegions() {
  Released released;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Clock::now(), &released);
  int64_t staged = 0;
  for (const auto& [handle, entry] : regions_) staged += entry.info.dma_failed ? 1 : 0;
  return staged;
}

void RegionStore::ExpireLocked(Clock::time_point now, Released* released) {
  if (options_.ttl.count() <= 0) return;
  for (auto it = regions_.begin(); it != regions_.end();) {
    const RegionInfo& info = it->second.info;
    if (info.leases == 0 && now - info.last_used >= info.ttl) {
      released->push_back(std::move(it->second.mapping));  // no lease holds it
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace hgemm
