// UploadQueue: copies bytes that arrived over the network into backend buffers on a few worker
// threads, so that no gRPC reaction waits for a device copy. Streamed GEMM operands and
// UploadMatrix go through it chunk by chunk as the chunks arrive: when the last chunk is in,
// the matrix is (nearly) on the device already. The other device work of the transport
// (allocating where operands go, reading a matrix back for a download) runs here too (Post).
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_SCHEDULER_UPLOAD_QUEUE_H_
#define HGEMM_SERVER_SCHEDULER_UPLOAD_QUEUE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/backend/backend.h"
#include "server/core/wire_bytes.h"

namespace hgemm {

// Called once per write, on an upload thread, with how long the copy took.
using WriteDone = std::function<void(const absl::Status&, double copy_ms)>;

class UploadQueue {
 public:
  // `backend` must outlive the queue.
  UploadQueue(Backend* backend, int threads);
  ~UploadQueue();  // finishes every queued write, then joins
  UploadQueue(const UploadQueue&) = delete;
  UploadQueue& operator=(const UploadQueue&) = delete;

  // Copies `data` (piece by piece) to `offset` in `buffer`, later, then calls `done`. Never
  // calls it inline. REQUIRES: offset + data.size() <= buffer->bytes.
  void Write(std::shared_ptr<ResidentBuffer> buffer, int64_t offset, WireBytes data,
             WriteDone done);

  // Runs `work` later on an upload thread, in order with the writes and work posted before it
  // (taken in FIFO order; several threads run them). Never inline. An exception `work` throws
  // is logged and dropped: `work` must answer its own failures.
  void Post(std::function<void()> work);

  // Writes and work queued and not yet taken by an upload thread.
  int64_t Pending();

 private:
  void WorkerLoop();

  Backend* const backend_;
  std::mutex mu_;
  std::condition_variable work_available_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> workers_;
};

// What the writes into one destination (a matrix, or a GEMM's streamed operands) add up to.
// Not thread-safe: its owner serialises Add.
class WriteTally {
 public:
  explicit WriteTally(int64_t bytes) : bytes_left_(bytes) {}

  // Counts one finished write of `bytes`; true when it was the last one expected.
  bool Add(const absl::Status& status, int64_t bytes, double copy_ms) {
    if (!status.ok() && error_.ok()) error_ = status;
    copy_ms_ += copy_ms;
    bytes_left_ -= bytes;
    return bytes_left_ == 0;
  }
  bool complete() const { return bytes_left_ == 0; }    // every expected byte counted
  const absl::Status& error() const { return error_; }  // the first failure, else OK
  double copy_ms() const { return copy_ms_; }           // summed over the writes

 private:
  int64_t bytes_left_;
  absl::Status error_;
  double copy_ms_ = 0;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SCHEDULER_UPLOAD_QUEUE_H_
