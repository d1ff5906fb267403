#include "bench/soak.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "bench/hgemm_load.h"
#include "bench/stats.h"
#include "client/error_details.h"
#include "client/gemm_client.h"
#include "proto/hgemm.grpc.pb.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/fp16.h"

namespace hgemm::bench {
namespace {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;

constexpr size_t kMaxProblems = 20;
// Large Cs of fewer rows are checked in full (FreivaldsError averages over rows).
constexpr uint32_t kFreivaldsMinRows = 32;

// What all clients count into. Thread-safe.
class Tally {
 public:
  // Done once `target` requests are counted or, if max_seconds > 0, that long has passed.
  Tally(int64_t target, double max_seconds)
      : target_(target),
        until_(max_seconds > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(max_seconds))
                               : Clock::time_point::max()) {}

  bool Done() const {
    return counted_.load(std::memory_order_relaxed) >= target_ || Clock::now() >= until_;
  }

  void Count(const std::string& kind, int code) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      by_kind_status_[{kind, code}]++;
    }
    counted_.fetch_add(1, std::memory_order_relaxed);
  }
  void Lost(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    lost_++;
    Note("lost: " + what);
  }
  void Wrong(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    wrong_++;
    Note("wrong: " + what);
  }
  void Verified(double error) {
    std::lock_guard<std::mutex> lock(mu_);
    verified_++;
    max_error_ = std::max(max_error_, error);
  }
  void Unanswered(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    unanswered_ += n;
  }
  void Took(const std::string& action, double ms) {
    std::lock_guard<std::mutex> lock(mu_);
    action_ms_[action].push_back(ms);
  }

  void Fill(SoakResult* r) const {
    std::lock_guard<std::mutex> lock(mu_);
    r->by_kind_status = by_kind_status_;
    r->requests = counted_.load();
    r->lost = lost_;
    r->wrong = wrong_;
    r->verified = verified_;
    r->max_error = max_error_;
    r->unanswered = unanswered_;
    r->problems = problems_;
    r->action_ms = action_ms_;
  }

 private:
  void Note(const std::string& what) {  // REQUIRES: mu_ held
    if (problems_.size() < kMaxProblems) problems_.push_back(what);
  }

  const int64_t target_;
  const Clock::time_point until_;
  std::atomic<int64_t> counted_{0};
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> by_kind_status_;  // guarded by mu_
  int64_t lost_ = 0, wrong_ = 0, verified_ = 0, unanswered_ = 0;   // guarded by mu_
  double max_error_ = 0;                                           // guarded by mu_
  std::map<std::string, std::vector<double>> action_ms_;           // guarded by mu_
  std::vector<std::string> problems_;                              // guarded by mu_
};

// Cancels a call after `delay` unless Stop() comes first; Stop() returns at once either way.
class Canceller {
 public:
  Canceller(grpc::ClientContext* context, std::chrono::microseconds delay)
      : thread_([this, context, delay] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!stop_.wait_for(lock, delay, [this] { return stopped_; })) context->TryCancel();
        }) {}
  ~Canceller() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    stop_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable stop_;
  bool stopped_ = false;  // guarded by mu_
  std::thread thread_;    // last: starts once the members above exist
};

std::string ShapeName(uint32_t m, uint32_t n, uint32_t k) {
  return fmt::format("{}x{}x{}", m, n, k);
}

// One client: a thread, a channel, an x-client-id, and its random stream.
class SoakClient {
 public:
  SoakClient(const SoakOptions& options, int index, Tally* tally)
      : o_(options),
        tally_(tally),
        channel_(LoadGenerator::MakeChannel(options.target)),
        stub_(v1::GemmService::NewStub(channel_)),
        client_(channel_),
        rng_(options.seed * 1000003 + index),
        client_id_(fmt::format("{}-{}", options.client_id_prefix, index)) {
    call_.client_id = client_id_;
    call_.timeout = SafetyTimeout();
    call_.chunk_bytes = options.chunk_bytes;
  }

  void Run() {
    const std::vector<int> weights = {o_.weight_unary,  o_.weight_stream,   o_.weight_resident,
                                      o_.weight_cancel, o_.weight_deadline, o_.weight_large};
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    while (!tally_->Done()) {
      const auto started = Clock::now();
      const char* action = RunAction(pick(rng_));
      tally_->Took(action,
                   std::chrono::duration<double, std::milli>(Clock::now() - started).count());
    }
  }

 private:
  // Runs the action of weight index `picked`; returns its name (the latency table's row).
  const char* RunAction(int picked) {
    switch (picked) {
      case 0:
        Unary();
        return "unary";
      case 1:
        Stream(kNormal);
        return "stream";
      case 2:
        Resident();
        return "resident";
      case 3:
        switch (std::uniform_int_distribution<int>(0, 2)(rng_)) {
          case 0:
            CancelUnary();
            return "cancel_unary";
          case 1:
            Stream(kCancel);
            return "cancel_stream";
          default:
            CancelUpload();
            return "cancel_upload";
        }
      case 4:
        if (Coin()) {
          DeadlineUnary();
          return "deadline_unary";
        }
        Stream(kDeadline);
        return "deadline_stream";
      default:
        Large();
        return "large";
    }
  }

  enum StreamMode { kNormal, kCancel, kDeadline };

  std::chrono::milliseconds SafetyTimeout() const {
    return std::chrono::milliseconds(int64_t(o_.call_timeout_s * 1000));
  }
  bool Coin() { return std::uniform_int_distribution<int>(0, 1)(rng_) == 1; }
  std::chrono::microseconds UpTo(double max_ms, double min_ms = 0) {
    return std::chrono::microseconds(
        int64_t(std::uniform_real_distribution<double>(min_ms, max_ms)(rng_) * 1000));
  }
  void Prepare(grpc::ClientContext* context, std::chrono::microseconds timeout) const {
    context->set_deadline(std::chrono::system_clock::now() + timeout);
    context->AddMetadata("x-client-id", client_id_);
  }

  // A GEMM with fresh random operands of a random shape, carried as bytes.
  v1::GemmRequest RandomGemm() {
    std::uniform_int_distribution<uint32_t> dim(1, o_.max_dim);
    v1::GemmRequest r;
    r.set_m(dim(rng_));
    r.set_n(dim(rng_));
    r.set_k(dim(rng_));
    r.set_a(HalfBytes(RandomHalfMatrix(int64_t(r.m()) * r.k(), rng_)));
    r.set_b(HalfBytes(RandomHalfMatrix(int64_t(r.k()) * r.n(), rng_)));
    r.mutable_options()->set_request_id(fmt::format("{}/{}", client_id_, next_id_++));
    return r;
  }

  // Compares C with the reference of `a` and `b` (the bytes the GEMM was given).
  void Check(const std::string& what, const std::string& a, const std::string& b, uint32_t m,
             uint32_t n, uint32_t k, const std::string& c) {
    const std::string name = fmt::format("{} {} ({})", what, ShapeName(m, n, k), client_id_);
    if (c.size() != 2 * size_t(m) * n) {
      return tally_->Wrong(
          fmt::format("{}: C has {} bytes, expected {}", name, c.size(), 2 * size_t(m) * n));
    }
    // Freivalds' test needs rows to average over (m · vectors sums); C of few rows is cheap
    // to check in full anyway.
    if (int64_t(m) * n * k > o_.full_check_max_mnk && m >= kFreivaldsMinRows) {
      const double error = FreivaldsError(
          reinterpret_cast<const uint16_t*>(a.data()), reinterpret_cast<const uint16_t*>(b.data()),
          reinterpret_cast<const uint16_t*>(c.data()), m, n, k, 2, rng_());
      if (!(error <= o_.tolerance)) {
        return tally_->Wrong(
            fmt::format("{}: Freivalds relative error {:.3e} > {:.0e}", name, error, o_.tolerance));
      }
      return tally_->Verified(error);
    }
    const std::vector<float> ref =
        ReferenceGemm(reinterpret_cast<const uint16_t*>(a.data()),
                      reinterpret_cast<const uint16_t*>(b.data()), m, n, k);
    double error = 0;
    if (std::any_of(ref.begin(), ref.end(), [](float x) { return x != 0; })) {
      error = RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()), ref.data(),
                                     int64_t(ref.size()));
    } else {  // an exactly zero product (possible for tiny k): C must be zero too
      const auto* h = reinterpret_cast<const uint16_t*>(c.data());
      error = std::any_of(h, h + ref.size(), [](uint16_t x) { return (x & 0x7FFF) != 0; }) ? 1 : 0;
    }
    if (!(error <= o_.tolerance)) {
      return tally_->Wrong(
          fmt::format("{}: relative Frobenius error {:.3e} > {:.0e}", name, error, o_.tolerance));
    }
    tally_->Verified(error);
  }
  void Check(const std::string& what, const v1::GemmRequest& r, const std::string& c) {
    Check(what, r.a(), r.b(), r.m(), r.n(), r.k(), c);
  }

  // A call under the safety deadline that ran into it was never answered.
  void CountSafe(const std::string& kind, const grpc::Status& s, const std::string& what) {
    tally_->Count(kind, int(s.error_code()));
    if (s.error_code() == StatusCode::DEADLINE_EXCEEDED) {
      tally_->Lost(fmt::format("{} {} ({}): no answer within {} s", kind, what, client_id_,
                               o_.call_timeout_s));
    }
  }

  void Unary() {
    const v1::GemmRequest r = RandomGemm();
    v1::GemmResponse response;
    grpc::Status s = client_.Gemm(r, &response, call_);
    CountSafe("unary", s, ShapeName(r.m(), r.n(), r.k()));
    if (s.ok()) Check("unary", r, response.c());
  }

  // A unary GEMM of a log-uniform shape up to large_max_dim³ (one in 20 exactly that).
  void Large() {
    auto dim = [&] {
      if (std::uniform_int_distribution<int>(0, 19)(rng_) == 0) return o_.large_max_dim;
      const double log_max = std::log(double(o_.large_max_dim));
      const double d = std::exp(std::uniform_real_distribution<double>(0, log_max)(rng_));
      return std::clamp(uint32_t(d), uint32_t{1}, o_.large_max_dim);
    };
    const bool cube = std::uniform_int_distribution<int>(0, 19)(rng_) == 0;
    v1::GemmRequest r;
    r.set_m(cube ? o_.large_max_dim : dim());
    r.set_n(cube ? o_.large_max_dim : dim());
    r.set_k(cube ? o_.large_max_dim : dim());
    r.set_a(HalfBytes(RandomHalfMatrix(int64_t(r.m()) * r.k(), rng_)));
    r.set_b(HalfBytes(RandomHalfMatrix(int64_t(r.k()) * r.n(), rng_)));
    r.mutable_options()->set_request_id(fmt::format("{}/{}", client_id_, next_id_++));
    v1::GemmResponse response;
    grpc::Status s = client_.Gemm(r, &response, call_);
    CountSafe("large", s, ShapeName(r.m(), r.n(), r.k()));
    if (s.ok()) Check("large", r, response.c());
  }

  void CancelUnary() {
    const v1::GemmRequest r = RandomGemm();
    v1::GemmResponse response;
    grpc::ClientContext context;
    Prepare(&context, SafetyTimeout());
    Canceller canceller(&context, UpTo(o_.cancel_after_max_ms));
    grpc::Status s = stub_->Gemm(&context, r, &response);
    canceller.Stop();
    CountSafe("cancel_unary", s, ShapeName(r.m(), r.n(), r.k()));
    if (s.ok()) Check("cancel_unary", r, response.c());
  }

  // A slow UploadMatrix (a pause of up to 2 ms between its chunks) cancelled after a random
  // delay; a handle that came back anyway is released.
  void CancelUpload() {
    std::uniform_int_distribution<uint32_t> dim(1, o_.max_dim);
    const uint32_t rows = dim(rng_), cols = dim(rng_);
    const std::string data = HalfBytes(RandomHalfMatrix(int64_t(rows) * cols, rng_));
    std::vector<std::chrono::microseconds> pauses;
    for (size_t offset = 0; offset < data.size(); offset += o_.upload_chunk_bytes) {
      pauses.push_back(UpTo(2));
    }
    grpc::ClientContext context;
    Prepare(&context, SafetyTimeout());
    v1::MatrixInfo info;
    Canceller canceller(&context, UpTo(o_.cancel_after_max_ms));
    auto writer = stub_->UploadMatrix(&context, &info);
    v1::UploadMatrixRequest message;
    v1::MatrixHeader* header = message.mutable_header();
    header->set_rows(rows);
    header->set_cols(cols);
    header->set_ttl_seconds(600);
    header->set_label("soak cancelled upload");
    bool ok = writer->Write(message);
    for (size_t offset = 0, i = 0; ok && offset < data.size();
         offset += o_.upload_chunk_bytes, ++i) {
      std::this_thread::sleep_for(pauses[i]);
      message.set_chunk(data.substr(offset, o_.upload_chunk_bytes));
      ok = writer->Write(message);
    }
    if (ok) writer->WritesDone();
    const grpc::Status s = writer->Finish();
    canceller.Stop();
    CountSafe("cancel_upload", s, fmt::format("{}x{}", rows, cols));
    if (s.ok()) {
      grpc::Status r = client_.ReleaseMatrix(info.handle(), call_);
      CountSafe("release", r, fmt::format("{}x{}", rows, cols));
    }
  }

  void DeadlineUnary() {
    const v1::GemmRequest r = RandomGemm();
    v1::GemmResponse response;
    grpc::ClientContext context;
    Prepare(&context, UpTo(o_.short_deadline_max_ms, 0.05));
    grpc::Status s = stub_->Gemm(&context, r, &response);
    tally_->Count("deadline_unary", int(s.error_code()));
    if (s.ok()) Check("deadline_unary", r, response.c());
  }

  // The messages of `gemms` (gemm_id = index: header, A's chunks, B's chunks) merged in a
  // random order that keeps each GEMM's own order.
  std::vector<v1::GemmStreamRequest> Interleave(const std::vector<v1::GemmRequest>& gemms) {
    std::vector<std::vector<v1::GemmStreamRequest>> queues(gemms.size());
    for (size_t i = 0; i < gemms.size(); ++i) {
      const v1::GemmRequest& r = gemms[i];
      v1::GemmHeader* h = queues[i].emplace_back().mutable_header();
      h->set_gemm_id(i);
      h->set_m(r.m());
      h->set_n(r.n());
      h->set_k(r.k());
      *h->mutable_options() = r.options();
      for (auto [operand, bytes] :
           {std::pair{v1::OPERAND_A, &r.a()}, std::pair{v1::OPERAND_B, &r.b()}}) {
        for (size_t offset = 0; offset < bytes->size(); offset += o_.chunk_bytes) {
          v1::MatrixChunk* c = queues[i].emplace_back().mutable_chunk();
          c->set_gemm_id(i);
          c->set_operand(operand);
          c->set_offset(offset);
          c->set_data(bytes->substr(offset, o_.chunk_bytes));
        }
      }
    }
    std::vector<v1::GemmStreamRequest> out;
    std::vector<size_t> next(gemms.size(), 0);
    for (size_t left = gemms.size(); left > 0;) {
      size_t i = std::uniform_int_distribution<size_t>(0, gemms.size() - 1)(rng_);
      while (next[i] == queues[i].size()) i = (i + 1) % gemms.size();
      out.push_back(std::move(queues[i][next[i]++]));
      if (next[i] == queues[i].size()) --left;
    }
    return out;
  }

  // Several GEMMs on one GemmStream, written by a second thread while this one reads, as
  // GemmClient::GemmStream does; cancelled after a random delay (kCancel) or under a short
  // deadline (kDeadline). Every GEMM answered OK is checked.
  void Stream(StreamMode mode) {
    const char* kind = mode == kNormal   ? "stream"
                       : mode == kCancel ? "cancel_stream"
                                         : "deadline_stream";
    const int count = std::uniform_int_distribution<int>(2, std::max(2, o_.stream_gemms))(rng_);
    std::vector<v1::GemmRequest> gemms;
    for (int i = 0; i < count; ++i) gemms.push_back(RandomGemm());
    struct Received {
      std::string c;
      int64_t bytes = 0;
      bool done = false;
      int code = 0;
    };
    std::vector<Received> got(count);
    for (int i = 0; i < count; ++i) got[i].c.resize(2 * size_t(gemms[i].m()) * gemms[i].n());

    grpc::ClientContext context;
    Prepare(&context, mode == kDeadline ? UpTo(o_.short_deadline_max_ms, 0.05) : SafetyTimeout());
    auto stream = stub_->GemmStream(&context);
    // Half the streams send their GEMMs one after the other (WriteStreamedGemm), half with the
    // GEMMs' messages interleaved at random (each GEMM's own order kept, as the protocol asks).
    std::vector<v1::GemmStreamRequest> interleaved;
    if (Coin()) interleaved = Interleave(gemms);
    std::thread writer([&] {
      if (interleaved.empty()) {
        for (int i = 0; i < count; ++i) {
          if (!WriteStreamedGemm(gemms[i], i, o_.chunk_bytes, stream.get())) return;
        }
      } else {
        for (const v1::GemmStreamRequest& m : interleaved) {
          if (!stream->Write(m)) return;
        }
      }
      stream->WritesDone();
    });
    std::optional<Canceller> canceller;
    if (mode == kCancel) canceller.emplace(&context, UpTo(o_.cancel_after_max_ms));
    v1::GemmStreamResponse message;
    while (stream->Read(&message)) {
      const uint64_t id = message.gemm_id();
      if (id >= uint64_t(count)) {
        tally_->Wrong(fmt::format("{} ({}): answer for unknown gemm_id {}", kind, client_id_, id));
        continue;
      }
      Received& g = got[id];
      if (message.has_chunk()) {
        const v1::ResultChunk& chunk = message.chunk();
        if (g.done || chunk.offset() > g.c.size() ||
            chunk.data().size() > g.c.size() - chunk.offset()) {
          tally_->Wrong(fmt::format("{} ({}): gemm {}: chunk [{}, +{}) of a {}-byte C{}", kind,
                                    client_id_, id, chunk.offset(), chunk.data().size(), g.c.size(),
                                    g.done ? " after its done" : ""));
          continue;
        }
        std::copy(chunk.data().begin(), chunk.data().end(), g.c.begin() + chunk.offset());
        g.bytes += chunk.data().size();
      } else if (message.has_done()) {
        if (g.done) {
          tally_->Wrong(fmt::format("{} ({}): gemm {} answered twice", kind, client_id_, id));
          continue;
        }
        g.done = true;
        g.code = message.done().status_code();
      }
    }
    writer.join();
    const grpc::Status s = stream->Finish();
    if (canceller) canceller->Stop();
    tally_->Count(kind, int(s.error_code()));
    const bool hung = mode != kDeadline && s.error_code() == StatusCode::DEADLINE_EXCEEDED;
    if (hung) {
      tally_->Lost(fmt::format("{} of {} GEMMs ({}): the stream did not end within {} s", kind,
                               count, client_id_, o_.call_timeout_s));
    }
    int64_t unanswered = 0;
    for (int i = 0; i < count; ++i) {
      const v1::GemmRequest& r = gemms[i];
      const Received& g = got[i];
      if (g.done) {
        tally_->Count(std::string(kind) + "_gemm", g.code);
        if (g.code != 0) continue;
        if (g.bytes != int64_t(g.c.size())) {
          tally_->Wrong(fmt::format("{} ({}): gemm {} {} done OK after {} of {} bytes of C", kind,
                                    client_id_, i, ShapeName(r.m(), r.n(), r.k()), g.bytes,
                                    g.c.size()));
        } else {
          Check(std::string(kind) + "_gemm", r, g.c);
        }
      } else if (s.ok() || hung) {
        tally_->Lost(fmt::format("{} ({}): gemm {} {} never answered; the stream ended {}", kind,
                                 client_id_, i, ShapeName(r.m(), r.n(), r.k()),
                                 StatusCodeName(int(s.error_code()))));
      } else {
        ++unanswered;  // the stream failed (cancelled, deadline, server refusal): expected
      }
    }
    tally_->Unanswered(unanswered);
  }

  // Upload A and B, multiply them by handle (unary, unary keeping C, or a stream), download a
  // kept C, release everything.
  void Resident() {
    std::uniform_int_distribution<uint32_t> dim(1, o_.max_dim);
    const uint32_t m = dim(rng_), n = dim(rng_), k = dim(rng_);
    const std::string a = HalfBytes(RandomHalfMatrix(int64_t(m) * k, rng_));
    const std::string b = HalfBytes(RandomHalfMatrix(int64_t(k) * n, rng_));
    const std::string shape = ShapeName(m, n, k);
    std::vector<std::string> held;
    v1::MatrixInfo info_a, info_b;
    grpc::Status sa = client_.UploadMatrix(m, k, a, &info_a, 600, "soak A", call_);
    CountSafe("upload", sa, "A of " + shape);
    if (sa.ok()) held.push_back(info_a.handle());
    grpc::Status sb = client_.UploadMatrix(k, n, b, &info_b, 600, "soak B", call_);
    CountSafe("upload", sb, "B of " + shape);
    if (sb.ok()) held.push_back(info_b.handle());

    if (sa.ok() && sb.ok()) {
      v1::GemmRequest r;
      r.set_m(m);
      r.set_n(n);
      r.set_k(k);
      r.set_a_handle(info_a.handle());
      r.set_b_handle(info_b.handle());
      const int how = std::uniform_int_distribution<int>(0, 3)(rng_);
      if (how == 3) {  // a one-GEMM stream naming both operands by handle
        std::vector<StreamedGemm> results;
        grpc::Status s = client_.GemmStream({&r}, &results, call_);
        CountSafe("stream", s, "by handle " + shape);
        const StreamedGemm& g = results[0];
        const bool answered = !(g.status.error_code() == StatusCode::UNKNOWN &&
                                g.status.error_message() == "no answer from the server");
        if (answered) {
          tally_->Count("stream_gemm", int(g.status.error_code()));
          if (g.status.ok()) Check("stream_gemm by handle", a, b, m, n, k, g.response.c());
        } else if (s.ok()) {
          tally_->Lost(fmt::format("stream by handle {} ({}): never answered", shape, client_id_));
        } else {
          tally_->Unanswered(1);
        }
      } else {
        r.set_keep_c_resident(how == 2);
        v1::GemmResponse response;
        grpc::Status s = client_.Gemm(r, &response, call_);
        CountSafe("gemm_by_handle", s, shape);
        if (s.ok() && !r.keep_c_resident()) Check("gemm_by_handle", a, b, m, n, k, response.c());
        if (s.ok() && r.keep_c_resident()) {
          const std::string c_handle = response.c_matrix().handle();
          held.push_back(c_handle);
          std::string c;
          grpc::Status sd = client_.DownloadMatrix(c_handle, &c, call_);
          CountSafe("download", sd, "kept C of " + shape);
          if (sd.ok()) Check("download of a kept C", a, b, m, n, k, c);
        }
      }
    }
    for (const std::string& handle : held) {
      grpc::Status s = client_.ReleaseMatrix(handle, call_);
      CountSafe("release", s, shape);
    }
  }

  const SoakOptions& o_;
  Tally* const tally_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GemmService::Stub> stub_;
  GemmClient client_;
  CallOptions call_;
  std::mt19937_64 rng_;
  const std::string client_id_;
  uint64_t next_id_ = 0;
};

}  // namespace

std::string StatusCodeName(int code) {
  return code >= 0 && code <= int(grpc::StatusCode::UNAUTHENTICATED) ? hgemm::StatusCodeName(code)
                                                                     : fmt::format("code {}", code);
}

SoakResult RunSoak(const SoakOptions& options) {
  SoakOptions o = options;
  if (o.client_id_prefix.empty()) o.client_id_prefix = fmt::format("soak-{}", getpid());
  Tally tally(o.requests, o.max_seconds);
  std::vector<std::unique_ptr<SoakClient>> clients;
  for (int i = 0; i < o.clients; ++i) clients.push_back(std::make_unique<SoakClient>(o, i, &tally));
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (auto& c : clients) threads.emplace_back([&c] { c->Run(); });
  for (std::thread& t : threads) t.join();
  SoakResult result;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  tally.Fill(&result);
  return result;
}

std::string FormatSoakResult(const SoakResult& r, const SoakOptions& o) {
  std::set<int> codes;
  std::vector<std::string> kinds;
  for (const auto& [key, count] : r.by_kind_status) {
    codes.insert(key.second);
    if (std::find(kinds.begin(), kinds.end(), key.first) == kinds.end()) kinds.push_back(key.first);
  }
  std::string out = fmt::format("{:<22}", "kind \\ status");
  for (int code : codes) out += fmt::format(" {:>18}", StatusCodeName(code));
  out += fmt::format(" {:>9}\n", "total");
  std::map<int, int64_t> column_totals;
  for (const std::string& kind : kinds) {
    int64_t total = 0;
    out += fmt::format("{:<22}", kind);
    for (int code : codes) {
      auto it = r.by_kind_status.find({kind, code});
      const int64_t n = it == r.by_kind_status.end() ? 0 : it->second;
      total += n;
      column_totals[code] += n;
      out += fmt::format(" {:>18}", n);
    }
    out += fmt::format(" {:>9}\n", total);
  }
  out += fmt::format("{:<22}", "all");
  for (int code : codes) out += fmt::format(" {:>18}", column_totals[code]);
  out += fmt::format(" {:>9}\n", r.requests);
  out += fmt::format(
      "requests {} in {:.1f} s ({:.0f}/s), {} clients, shapes up to {}x{}x{}\n"
      "lost responses: {}\nwrong results: {}\n"
      "verified Cs: {} (max relative Frobenius error {:.2e}, tolerance {:.0e})\n"
      "streamed GEMMs left unanswered by a failed (cancelled/expired/refused) stream: {}\n",
      r.requests, r.seconds, r.requests / std::max(r.seconds, 1e-9), o.clients, o.max_dim,
      o.max_dim, o.max_dim, r.lost, r.wrong, r.verified, r.max_error, o.tolerance, r.unanswered);
  if (o.weight_large > 0) {
    out += fmt::format(
        "large GEMMs up to {0}x{0}x{0} (weight {1}); Cs over {2} multiply-adds "
        "checked with Freivalds' test (2 random vectors)\n",
        o.large_max_dim, o.weight_large, o.full_check_max_mnk);
  }
  out += fmt::format("{:<22} {:>9} {:>10} {:>10} {:>10}\n", "action (client ms)", "count", "p50",
                     "p99", "max");
  for (const auto& [action, samples] : r.action_ms) {
    std::vector<double> sorted = samples;
    std::sort(sorted.begin(), sorted.end());
    out += fmt::format("{:<22} {:>9} {:>10.2f} {:>10.2f} {:>10.2f}\n", action, sorted.size(),
                       Percentile(sorted, 50), Percentile(sorted, 99), sorted.back());
  }
  for (const std::string& p : r.problems) out += "  " + p + "\n";
  return out;
}

double FreivaldsError(const uint16_t* a, const uint16_t* b, const uint16_t* c, int64_t m, int64_t n,
                      int64_t k, int vectors, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1, 1);
  std::vector<double> x(n), bx(k);
  std::vector<float> row(std::max({m, n, k}));  // one row of fp16 as float at a time
  // Σ over vectors and rows of (C·x − A·(B·x))ᵢ², and of Σⱼ (cᵢⱼ·xⱼ)²: the same sums an
  // error-free C and the errors' own sizes would give, so their ratio estimates C's relative
  // Frobenius error (normalizing by ‖A·(B·x)‖ instead would divide by a sum that can cancel).
  double num = 0, den = 0;
  for (int v = 0; v < vectors; ++v) {
    for (double& xi : x) xi = uniform(rng);
    for (int64_t i = 0; i < k; ++i) {  // B·x
      HalfToFloat(b + i * n, row.data(), size_t(n));
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += double(row[j]) * x[j];
      bx[i] = sum;
    }
    for (int64_t i = 0; i < m; ++i) {  // A·(B·x) and C·x, row by row
      HalfToFloat(a + i * k, row.data(), size_t(k));
      double abx = 0;
      for (int64_t j = 0; j < k; ++j) abx += double(row[j]) * bx[j];
      HalfToFloat(c + i * n, row.data(), size_t(n));
      double cx = 0, scale = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double term = double(row[j]) * x[j];
        cx += term;
        scale += term * term;
      }
      num += (cx - abx) * (cx - abx);
      den += scale;
    }
  }
  // A NaN or Inf in C gives NaN (and !(NaN <= tolerance) fails the check). A C that is
  // exactly zero is right only if A·B·x is too.
  if (std::isnan(num) || std::isnan(den)) return std::numeric_limits<double>::quiet_NaN();
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? 1 : 0);
}

ProcessMemory ReadProcessMemory(int pid) {
  ProcessMemory m;
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = -1;
    fields >> key >> kib;
    if (key == "VmRSS:") m.rss_kib = kib;
    if (key == "VmHWM:") m.hwm_kib = kib;
  }
  return m;
}

}  // namespace hgemm::bench
