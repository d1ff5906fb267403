// MatrixStore: the resident matrices of all clients, by handle.
//
// Buffers come from the Backend (device memory on CUDA) and count against its per-device
// budget, which in-flight GEMMs share, and against a per-client quota. Entries expire after
// `ttl` without use; with LRU eviction on, an allocation that finds the device budget full
// frees the least recently used matrices (of any client) first. Lookups of a handle that is
// gone say why (released, expired, evicted), so clients know to upload again. Another owner's
// handle is NOT_FOUND with the message of a handle that never existed: no client learns that
// someone else's matrix exists.
//
// Uploads by parts (CreateUpload / UploadPart): AddUpload registers a matrix whose bytes are
// all missing; each part claims a disjoint byte range (BeginPart) and counts once its bytes
// have landed (EndPart). Until every byte is in, Lookup refuses the matrix
// (FAILED_PRECONDITION, saying how many bytes are missing) and it expires after
// `upload_idle_timeout` without a part. A transient matrix (an upload's, or a kept C) also
// expires after `upload_idle_timeout` unused; the first GEMM that uses one releases it (the
// caller does, see GemmCore).
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_RESIDENT_MATRIX_STORE_H_
#define HGEMM_SERVER_RESIDENT_MATRIX_STORE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <absl/status/status.h>

#include "server/backend/backend.h"

namespace hgemm {

struct MatrixStoreOptions {
  // Resident bytes one client (see ClientIdentity in the service) may hold.
  int64_t quota_bytes_per_client = int64_t{32} << 30;
  // Time to live after the last use, for matrices that ask for none; 0: no expiry.
  std::chrono::seconds default_ttl{0};
  // Full device budget: evict least recently used matrices instead of RESOURCE_EXHAUSTED.
  bool lru_eviction = false;
  // This replica's address (--advertise_address), appended to every handle (proto/handle.h);
  // empty: one server, handles name no replica.
  std::string replica;
  // An upload by parts that gets no part this long, or a transient matrix unused this long,
  // is released.
  std::chrono::seconds upload_idle_timeout{60};
  // Parts one upload may take (BeginPart calls that were not given back).
  int max_parts_per_upload = 1024;
};

struct ResidentMatrix {
  std::string handle;
  std::string owner;
  uint32_t rows = 0, cols = 0;
  ElementType dtype = ElementType::kFp16;  // of its elements
  std::shared_ptr<ResidentBuffer> buffer;
  std::string label;
  Clock::time_point created, last_used;
  std::chrono::seconds ttl{0};  // 0: no expiry
  int64_t missing_bytes = 0;    // an upload by parts: bytes not landed yet
  bool transient = false;       // released by the first GEMM that uses it
};

// Whether bytes [offset, offset + length) lie inside `matrix`: OK, or OUT_OF_RANGE naming the
// field "offset" (a read of a range: DownloadMatrix, a bulk GET). Length 0 is the empty range.
absl::Status CheckByteRange(const ResidentMatrix& matrix, uint64_t offset, uint64_t length);

class MatrixStore;

// Bytes of a client's quota taken for a matrix that does not exist yet (an upload in progress,
// a kept C not yet computed), so that concurrent admissions can't both pass the quota. Given
// back on destruction unless MatrixStore::Add took it over.
// Thread safety: none of its own; the store it points into must outlive it.
class QuotaReservation {
 public:
  QuotaReservation() = default;
  QuotaReservation(QuotaReservation&& other) noexcept { *this = std::move(other); }
  QuotaReservation& operator=(QuotaReservation&& other) noexcept;
  ~QuotaReservation();

  const std::string& owner() const { return owner_; }
  int64_t bytes() const { return bytes_; }

 private:
  friend class MatrixStore;
  void GiveBack();

  MatrixStore* store_ = nullptr;  // null: nothing reserved
  std::string owner_;
  int64_t bytes_ = 0;
};

class MatrixStore {
 public:
  // `backend` must outlive the store.
  MatrixStore(Backend* backend, const MatrixStoreOptions& options);

  // Takes `bytes` of `owner`'s quota, or RESOURCE_EXHAUSTED naming the quota.
  absl::Status Reserve(const std::string& owner, int64_t bytes, QuotaReservation* reservation);

  // Reserve(), then AllocateBuffer() for a rows×cols fp16 matrix.
  // REQUIRES: MatrixElements(rows, cols) ≤ kMaxElementsPerMatrix.
  absl::Status Allocate(const std::string& owner, int device_index, uint32_t rows, uint32_t cols,
                        std::shared_ptr<ResidentBuffer>* buffer, QuotaReservation* reservation);

  // A buffer of `bytes` on `device_index` (-1: the device with the least resident data),
  // evicting least recently used matrices first if enabled and needed; RESOURCE_EXHAUSTED when
  // the device budget is full. A device call (cudaMalloc): the transport runs it on an upload
  // thread, never in a reaction. The store's lock is not held across it.
  absl::Status AllocateBuffer(int device_index, int64_t bytes,
                              std::shared_ptr<ResidentBuffer>* buffer);

  // Registers a filled buffer under the reservation's owner, which it now counts against;
  // returns the new entry. `ttl` 0 means the default. REQUIRES: reservation.bytes() ==
  // buffer->bytes.
  // `transient`: the matrix expires after upload_idle_timeout unused instead of `ttl`.
  ResidentMatrix Add(QuotaReservation reservation, uint32_t rows, uint32_t cols, ElementType dtype,
                     std::shared_ptr<ResidentBuffer> buffer, std::chrono::seconds ttl,
                     const std::string& label, bool transient = false);

  // As Add, for an upload by parts: every byte of `buffer` is missing until parts fill it.
  // `ttl` applies once it is complete. REQUIRES: reservation.bytes() == buffer->bytes.
  ResidentMatrix AddUpload(QuotaReservation reservation, uint32_t rows, uint32_t cols,
                           ElementType dtype, std::shared_ptr<ResidentBuffer> buffer,
                           std::chrono::seconds ttl, const std::string& label, bool transient);

  // Claims bytes [offset, offset + length) of `owner`'s upload `handle` for one part and
  // returns its buffer. Errors: NOT_FOUND (as Lookup, or the upload is complete),
  // INVALID_ARGUMENT (length 0, past the end, overlapping a part claimed before),
  // RESOURCE_EXHAUSTED (max_parts_per_upload). Messages name `field`.
  absl::Status BeginPart(const std::string& owner, const std::string& handle, int64_t offset,
                         int64_t length, const std::string& field,
                         std::shared_ptr<ResidentBuffer>* buffer);
  // The part BeginPart claimed is over: `landed` (every byte written) counts its bytes, else
  // its range and its place among the parts are free again. *missing_bytes: the upload's bytes
  // still missing. NOT_FOUND when the upload went meanwhile (released, expired).
  absl::Status EndPart(const std::string& owner, const std::string& handle, int64_t offset,
                       int64_t length, bool landed, int64_t* missing_bytes);

  // The matrix behind `handle`, marked used. NOT_FOUND (unknown, released, expired, evicted,
  // named for another replica, or another owner's). `field` names the request field in messages.
  absl::Status Lookup(const std::string& owner, const std::string& handle, const std::string& field,
                      ResidentMatrix* matrix);

  // Drops the entry; its memory is freed once no running GEMM uses it. NOT_FOUND as Lookup;
  // with `any_owner` (an administrator) another owner's matrix is released too.
  absl::Status Release(const std::string& owner, const std::string& handle, int64_t* freed_bytes,
                       bool any_owner = false);

  std::vector<ResidentMatrix> List(const std::string& owner);
  std::vector<ResidentMatrix> ListAll();  // every owner's
  int64_t ClientBytes(const std::string& owner);

  // Resident matrices (expired ones dropped first) and their bytes, by device index
  // (Backend::Devices()); one entry per device.
  struct DeviceUsage {
    int64_t bytes = 0;
    int64_t matrices = 0;
  };
  std::vector<DeviceUsage> UsageByDevice();
  const MatrixStoreOptions& options() const { return options_; }

 private:
  friend class QuotaReservation;
  class StoreLock;
  void Unreserve(const std::string& owner, int64_t bytes);
  void ExpireLocked(Clock::time_point now);
  void UnchargeLocked(const std::string& owner, int64_t bytes);
  void ForgetLocked(std::map<std::string, ResidentMatrix>::iterator it, const char* why);
  bool EvictOneLocked(int device_index);
  std::string NewHandle() const;
  struct Parts;
  // A new entry (not registered yet) with its handle, times and time to live.
  ResidentMatrix NewEntry(const std::string& owner, uint32_t rows, uint32_t cols, ElementType dtype,
                          std::shared_ptr<ResidentBuffer> buffer, std::chrono::seconds ttl,
                          const std::string& label, bool transient) const;
  // Registers `m` under the reservation, with the books of an upload by parts if `parts`.
  ResidentMatrix Register(QuotaReservation reservation, const ResidentMatrix& m,
                          const Parts* parts);

  Backend* const backend_;
  const MatrixStoreOptions options_;
  std::mutex mu_;
  std::map<std::string, ResidentMatrix> matrices_;  // guarded by mu_
  // The books of uploads by parts still incomplete, by handle.
  struct Parts {
    std::map<int64_t, int64_t> claimed;  // offset → end of each part claimed or landed
    std::chrono::seconds ttl_when_complete{0};
  };
  std::map<std::string, Parts> parts_;  // guarded by mu_
  // Resident and reserved bytes by owner; owners holding none have no entry.
  std::map<std::string, int64_t> client_bytes_;  // guarded by mu_
  struct Gone {
    std::string owner;
    const char* why;
  };
  // The matrix of `handle`, if `owner` (or, with any_owner, anyone) may see it; else NOT_FOUND.
  absl::Status FindLocked(const std::string& owner, const std::string& handle,
                          const std::string& field, bool any_owner,
                          std::map<std::string, ResidentMatrix>::iterator* found);
  std::map<std::string, Gone> gone_;    // guarded by mu_; handle →
  std::deque<std::string> gone_order_;  // guarded by mu_; bounds gone_
  // Buffers of forgotten matrices, freed once mu_ is released (StoreLock).
  std::vector<std::shared_ptr<ResidentBuffer>> dropped_;  // guarded by mu_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_RESIDENT_MATRIX_STORE_H_
