// The service without gRPC, for the fuzz targets that go for depth (service_fuzz, upload_fuzz):
// one GemmCore with its scheduler, store and upload queue on the CPU backend, the small limits
// of fuzz_util.h, composed as HgemmServer composes them, and fake transports
// through which the fuzzing thread plays both the client and gRPC: FuzzStream (a GemmStream
// call's StreamSession), FuzzUpload (an UploadMatrix call's UploadSession) and RunGemm (what the
// unary Gemm handler does). No sockets, no serialisation, no gRPC threads: an execution costs
// what the session layer costs, so a campaign gets to its depth.
//
// Like gRPC, the fake transports answer each Start* later, never from inside it: the fuzzing
// thread delivers a message only while a read is outstanding (FakeReadCall) and completes each
// write while it waits. Besides "no crash", they check the StreamTransport / UploadTransport
// contract (one read and one write at a time, nothing after Finish, Finish once), that every call
// ends within kCallDeadline, that C arrives in order and whole, and that no status shows a wrapped
// number.
// Thread safety: Services() is built on first use and never destroyed (the fuzzer ends the
// process). A FuzzStream / FuzzUpload is driven by one thread; the session calls it back from
// any thread.
#ifndef HGEMM_SERVER_FUZZ_SESSION_HARNESS_H_
#define HGEMM_SERVER_FUZZ_SESSION_HARNESS_H_

#include <absl/status/status.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "proto/hgemm.pb.h"
#include "server/backend/cpu_backend.h"
#include "server/fuzz/fuzz_util.h"
#include "server/session/gemm_core.h"
#include "server/session/stream_session.h"
#include "server/session/upload_session.h"
#include "server/session/validation.h"
#include "server/testing/fake_read_call.h"
#include "server/transport/convert.h"

namespace hgemm::fuzz {

// The parts of the service below its transport, composed once per process (Services()), with
// shared-memory regions allowed.
struct SessionServices {
  SessionServices()
      : backend(MakeCpuBackend({.workers = kCpuWorkers,
                                .max_job_bytes = kBackendBytes,
                                .resident_budget_bytes = kBackendBytes})),
        store(backend.get(), {.quota_bytes_per_client = kQuotaBytesPerClient}),
        scheduler(backend.get(), {.idle_spin = std::chrono::microseconds(0)}),
        uploads(backend.get(), kUploadThreads),
        core(&scheduler, backend.get(), &store, &uploads,
             {.rules = {.max_elements_per_matrix = kMaxElementsPerMatrix,
                        .kernels = backend->Kernels()},
              .max_client_pending_bytes = kMaxPendingBytes,
              .result_buffer_pool_bytes = 4 << 20,
              .regions = {.allow_shared_memory = true,
                          .max_regions_per_owner = kRegionsPerClient,
                          .max_bytes_per_owner = kRegionBytesPerClient}}) {
    stream.stream_chunk_bytes = kStreamChunkBytes;
    stream.max_stream_pending_bytes = kMaxPendingBytes;
    stream.idle_timeout = std::chrono::seconds(1);  // named in ExpireIdle's refusals only
  }

  std::unique_ptr<Backend> backend;
  MatrixStore store;
  Scheduler scheduler;
  UploadQueue uploads;
  GemmCore core;
  StreamOptions stream;
};

inline SessionServices& Services() {
  static SessionServices* services = new SessionServices;
  return *services;
}

inline void CheckMessage(const absl::Status& s) {
  if (ShowsNegativeNumber(std::string(s.message()))) {
    Fail("a message shows a wrapped negative number", std::string(s.message()));
  }
}

// One unary Gemm as its handler runs it (the request converted and validated into an order,
// admission, the run), answered
// within kCallDeadline. `cancelled`: the client has gone away; `over_unix_socket`: the call
// came over one (regions allowed). On OK, `c` holds C (sent to the host; poisoned with 0xFF
// bytes, NaN in every type, before the run), or `kept` the matrix kept resident, or C is in
// the request's c_region.
inline absl::Status RunGemm(const std::string& owner, const v1::GemmRequest& request,
                            Clock::time_point deadline, bool cancelled, bool over_unix_socket,
                            std::string* c, ResidentMatrix* kept) {
  SessionServices& services = Services();
  GemmOrder order;
  if (absl::Status s = ValidateGemm(ToSpec(request), services.core.rules(), &order); !s.ok()) {
    return s;
  }
  order.over_unix_socket = over_unix_socket;
  const bool c_to_host = order.c.kind == ResultSink::Kind::kHost;
  const bool keep_c = order.c.kind == ResultSink::Kind::kKeepResident;
  AdmittedGemm admitted;
  if (absl::Status s = services.core.Admit(owner, std::move(order), &admitted); !s.ok()) return s;
  const int64_t c_bytes = admitted.job().shape.CBytes();
  if (c_to_host) {
    c->assign(size_t(c_bytes), '\xff');
    admitted.job().c = c->data();
  }
  admitted.job().deadline = deadline;
  admitted.job().is_cancelled = [cancelled] { return cancelled; };
  struct Answer {
    std::mutex mu;
    std::condition_variable done;
    bool answered = false;
    absl::Status status;
    GemmResult result;
  };
  auto answer = std::make_shared<Answer>();
  if (absl::Status s = services.core.Run(std::move(admitted),
                                         [answer](const absl::Status& s, GemmResult result) {
                                           std::lock_guard<std::mutex> lock(answer->mu);
                                           if (answer->answered) Fail("Gemm answered twice", "");
                                           answer->answered = true;
                                           answer->status = s;
                                           answer->result = std::move(result);
                                           answer->done.notify_all();
                                         });
      !s.ok()) {
    return s;
  }
  std::unique_lock<std::mutex> lock(answer->mu);
  if (!answer->done.wait_for(lock, kCallDeadline, [&] { return answer->answered; })) {
    Fail("Gemm not answered within its deadline", "");
  }
  if (answer->status.ok() && keep_c) *kept = answer->result.kept_c;
  if (answer->status.ok() && keep_c && !kept->buffer) Fail("Gemm kept no C", "");
  return answer->status;
}

inline void ContractBroken(const std::string& what) { Fail(what.c_str(), ""); }

// One GemmStream call: a StreamSession over this transport. The caller sends messages (wire
// messages converted as the reactor converts them), then closes its side or cancels;
// Outcome() pumps the call to its end, completing each write on the fuzzing thread.
class FuzzStream final : public FakeReadCall<StreamTransport, StreamSession, hgemm::StreamMessage> {
 public:
  struct Done {
    uint64_t gemm_id;
    absl::Status status;
    std::string kept_c;  // handle, for keep_c
  };

  FuzzStream(const std::string& owner, Clock::time_point deadline)
      : FakeReadCall(&ContractBroken, kCallDeadline) {
    Open(Services().core, Services().stream, this, owner, deadline, "");
  }
  ~FuzzStream() override {
    Close(/*cancel=*/false);
    WaitFinished();
  }

  // Delivers `message` as FakeReadCall::Deliver does (its chunk's bytes are moved out).
  bool Deliver(v1::GemmStreamRequest& message) {
    hgemm::StreamMessage read = ToStreamMessage(message);
    return FakeReadCall::Deliver(read);
  }

  // The client half-closes, or (`cancel`) goes away: the outstanding read completes with
  // ok = false, and so do later writes when cancelled.
  void Close(bool cancel) {
    if (cancel) cancelled_ = true;
    CloseReads();
  }
  // Pumps until the session finishes the call; its status.
  absl::Status Outcome() {
    WaitFinished();
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  const std::vector<Done>& answers() const { return answers_; }  // REQUIRES: finished

 private:
  bool WriteWaitingLocked() const override { return writing_; }
  bool TakeWriteLocked() override { return std::exchange(writing_, false); }
  void CompleteWrite() override { session().OnWriteDone(!cancelled_); }

  void StartWriteChunk(uint64_t gemm_id, int64_t offset, std::string_view data) override {
    std::lock_guard<std::mutex> lock(mu_);
    StartWriteLocked();
    int64_t& received = c_bytes_[gemm_id];
    if (offset != received || data.empty() ||
        int64_t(data.size()) > Services().stream.stream_chunk_bytes) {
      Fail("a C chunk out of order or of a wrong size", std::to_string(gemm_id));
    }
    received += int64_t(data.size());
  }
  void StartWriteDone(const AnnouncedGemm& gemm, const absl::Status& status,
                      const GemmResult& result) override {
    std::lock_guard<std::mutex> lock(mu_);
    StartWriteLocked();
    CheckMessage(status);
    const int64_t received = c_bytes_[gemm.gemm_id];
    c_bytes_.erase(gemm.gemm_id);  // the id may come again
    if (status.ok() && !gemm.keep_c() && received != gemm.order.job.shape.CBytes()) {
      Fail("a GemmDone after a C of the wrong size", std::to_string(gemm.gemm_id));
    }
    if (status.ok() && gemm.keep_c() && !result.kept_c.buffer) Fail("a GemmDone kept no C", "");
    answers_.push_back({gemm.gemm_id, status, result.kept_c.handle});
  }
  void StartWriteLocked() {
    if (writing_ || finished_) Fail("StartWrite", writing_ ? "two at once" : "after Finish");
    writing_ = true;
    changed_.notify_all();
  }
  void Finish(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_) Fail("Finish", "with a write outstanding");
    CheckMessage(status);
    status_ = status;
    FinishedLocked();
  }
  bool IsCancelled() const override { return cancelled_; }

  std::atomic<bool> cancelled_{false};
  bool writing_ = false;                 // guarded by mu_
  absl::Status status_;                  // guarded by mu_
  std::map<uint64_t, int64_t> c_bytes_;  // guarded by mu_; C received so far, per gemm_id
  std::vector<Done> answers_;            // guarded by mu_
};

// One UploadMatrix call: an UploadSession over this transport, driven as FuzzStream is. (The
// session's message type is named in full: fuzz::UploadMessage of fuzz_requests.h draws a
// wire message.)
class FuzzUpload final : public FakeReadCall<UploadTransport, UploadSession, hgemm::UploadMessage> {
 public:
  // `over_unix_socket`: the call came over one (a header may name a region).
  explicit FuzzUpload(const std::string& owner, bool over_unix_socket = false)
      : FakeReadCall(&ContractBroken, kCallDeadline) {
    Open(Services().core, this, owner, Services().stream.idle_timeout, over_unix_socket);
  }
  ~FuzzUpload() override {
    Close(/*cancel=*/false);
    Outcome().IgnoreError();  // checked in Finish
  }

  // Delivers `message` as FakeReadCall::Deliver does (its chunk's bytes are moved out).
  bool Deliver(v1::UploadMatrixRequest& message) {
    hgemm::UploadMessage read = ToUploadMessage(message);
    return FakeReadCall::Deliver(read);
  }

  void Close(bool cancel) {
    if (cancel) cancelled_ = true;
    CloseReads();
  }
  // Waits for the call's end, then tells the session it is over (as the reactor's OnDone
  // does): the status, and the matrix registered on OK.
  absl::Status Outcome(ResidentMatrix* matrix = nullptr) {
    WaitFinished();
    if (!std::exchange(call_done_, true)) session().OnCallDone(cancelled_);
    std::lock_guard<std::mutex> lock(mu_);
    if (matrix != nullptr) *matrix = matrix_;
    return status_;
  }

 private:
  void Finish(const absl::Status& status, const ResidentMatrix& matrix) override {
    std::lock_guard<std::mutex> lock(mu_);
    CheckMessage(status);
    if (status.ok() && !matrix.buffer) Fail("an upload finished OK without a matrix", "");
    status_ = status;
    matrix_ = matrix;
    FinishedLocked();
  }
  bool IsCancelled() const override { return cancelled_; }

  std::atomic<bool> cancelled_{false};
  bool call_done_ = false;  // the driving thread's
  absl::Status status_;     // guarded by mu_
  ResidentMatrix matrix_;   // guarded by mu_
};

}  // namespace hgemm::fuzz

#endif  // HGEMM_SERVER_FUZZ_SESSION_HARNESS_H_
