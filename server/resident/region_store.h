// RegionStore: the system shared-memory regions that same-host clients registered, by handle.
//
// A region is a memfd of the client, named by its path /proc/<client pid>/fd/<fd> (gRPC passes no
// file descriptors) and sealed against shrinking (memfd_create(MFD_ALLOW_SEALING), then
// fcntl(F_ADD_SEALS, F_SEAL_SHRINK)). Register refuses, before opening anything, a path whose pid
// is not the registering process's own (the kernel's word on the caller, checked through its pidfd
// so that a reused pid cannot pass: see Register), so that a caller can never make the server open
// another process's file. It then refuses (FAILED_PRECONDITION) a file that is not on tmpfs (a
// hugetlb memfd can lose a page under the mapping: SIGBUS), without F_SEAL_SHRINK, smaller than the
// size asked for, or with unallocated pages in that size (the server's first touch would allocate
// them, charged to the server: memory the client never paid for), and maps it: since the file can
// never become shorter than the mapping, no access inside it can raise SIGBUS, whatever the client
// does to its file afterwards (its ftruncate fails with EPERM).
//
// Regions belong to their owner (the caller's principal): another owner's handle is NOT_FOUND with
// the message of a handle that never existed. Quotas of regions and bytes are per account: the
// owner up to its first '/' ("uid:1000" for "uid:1000/id:alice", see server/auth/authenticator.h),
// so that naming oneself anew escapes no quota; all accounts' regions of host memory together are
// capped too (max_host_bytes: the server pins them, so this is memory locked by the server). A
// registration reserves its share before it maps anything, so that concurrent registrations cannot
// all pass one check. Offsets are multiples of kRegionAlignment. A GEMM holds a RegionLease on each
// region it reads or writes; while any lease is held, Unregister is refused (FAILED_PRECONDITION)
// and the mapping stays, so nothing is ever unmapped under a running copy. A region unused (no
// lease) for `ttl` is released: that is how the regions of a client that went away without
// unregistering are reclaimed. Every offset and size is checked in 64-bit arithmetic that cannot
// overflow.
//
// Register also pins the mapping with the backend (Backend::PinHostMemory: cudaHostRegister)
// so that GEMMs copy between it and the device by DMA, without staging; it is unpinned when the
// last holder of the mapping (the store or a lease) lets go, just before it is unmapped, so
// never under a running copy. When pinning fails (e.g. RLIMIT_MEMLOCK) the region still works
// through staged copies: the failure is logged and counted (StagedRegions).
//
// A CUDA IPC region (RegisterCudaIpc) is a client's device memory, opened by the backend
// (Backend::OpenIpcMemory) on its device; the same rules of owners, quotas, bounds, leases and
// expiry apply. It is off unless allow_cuda_ipc: the server cannot check what a handle names, and
// an exporter that frees its memory while a GEMM uses it can fault the device for every client, so
// only trusted clients may be let in (docs/same_host_security.md). Its leases hand out device
// buffers (RegionLease::device_view), never host pointers, and it is closed when the last holder
// lets go.
//
// No gRPC: the transport says whether the call came over a Unix socket (CheckAllowed).
// Thread safety: all methods are thread-safe. The store must outlive its leases.
#ifndef HGEMM_SERVER_RESIDENT_REGION_STORE_H_
#define HGEMM_SERVER_RESIDENT_REGION_STORE_H_

#include <absl/status/status.h>

#include <sys/types.h>

#include <chrono>
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

struct RegionStoreOptions {
  // Shared memory at all (--allow_shared_memory); off: every region call is refused.
  bool allow_shared_memory = false;
  // CUDA IPC regions (--allow_cuda_ipc): trusted clients only (see above).
  bool allow_cuda_ipc = false;
  // Regions, and their bytes, one account may have registered at once.
  int max_regions_per_owner = 64;
  int64_t max_bytes_per_owner = int64_t{64} << 30;
  // Bytes of host memory in all accounts' regions together (--max_region_bytes_total).
  int64_t max_host_bytes = int64_t{64} << 30;
  // A region no GEMM used for this long is released; 0: kept until unregistered.
  std::chrono::seconds ttl{0};
  // Pin each region of host memory for DMA (Backend::PinHostMemory); false: staged copies,
  // and no memory locked.
  bool pin_for_dma = true;
};

// What a region is, as listed.
struct RegionInfo {
  std::string handle;
  std::string owner;
  std::string label;
  int64_t bytes = 0;
  Clock::time_point created, last_used;
  std::chrono::seconds ttl{0};
  int64_t leases = 0;  // GEMMs using it now
  // Pinned by the backend: its copies to and from devices are DMA straight from its pages.
  bool dma = false;
  // The backend could have pinned it but failed (it copies through staging instead).
  bool dma_failed = false;
  // A CUDA IPC region: the Backend::Devices() index and id of the device it lives on.
  bool cuda_ipc = false;
  int device_index = -1;
  int device_id = -1;
};

class RegionStore;

// What a region's offsets must be multiples of: operands are used in place on the device (CUDA
// IPC) and copied by DMA, and the kernels' vector loads and stores want 16-byte alignment.
inline constexpr uint64_t kRegionAlignment = 16;

// The process registering a region, as the kernel knows the caller (its Unix connection).
struct RegisteringProcess {
  pid_t pid = 0;
  // True while that very process lives (a pidfd): once it has exited its pid may name another
  // process. Null when the kernel has no pidfds: then nothing can be registered.
  std::function<bool()> alive;
};

// A GEMM's hold on `bytes` of a region from `offset`: while it lives the region is neither
// unregistered nor expired, and its mapping stays. Move-only; empty when default-made.
// Thread safety: none of its own; the store must outlive it.
class RegionLease {
 public:
  RegionLease() = default;
  RegionLease(RegionLease&& other) noexcept { *this = std::move(other); }
  RegionLease& operator=(RegionLease&& other) noexcept;
  ~RegionLease() { Release(); }

  // The first byte leased, inside the mapping. REQUIRES: not empty, a region of host memory
  // (device_view() is null).
  uint8_t* data() const { return data_; }
  // A CUDA IPC region's leased bytes, as a buffer on its device (holding the region open);
  // null for a region of host memory.
  const std::shared_ptr<ResidentBuffer>& device_view() const { return device_view_; }
  // The region is pinned by the backend (RegionInfo::dma).
  bool pinned() const { return pinned_; }
  bool empty() const { return store_ == nullptr; }
  // Gives the hold back now (idempotent).
  void Release();

 private:
  friend class RegionStore;
  RegionStore* store_ = nullptr;
  std::shared_ptr<void> mapping_;  // keeps the mapping even past the store's entry
  std::string handle_;
  uint8_t* data_ = nullptr;
  bool pinned_ = false;
  std::shared_ptr<ResidentBuffer> device_view_;
};

class RegionStore {
 public:
  // `backend` (may be null: no pinning) pins each region (see above) and must outlive the
  // store and its leases.
  explicit RegionStore(RegionStoreOptions options, Backend* backend = nullptr);
  RegionStore(const RegionStore&) = delete;
  RegionStore& operator=(const RegionStore&) = delete;
  ~RegionStore();  // REQUIRES: no lease left

  // Whether a call may use shared memory: FAILED_PRECONDITION when the server was started
  // without --allow_shared_memory, PERMISSION_DENIED when `over_unix_socket` is false.
  absl::Status CheckAllowed(bool over_unix_socket) const;

  // Maps `bytes` of the file at `path` ("/proc/<pid>/fd/<fd>", <pid> the caller's) as a new
  // region of `owner`. Errors: INVALID_ARGUMENT (path or bytes malformed, not a regular file,
  // smaller than `bytes`), PERMISSION_DENIED (<pid> is not `caller`, `caller` has exited, or
  // the server may not open the file), FAILED_PRECONDITION (not a tmpfs memfd, not sealed
  // against shrinking, sealed against writing, holes within `bytes`; or no pidfds),
  // RESOURCE_EXHAUSTED (the account's quota, or max_host_bytes). Slow (maps and pins): call it
  // off the RPC threads. REQUIRES: CheckAllowed passed for the call.
  absl::Status Register(const std::string& owner, const RegisteringProcess& caller,
                        const std::string& path, int64_t bytes, const std::string& label,
                        RegionInfo* info);

  // Opens `bytes` of the device memory a client shares by CUDA IPC (`ipc_handle`, on the
  // device named `device`) as a new region of `owner`. Errors: those of
  // Backend::OpenIpcMemory (FAILED_PRECONDITION without the CUDA backend or for a device not
  // the server's; INVALID_ARGUMENT for a handle that does not open or a size past the
  // allocation), INVALID_ARGUMENT (bytes, label), RESOURCE_EXHAUSTED (the account's quota),
  // FAILED_PRECONDITION (without allow_cuda_ipc).
  // REQUIRES: CheckAllowed passed for the call.
  absl::Status RegisterCudaIpc(const std::string& owner, const std::string& ipc_handle,
                               const std::string& device, int64_t bytes, const std::string& label,
                               RegionInfo* info);

  // Unmaps `owner`'s region `handle`: NOT_FOUND (none of this owner's), FAILED_PRECONDITION
  // (GEMMs hold it: unregister once they are answered).
  absl::Status Unregister(const std::string& owner, const std::string& handle, int64_t* freed);

  // A lease on `bytes` at `offset` of `owner`'s region `handle`, for the request's `field`:
  // NOT_FOUND (no such region of this owner), INVALID_ARGUMENT (an offset that is not a
  // multiple of kRegionAlignment), OUT_OF_RANGE (offset + bytes past the region's end).
  // Whatever `lease` held before is given back first.
  absl::Status Acquire(const std::string& owner, const std::string& handle, uint64_t offset,
                       int64_t bytes, const std::string& field, RegionLease* lease);

  std::vector<RegionInfo> List(const std::string& owner);
  // The bytes of the regions of `owner`'s account (the quota's measure).
  int64_t OwnerBytes(const std::string& owner);
  // Whose quotas `owner` draws on: its name up to the first '/'.
  static std::string Account(const std::string& owner);
  // Every owner with regions: its regions and their bytes.
  struct OwnerUsage {
    std::string owner;
    int64_t regions = 0;
    int64_t bytes = 0;
  };
  std::vector<OwnerUsage> UsageByOwner();
  // Registered regions the backend failed to pin (RegionInfo::dma_failed).
  int64_t StagedRegions();
  const RegionStoreOptions& options() const { return options_; }

 private:
  friend class RegionLease;
  struct Entry {
    RegionInfo info;
    std::shared_ptr<void> mapping;  // unpins and munmap()s when the last holder goes
    uint8_t* base = nullptr;
    std::shared_ptr<ResidentBuffer> device_memory;  // a CUDA IPC region's (also `mapping`)
  };
  // A registration's share of its account's quota (and of max_host_bytes), held from before
  // it maps anything until it is a region or refused. Gives the share back on destruction.
  class Reservation;
  // Mappings to be let go once mu_ is released (unpinning and unmapping take a while, and
  // every GEMM's Acquire takes mu_).
  using Released = std::vector<std::shared_ptr<void>>;
  // Reserves one region of `bytes` for `owner`'s account, or RESOURCE_EXHAUSTED.
  absl::Status Reserve(const std::string& owner, int64_t bytes, bool host_memory,
                       std::unique_ptr<Reservation>* reservation);
  // Adds `entry` (its mapping made) as a region of `owner`, taking `reservation`'s place.
  void Add(const std::string& owner, const std::string& label, int64_t bytes, Entry entry,
           std::unique_ptr<Reservation> reservation, RegionInfo* info);
  // Checks `bytes` and `label` of a new region.
  static absl::Status CheckSizeAndLabel(int64_t bytes, const std::string& label);
  void Unlease(const std::string& handle);
  // RESOURCE_EXHAUSTED if `bytes` more in one more region would pass the quota of `account`,
  // or (`host_memory`) max_host_bytes. REQUIRES: mu_ held.
  absl::Status CheckQuotaLocked(const std::string& account, int64_t bytes, bool host_memory) const;
  // Drops regions idle past the ttl, their mappings into `released`. REQUIRES: mu_ held.
  void ExpireLocked(Clock::time_point now, Released* released);

  const RegionStoreOptions options_;
  Backend* const backend_;
  std::mutex mu_;
  std::map<std::string, Entry> regions_;  // guarded by mu_; by handle
  // Reserved and not yet added, guarded by mu_: per account {regions, bytes}, and host bytes.
  std::map<std::string, std::pair<int, int64_t>> reserved_;
  int64_t reserved_host_bytes_ = 0;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_RESIDENT_REGION_STORE_H_
