// CompletionThreads: a few threads of a client that run its queued blocking calls in order and
// report each when it is over: how a blocking call is made without blocking its caller (the C
// ABI's *_start calls, which Python's hgemm.aio awaits). Threads are made as calls need them, up
// to a maximum, and kept until Stop.
//
// Thread safety: Add, Stop and QueuedCall::Cancel may be called from any thread.
#ifndef HGEMM_CLIENT_COMPLETION_THREADS_H_
#define HGEMM_CLIENT_COMPLETION_THREADS_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

namespace hgemm {

// One call queued on CompletionThreads: `run` makes it on a completion thread, then `done(OK)`
// reports it; or `done` alone runs, with CANCELLED saying why, when the call was cancelled before
// it started or the threads were stopped first. `done` runs exactly once, after which both
// functions (and what they hold) are destroyed. `interrupt` (may be empty) ends `run` early from
// another thread, e.g. by cancelling the RPC it waits on. REQUIRES: none of them throws.
class QueuedCall {
 public:
  QueuedCall(std::function<void()> run, std::function<void(const grpc::Status&)> done,
             std::function<void()> interrupt = nullptr)
      : run_(std::move(run)), done_(std::move(done)), interrupt_(std::move(interrupt)) {}

  QueuedCall(const QueuedCall&) = delete;
  QueuedCall& operator=(const QueuedCall&) = delete;

  // Not started yet: it will not run (done gets CANCELLED). Running: interrupt, if any. Over or
  // being reported: nothing.
  void Cancel();

 private:
  friend class CompletionThreads;
  // Runs it unless cancelled or `stopping`, then reports it.
  void Finish(bool stopping);

  std::function<void()> run_;
  std::function<void(const grpc::Status&)> done_;

  std::mutex mu_;  // guards what follows
  std::function<void()> interrupt_;
  bool cancelled_ = false;
  bool started_ = false;
  bool finished_ = false;  // run is over (or never will be): no more interrupts
};

class CompletionThreads {
 public:
  explicit CompletionThreads(size_t max_threads) : max_threads_(max_threads) {}
  // Stop().
  ~CompletionThreads();

  CompletionThreads(const CompletionThreads&) = delete;
  CompletionThreads& operator=(const CompletionThreads&) = delete;

  // Queues `call`, making a thread for it if none is idle and fewer than the maximum run.
  // Throws std::system_error (nothing queued) when no thread exists and none can be made.
  void Add(std::shared_ptr<QueuedCall> call);
  // Calls not started are reported CANCELLED, running ones interrupted and waited for, the
  // threads joined. A second Stop does nothing.
  // REQUIRES: no Add meanwhile or after, except from a call's done (which its thread reports).
  void Stop();

 private:
  void Work();

  const size_t max_threads_;
  std::mutex mu_;  // guards what follows
  std::condition_variable wake_;
  std::deque<std::shared_ptr<QueuedCall>> queue_;
  std::unordered_set<QueuedCall*> running_;
  std::vector<std::thread> threads_;
  int idle_ = 0;  // threads waiting for a call
  bool stopping_ = false;
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_COMPLETION_THREADS_H_
