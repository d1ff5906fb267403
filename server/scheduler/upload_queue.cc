#include "server/scheduler/upload_queue.h"

#include "server/core/job.h"
#include "server/core/status.h"
#include "server/core/thread_name.h"

namespace hgemm {

UploadQueue::UploadQueue(Backend* backend, int threads) : backend_(backend) {
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([this] {
      NameThisThread("hgemm-upload");
      WorkerLoop();
    });
  }
}

UploadQueue::~UploadQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void UploadQueue::Write(std::shared_ptr<ResidentBuffer> buffer, int64_t offset, WireBytes data,
                        WriteDone done) {
  Post([this, buffer = std::move(buffer), offset, data = std::move(data),
        done = std::move(done)]() mutable {
    const auto start = Clock::now();
    absl::Status s;
    try {
      s = backend_->WriteResidentPieces(*buffer, offset, data.pieces());
    } catch (...) {
      s = status::FromCurrentException("copy to the device");
    }
    const double copy_ms = MillisecondsSince(start);
    data = WireBytes();  // free the chunk before the callback runs
    buffer.reset();
    done(s, copy_ms);
  });
}

void UploadQueue::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(work));
  }
  work_available_.notify_one();
}

int64_t UploadQueue::Pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(tasks_.size());
}

void UploadQueue::WorkerLoop() {
  while (true) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_available_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left
      work = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      work();
    } catch (...) {  // a transport bug; the worker must live on for the other copies
      status::LogCurrentException("upload work");
    }
  }
}

}  // namespace hgemm
