// FakeReadCall<Transport, Session, Message>: the reading half of a fake transport under a
// session of the session layer (UploadSession, PartSession, StreamSession), as the session
// tests and the fuzz harness drive them without gRPC. It owns the session and plays gRPC's
// reads: one read outstanding at a time (the reactor starts the first), a message delivered
// only while a read is outstanding, nothing started after Finish, Finish once. A derived class
// implements the rest of `Transport` (Finish, writes) and calls Finished() from its Finish.
//
// A broken contract, or a wait past `patience`, is reported through `broken` (a test adds a
// failure, a fuzz target aborts) and the waiting call returns as if the call had finished.
// Thread safety: the driving methods are called by one thread; the session calls the
// Transport methods from any thread. A derived class guards its own state with mu_ and wakes
// waiters through changed_.
#ifndef HGEMM_SERVER_TESTING_FAKE_READ_CALL_H_
#define HGEMM_SERVER_TESTING_FAKE_READ_CALL_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace hgemm {

template <typename Transport, typename Session, typename Message>
class FakeReadCall : public Transport {
 public:
  using Broken = void (*)(const std::string& what);

  // REQUIRES: the session is finished (WaitFinished) before the derived class is destroyed.
  ~FakeReadCall() override = default;

  Session& session() { return *session_; }

  // Delivers `message` (its chunk may be moved out) as the outstanding read, once the session
  // has started one. False, and nothing delivered, when the call finished instead.
  bool Deliver(Message& message) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!WaitUntilLocked(lock, [this] { return read_started_ || finished_; }) || finished_) {
      return false;  // gRPC delivers nothing after Finish
    }
    read_started_ = false;
    lock.unlock();
    session_->OnRead(message);
    return true;
  }
  bool Deliver(Message&& message) { return Deliver(message); }

  // The client half-closes: the outstanding read (once started) completes with ok = false.
  void CloseReads() {
    std::unique_lock<std::mutex> lock(mu_);
    WaitUntilLocked(lock, [this] { return read_started_ || finished_; });
    CompleteReadLocked(lock);
  }

  // Waits for the session to finish the call, then ends a read still outstanding, as gRPC
  // does. False when it did not finish within `patience`.
  bool WaitFinished() {
    std::unique_lock<std::mutex> lock(mu_);
    const bool finished = WaitUntilLocked(lock, [this] { return finished_; });
    CompleteReadLocked(lock);
    return finished;
  }

  bool finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

 protected:
  FakeReadCall(Broken broken, std::chrono::milliseconds patience)
      : broken_(broken), patience_(patience) {}

  // Makes the session over this transport. REQUIRES: called once, from the derived
  // constructor (the session calls back into the derived class).
  template <typename... Args>
  void Open(Args&&... args) {
    session_.emplace(std::forward<Args>(args)...);
  }

  // Records the call's end (from the derived Finish). REQUIRES: mu_ held.
  void FinishedLocked() {
    if (finished_) broken_("Finish called twice");
    finished_ = true;
    changed_.notify_all();
  }

  // Waits until `done()` (called with mu_ held) holds, completing writes meanwhile when the
  // derived class completes them on the driving thread (TakeWriteLocked). False, reported,
  // past `patience`.
  template <typename Predicate>
  bool WaitUntilLocked(std::unique_lock<std::mutex>& lock, Predicate done) {
    const auto give_up = std::chrono::steady_clock::now() + patience_;
    while (!done()) {
      if (TakeWriteLocked()) {
        lock.unlock();
        CompleteWrite();
        lock.lock();
      } else if (!changed_.wait_until(lock, give_up,
                                      [&] { return done() || WriteWaitingLocked(); })) {
        broken_("the call hangs");
        return false;
      }
    }
    return true;
  }
  template <typename Predicate>
  bool WaitUntil(Predicate done) {
    std::unique_lock<std::mutex> lock(mu_);
    return WaitUntilLocked(lock, done);
  }

  // A derived class that completes its writes on the driving thread (the fuzz harness) says
  // whether one waits, takes it, and completes it (without mu_). By default writes are none of
  // this class's business.
  virtual bool WriteWaitingLocked() const { return false; }
  virtual bool TakeWriteLocked() { return false; }
  virtual void CompleteWrite() {}

  const Broken broken_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool finished_ = false;  // guarded by mu_; set by FinishedLocked

 private:
  void StartRead() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (read_started_) broken_("two reads at once");
    if (finished_) broken_("a read started after Finish");
    read_started_ = true;
    changed_.notify_all();
  }

  void CompleteReadLocked(std::unique_lock<std::mutex>& lock) {
    if (!read_started_) return;
    read_started_ = false;
    lock.unlock();
    session_->OnReadsDone();
    lock.lock();
  }

  const std::chrono::milliseconds patience_;
  bool read_started_ = true;        // guarded by mu_; the reactor starts the first read itself
  std::optional<Session> session_;  // last: it calls back into the members above
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_FAKE_READ_CALL_H_
