#include "client/completion_threads.h"

#include <system_error>
#include <utility>

namespace hgemm {

void QueuedCall::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  // Under the lock: the call cannot finish (and what interrupt touches be freed) meanwhile.
  if (started_ && !finished_ && interrupt_) interrupt_();
}

void QueuedCall::Finish(bool stopping) {
  bool run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    run = !cancelled_ && !stopping;
    started_ = run;
  }
  if (run) run_();
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    interrupt_ = nullptr;
  }
  if (run) {
    done_(grpc::Status::OK);
  } else {
    done_(grpc::Status(grpc::StatusCode::CANCELLED,
                       stopping ? "the client was destroyed before the call started"
                                : "the call was cancelled before it started"));
  }
  run_ = nullptr;
  done_ = nullptr;
}

CompletionThreads::~CompletionThreads() { Stop(); }

void CompletionThreads::Add(std::shared_ptr<QueuedCall> call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Stopping (a done starting another call): Stop() is joining threads_, and the thread of
    // that done reports this call.
    if (!stopping_ && idle_ == 0 && threads_.size() < max_threads_) {
      try {
        threads_.emplace_back(&CompletionThreads::Work, this);
      } catch (const std::system_error&) {
        if (threads_.empty()) throw;  // no thread would ever run it
      }
    }
    queue_.push_back(std::move(call));
  }
  wake_.notify_one();
}

void CompletionThreads::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (QueuedCall* call : running_) call->Cancel();
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void CompletionThreads::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ++idle_;
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stopping, every call reported
    std::shared_ptr<QueuedCall> call = std::move(queue_.front());
    queue_.pop_front();
    const bool stopping = stopping_;
    running_.insert(call.get());
    lock.unlock();
    call->Finish(stopping);
    lock.lock();
    running_.erase(call.get());
  }
}

}  // namespace hgemm
