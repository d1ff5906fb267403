#include "bench/echo_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "bench/echo.grpc.pb.h"

namespace hgemm::bench {
namespace {

// Bytes to send back: one buffer, grown on demand and shared by every call, so a reply costs
// what any server pays to fill a message (one copy), never an allocation of its own content.
class Filler {
 public:
  std::shared_ptr<const std::string> Get(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!buffer_ || buffer_->size() < bytes) {
      buffer_ = std::make_shared<const std::string>(bytes, '\x5a');
    }
    return buffer_;
  }

 private:
  std::mutex mu_;
  std::shared_ptr<const std::string> buffer_;  // guarded by mu_
};

// Runs each callback `delay` after it was handed in, on one thread: the echo's stand-in for a
// backend whose work takes that long, so that the baseline pays the same idle wake-ups as a GEMM
// call does. Waits as the CUDA backend waits for a kernel: asleep until 0.2 ms before the
// deadline, then polling the clock. After Hurry(), and at destruction, callbacks run without
// waiting. Thread-safe.
class Delayer {
 public:
  explicit Delayer(std::chrono::microseconds delay) : delay_(delay), thread_([this] { Run(); }) {}
  ~Delayer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
      hurry_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  void After(std::function<void()> done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      due_.push_back({Clock::now() + delay_, std::move(done)});
    }
    cv_.notify_one();
  }

  // Pending and later callbacks run at once (a server shutting down must not wait them out).
  void Hurry() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hurry_ = true;
    }
    cv_.notify_one();
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kPollFor{200};
  struct Due {
    Clock::time_point at;
    std::function<void()> done;
  };

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return quit_ || !due_.empty(); });
      if (due_.empty()) return;  // quitting, nothing left
      Due next = std::move(due_.front());
      due_.pop_front();  // one delay for all: the deque is in deadline order
      cv_.wait_until(lock, next.at - kPollFor, [this] { return bool(hurry_); });
      lock.unlock();
      while (!hurry_ && Clock::now() < next.at) {
      }
      next.done();
      lock.lock();
    }
  }

  const std::chrono::microseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Due> due_;             // guarded by mu_
  bool quit_ = false;               // guarded by mu_
  std::atomic<bool> hurry_{false};  // written under mu_, polled without it
  std::thread thread_;
};

// One EchoStream call. Reads run continuously; complete calls queue a reply, and one write at
// a time drains the queue (NextWrite). Finish once the client is done and the queue is empty.
class EchoStreamReactor : public grpc::ServerBidiReactor<EchoStreamRequest, EchoStreamReply> {
 public:
  // delayer: when set, each complete call's reply is queued through it.
  EchoStreamReactor(Filler* filler, int64_t max_reply_bytes, Delayer* delayer)
      : filler_(filler), max_reply_bytes_(max_reply_bytes), delayer_(delayer) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (ok) ok = Handle();
    if (ok) {
      lock.unlock();
      StartRead(&request_);
      return;
    }
    reads_done_ = true;
    MaybeFinish(std::move(lock));
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) replies_.clear();  // the client is gone; reads will fail too
    NextWrite();
    MaybeFinish(std::move(lock));
  }

  void OnDone() override { delete this; }

 private:
  struct Reply {
    uint64_t call_id = 0;
    int64_t bytes = 0;
    int64_t chunk_bytes = 0;
    int64_t sent = 0;
  };

  // Takes request_ in. False on a protocol error (status_ says which).
  bool Handle() {
    if (request_.has_header()) {
      const EchoHeader& h = request_.header();
      if (receiving_) return Fail("header: the previous call's data is incomplete");
      if (h.reply_bytes() > uint64_t(max_reply_bytes_))
        return Fail("header.reply_bytes: too large");
      current_ =
          Reply{.call_id = h.call_id(),
                .bytes = int64_t(h.reply_bytes()),
                .chunk_bytes = h.reply_chunk_bytes() ? int64_t(h.reply_chunk_bytes()) : 1 << 20};
      expected_ = int64_t(h.request_bytes());
      received_ = 0;
      receiving_ = true;
    } else if (request_.message_case() == EchoStreamRequest::kData) {
      if (!receiving_) return Fail("data: no header before it");
      received_ += int64_t(request_.data().size());
      if (received_ > expected_) return Fail("data: more bytes than header.request_bytes");
    } else {
      return Fail("message: expected header or data");
    }
    if (receiving_ && received_ == expected_) {
      receiving_ = false;
      if (delayer_ == nullptr) {
        replies_.push_back(current_);
        NextWrite();
      } else {
        ++delayed_;
        delayer_->After([this, reply = current_] {
          std::unique_lock<std::mutex> lock(mu_);
          --delayed_;
          replies_.push_back(reply);
          NextWrite();
          MaybeFinish(std::move(lock));
        });
      }
    }
    return true;
  }

  bool Fail(const char* what) {
    status_ = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what);
    return false;
  }

  // REQUIRES: mu_ held.
  void NextWrite() {
    if (writing_ || replies_.empty()) return;
    Reply& r = replies_.front();
    reply_.Clear();
    reply_.set_call_id(r.call_id);
    if (r.sent < r.bytes) {
      const int64_t n = std::min(r.chunk_bytes, r.bytes - r.sent);
      std::shared_ptr<const std::string> filler = filler_->Get(n);
      reply_.set_data(filler->data(), n);
      r.sent += n;
    } else {
      reply_.set_done(true);
      replies_.pop_front();
    }
    writing_ = true;
    StartWrite(&reply_);
  }

  // Finish() is called without the lock: OnDone (delete this) may follow at once.
  void MaybeFinish(std::unique_lock<std::mutex> lock) {
    if (!reads_done_ || writing_ || !replies_.empty() || delayed_ > 0 || finished_) return;
    finished_ = true;
    const grpc::Status status = status_;
    lock.unlock();
    Finish(status);
  }

  Filler* const filler_;
  const int64_t max_reply_bytes_;
  Delayer* const delayer_;
  EchoStreamRequest request_;  // the one outstanding read

  std::mutex mu_;
  EchoStreamReply reply_;      // the one outstanding write; guarded by mu_
  std::deque<Reply> replies_;  // guarded by mu_
  Reply current_;              // guarded by mu_
  int64_t expected_ = 0;       // guarded by mu_
  int64_t received_ = 0;       // guarded by mu_
  bool receiving_ = false;     // guarded by mu_
  bool writing_ = false;       // guarded by mu_
  bool reads_done_ = false;    // guarded by mu_
  bool finished_ = false;      // guarded by mu_
  int delayed_ = 0;            // replies still in delayer_; guarded by mu_
  grpc::Status status_;        // guarded by mu_
};

}  // namespace

class EchoServer::Service final : public EchoService::CallbackService {
 public:
  Service(int64_t max_reply_bytes, std::chrono::microseconds reply_delay)
      : max_reply_bytes_(max_reply_bytes),
        delayer_(reply_delay.count() > 0 ? std::make_unique<Delayer>(reply_delay) : nullptr) {}

  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoRequest* request,
                                 EchoReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (request->reply_bytes() > uint64_t(max_reply_bytes_)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "reply_bytes: too large"));
      return reactor;
    }
    const size_t bytes = request->reply_bytes();
    reply->set_payload(filler_.Get(bytes)->data(), bytes);
    if (delayer_) {
      delayer_->After([reactor] { reactor->Finish(grpc::Status::OK); });
    } else {
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  // Delayed replies go at once from now on.
  void Hurry() {
    if (delayer_) delayer_->Hurry();
  }

  grpc::ServerBidiReactor<EchoStreamRequest, EchoStreamReply>* EchoStream(
      grpc::CallbackServerContext* context) override {
    return new EchoStreamReactor(&filler_, max_reply_bytes_, delayer_.get());
  }

 private:
  const int64_t max_reply_bytes_;
  Filler filler_;
  std::unique_ptr<Delayer> delayer_;  // null without a reply delay
};

std::unique_ptr<EchoServer> EchoServer::Start(const EchoServerOptions& options) {
  std::unique_ptr<EchoServer> server(new EchoServer());
  server->service_ = std::make_unique<Service>(options.max_reply_bytes, options.reply_delay);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  const int max_message = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    spdlog::error("echo server: cannot listen on {}", options.listen_address);
    return nullptr;
  }
  return server;
}

EchoServer::~EchoServer() { Shutdown(); }

void EchoServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (!server_) return;
    service_->Hurry();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  });
}

}  // namespace hgemm::bench
