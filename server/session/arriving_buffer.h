// ArrivingBuffer: a backend buffer whose bytes arrive in pieces (the streamed operands of a
// GemmStream GEMM, an UploadMatrix matrix). Where the bytes go is allocated on an upload
// thread, never in a reaction; pieces that arrive before it exists wait, the rest are handed to
// the upload queue as they come, so the bytes are (nearly) on the device when the last piece
// is in. Its owner hears exactly once how it settled: every byte landed, or why not.
//
// Thread safety: all methods are thread-safe. Ownership: held in a std::shared_ptr (the
// upload queue's work holds one until it has run).
#ifndef HGEMM_SERVER_SESSION_ARRIVING_BUFFER_H_
#define HGEMM_SERVER_SESSION_ARRIVING_BUFFER_H_

#include <absl/status/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/core/job.h"
#include "server/core/wire_bytes.h"
#include "server/scheduler/upload_queue.h"

namespace hgemm {

class ArrivingBuffer : public std::enable_shared_from_this<ArrivingBuffer> {
 public:
  // Runs on an upload thread: makes the buffer (of the bytes Start was given), or says why not.
  using Allocate = std::function<absl::Status(std::shared_ptr<ResidentBuffer>*)>;
  // Called exactly once: OK with the buffer holding every byte, or the first failure (the
  // allocation, a copy, or Drop's reason) and no buffer; `copy_ms` summed over the copies.
  // Runs on an upload thread, or inside Drop(): its caller must not hold a lock it takes.
  // After it, the ArrivingBuffer calls nothing of its owner.
  using Settled =
      std::function<void(const absl::Status&, std::shared_ptr<ResidentBuffer>, double copy_ms)>;

  // Posts the allocation of a buffer of `bytes` to `uploads`. Never settles inside Start.
  // REQUIRES: bytes > 0; `uploads` outlives the buffer.
  static std::shared_ptr<ArrivingBuffer> Start(UploadQueue* uploads, int64_t bytes,
                                               Allocate allocate, Settled settled);

  // `data` belongs at byte `offset`: copied when the buffer exists (dropped once the buffer
  // has failed or been dropped). REQUIRES: the pieces cover each byte of [0, bytes) once (the
  // caller's order rules check it).
  void Add(int64_t offset, WireBytes data);

  // Nothing more will be added: what was not copied yet is dropped, and the buffer settles
  // with `why` once the work in flight has landed (inside this call when none is). No effect
  // once it has settled or been dropped.
  void Drop(absl::Status why);

 private:
  ArrivingBuffer(UploadQueue* uploads, int64_t bytes, Settled settled)
      : uploads_(uploads), tally_(bytes), settled_(std::move(settled)) {}
  void Allocated(const absl::Status& s, std::shared_ptr<ResidentBuffer> buffer);
  void CopyLocked(int64_t offset, WireBytes data);
  void Copied(const absl::Status& s, int64_t bytes, double copy_ms);
  // Settles if nothing is outstanding; releases `lock` either way.
  void MaybeSettle(std::unique_lock<std::mutex>& lock);

  UploadQueue* const uploads_;
  std::mutex mu_;
  bool allocating_ = true;                            // guarded by mu_
  std::shared_ptr<ResidentBuffer> buffer_;            // guarded by mu_
  std::vector<std::pair<int64_t, WireBytes>> early_;  // guarded by mu_; before buffer_
  int64_t writes_in_flight_ = 0;                      // guarded by mu_
  // Bytes landed (or counted after a failure), the first failure (a copy, the allocation,
  // Drop's reason) and the copy time.
  WriteTally tally_;      // guarded by mu_
  bool dropped_ = false;  // guarded by mu_
  Settled settled_;       // guarded by mu_; empty once called
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_ARRIVING_BUFFER_H_
