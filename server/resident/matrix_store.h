// MatrixStore: the resident matrices of all clients, by handle.
//
// Buffers come from the Backend (device memory on CUDA) and count against its per-device
// budget, which in-flight GEMMs share, and against a per-client quota. Entries expire after
// `ttl` without use; with LRU eviction on, an allocation that finds the device budget full
// frees the least recently used matrices (of any client) first. Lookups of a handle that is
// gone say why (released, expired, evicted), so clients know to upload again.
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

#include <grpcpp/support/status.h>

#include "server/backend/backend.h"

namespace hgemm {

struct MatrixStoreOptions {
  // Resident bytes one client (see ClientIdentity in the service) may hold.
  int64_t quota_bytes_per_client = int64_t{32} << 30;
  // Time to live after the last use, for matrices that ask for none; 0: no expiry.
  std::chrono::seconds default_ttl{0};
  // Full device budget: evict least recently used matrices instead of RESOURCE_EXHAUSTED.
  bool lru_eviction = false;
};

struct ResidentMatrix {
  std::string handle;
  std::string owner;
  uint32_t rows = 0, cols = 0;
  std::shared_ptr<ResidentBuffer> buffer;
  std::string label;
  Clock::time_point created, last_used;
  std::chrono::seconds ttl{0};  // 0: no expiry
};

class MatrixStore {
 public:
  // `backend` must outlive the store.
  MatrixStore(Backend* backend, const MatrixStoreOptions& options);

  // A buffer for a rows×cols fp16 matrix of `owner` on `device_index` (-1: the device with the
  // most free budget), after the quota check and, if enabled, LRU eviction.
  grpc::Status Allocate(const std::string& owner, int device_index, uint32_t rows, uint32_t cols,
                        std::shared_ptr<ResidentBuffer>* buffer);

  // Registers a filled buffer; returns the new entry. `ttl` 0 means the default.
  ResidentMatrix Add(const std::string& owner, uint32_t rows, uint32_t cols,
                     std::shared_ptr<ResidentBuffer> buffer, std::chrono::seconds ttl,
                     const std::string& label);

  // The matrix behind `handle`, marked used. NOT_FOUND (unknown, released, expired, evicted),
  // PERMISSION_DENIED (another client's). `field` names the request field in messages.
  grpc::Status Lookup(const std::string& owner, const std::string& handle, const std::string& field,
                      ResidentMatrix* matrix);

  // Drops the entry; its memory is freed once no running GEMM uses it.
  grpc::Status Release(const std::string& owner, const std::string& handle, int64_t* freed_bytes);

  std::vector<ResidentMatrix> List(const std::string& owner);
  int64_t ClientBytes(const std::string& owner);
  const MatrixStoreOptions& options() const { return options_; }

 private:
  void ExpireLocked(Clock::time_point now);
  void ForgetLocked(std::map<std::string, ResidentMatrix>::iterator it, const char* why);
  bool EvictOneLocked(int device_index);
  static std::string NewHandle();

  Backend* const backend_;
  const MatrixStoreOptions options_;
  std::mutex mu_;
  std::map<std::string, ResidentMatrix> matrices_;   // guarded by mu_
  std::map<std::string, int64_t> client_bytes_;      // guarded by mu_
  std::map<std::string, std::string> gone_;          // guarded by mu_; handle → why
  std::deque<std::string> gone_order_;               // guarded by mu_; bounds gone_
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_RESIDENT_MATRIX_STORE_H_
