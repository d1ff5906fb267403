#include "bench/hgemm_load.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "client/gemm_client.h"
#include "kernels/host/cpu_gemm.h"

namespace hgemm::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

constexpr int kWrongReplySize = -1;  // a "status code" for a reply whose C has the wrong size

// One completed call.
struct Sample {
  double end_s = 0;       // since the point started
  double latency_ms = 0;  // send (or scheduled send) → reply complete
  int shape = 0;
  int code = 0;           // 0: OK; a gRPC status code; kWrongReplySize
  double queue_ms = 0, h2d_ms = 0, kernel_ms = 0, d2h_ms = 0, total_ms = 0;
};

void CopyTiming(const v1::Timing& t, Sample* s) {
  s->queue_ms = t.queue_wait_ms();
  s->h2d_ms = t.host_to_device_ms();
  s->kernel_ms = t.kernel_ms();
  s->d2h_ms = t.device_to_host_ms();
  s->total_ms = t.server_total_ms();
}

}  // namespace

std::string Shape::Name() const { return fmt::format("{}x{}x{}", m, n, k); }

std::string ParseShapes(const std::string& text, std::vector<Shape>* shapes) {
  shapes->clear();
  static const std::regex kShape(R"((\d+)x(\d+)x(\d+)(?::(\d+))?)");
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    std::smatch match;
    if (!std::regex_match(item, match, kShape)) {
      return fmt::format("shape '{}': expected MxNxK or MxNxK:WEIGHT", item);
    }
    Shape s;
    const unsigned long long m = std::stoull(match[1]), n = std::stoull(match[2]),
                             k = std::stoull(match[3]);
    if (m == 0 || n == 0 || k == 0 || m > UINT32_MAX || n > UINT32_MAX || k > UINT32_MAX) {
      return fmt::format("shape '{}': dimensions must be in [1, 2^32)", item);
    }
    s.m = m, s.n = n, s.k = k;
    if (match[4].matched) s.weight = std::stoi(match[4]);
    if (s.weight < 1) return fmt::format("shape '{}': weight must be ≥ 1", item);
    shapes->push_back(s);
  }
  return shapes->empty() ? "no shapes" : "";
}

std::string ParseIntList(const std::string& text, std::vector<int>* values) {
  values->clear();
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!std::regex_match(item, std::regex(R"(\d+)")) || std::stoll(item) < 1 ||
        std::stoll(item) > 100000) {
      return fmt::format("'{}': expected a whole number in [1, 100000]", item);
    }
    values->push_back(std::stoi(item));
  }
  return values->empty() ? "empty list" : "";
}

std::string ParseDoubleList(const std::string& text, std::vector<double>* values) {
  values->clear();
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v > 0)) {
      return fmt::format("'{}': expected a positive number", item);
    }
    values->push_back(v);
  }
  return values->empty() ? "empty list" : "";
}

const char* ModeName(Mode mode) { return mode == Mode::kUnary ? "unary" : "stream"; }
const char* TargetName(Target target) { return target == Target::kService ? "service" : "echo"; }

const char* ResidentName(Resident resident) {
  switch (resident) {
    case Resident::kB: return "b";
    case Resident::kAll: return "all";
    default: return "none";
  }
}

bool ParseResident(const std::string& text, Resident* resident) {
  if (text == "none") *resident = Resident::kNone;
  else if (text == "b") *resident = Resident::kB;
  else if (text == "all") *resident = Resident::kAll;
  else return false;
  return true;
}

int64_t SentBytes(const Shape& shape, Resident resident) {
  switch (resident) {
    case Resident::kB: return shape.ABytes();
    case Resident::kAll: return 0;
    default: return shape.RequestBytes();
  }
}

int64_t ReceivedBytes(const Shape& shape, Resident resident) {
  return resident == Resident::kAll ? 0 : shape.ReplyBytes();
}

double Percentile(const std::vector<double>& sorted, double p) {
  const double rank = std::ceil(p / 100.0 * sorted.size());
  const size_t index = std::clamp<size_t>(rank < 1 ? 0 : size_t(rank) - 1, 0, sorted.size() - 1);
  return sorted[index];
}

namespace load_internal {

// The operands of one shape, in the message forms the callers send.
struct Payload {
  Shape shape;
  v1::GemmRequest gemm;  // m, n, k, a, b, options: all bytes (also the Verify reference)
  EchoRequest echo;      // payload = the operand bytes the service calls send, reply_bytes = C's
};

}  // namespace load_internal

// All samples of a point, in completion order. Thread-safe.
class LoadGenerator::Recorder {
 public:
  void Add(const Sample& s, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(s);
    if (s.code != 0 && first_error_.empty()) first_error_ = error;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_.size();
  }
  std::vector<Sample> Slice(size_t begin, size_t end) const {
    std::lock_guard<std::mutex> lock(mu_);
    end = std::min(end, samples_.size());
    return std::vector<Sample>(samples_.begin() + std::min(begin, end), samples_.begin() + end);
  }
  std::string first_error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Sample> samples_;  // guarded by mu_
  std::string first_error_;      // guarded by mu_
};

namespace load_internal {

// Makes one call at a time for one worker: fills a Sample's code and server timing.
class Caller {
 public:
  // Releases the kept Cs still held.
  virtual ~Caller() {
    Tidy();
    Release(&kept_c_);
  }
  // One GEMM: `request` is what goes on the wire (bytes or handles), `p` its shape and echo form.
  virtual void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) = 0;
  // After a successful service call: C (unless kept) and where it ran.
  const std::string& reply() const { return reply_; }
  const v1::Execution& execution() const { return execution_; }
  const std::string& error() const { return error_; }
  // The handle of the last call's kept C (keep_c_resident), until the next kept C replaces it.
  const std::string& kept_c() const { return kept_c_; }
  // Between calls, outside the measured latency: releases the kept C that the last call's
  // replaced (a ring of one per worker: at most two kept Cs per worker exist at any time).
  void Tidy() { Release(&previous_c_); }

 protected:
  void SetError(int code, const std::string& message, Sample* s) {
    s->code = code;
    error_ = fmt::format("{} (code {})", message, code);
  }
  void SetStatus(const grpc::Status& status, Sample* s) {
    if (status.ok()) {
      s->code = 0;
    } else {
      SetError(int(status.error_code()), status.error_message(), s);
    }
  }
  // C's bytes when it comes back; none (and a kept C of m×n) when keep_c_resident.
  void CheckSize(const Payload& p, const v1::GemmRequest& r, size_t got, Sample* s) {
    const int64_t expected = r.keep_c_resident() ? 0 : p.shape.ReplyBytes();
    if (s->code == 0 && int64_t(got) != expected) {
      SetError(kWrongReplySize, fmt::format("reply of {} bytes, expected {}", got, expected), s);
    }
  }
  void CheckKept(const Payload& p, const v1::GemmRequest& r, const v1::MatrixInfo& c, Sample* s) {
    if (s->code != 0 || !r.keep_c_resident()) return;
    if (c.handle().empty() || c.rows() != p.shape.m || c.cols() != p.shape.n) {
      return SetError(kWrongReplySize,
                      fmt::format("kept C '{}' of {}x{}, expected {}x{}", c.handle(), c.rows(),
                                  c.cols(), p.shape.m, p.shape.n), s);
    }
    if (!previous_c_.empty()) Release(&previous_c_);  // only if Tidy was skipped
    previous_c_.swap(kept_c_);
    kept_c_ = c.handle();
  }
  // Service callers: where kept Cs are released, as client `client_id`.
  void EnableRelease(const GemmClient& client, const std::string& client_id, double timeout_s) {
    releaser_ = std::make_unique<GemmClient>(client);
    release_options_.client_id = client_id;
    release_options_.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
  }

  std::string reply_;
  v1::Execution execution_;
  std::string error_;

 private:
  void Release(std::string* handle) {
    if (handle->empty()) return;
    if (releaser_) releaser_->ReleaseMatrix(*handle, release_options_);  // best effort (TTL)
    handle->clear();
  }

  std::unique_ptr<GemmClient> releaser_;
  CallOptions release_options_;
  std::string kept_c_, previous_c_;
};

}  // namespace load_internal

namespace {

using load_internal::Caller;
using load_internal::Payload;

// GemmService.Gemm through the client library.
class ServiceUnaryCaller final : public Caller {
 public:
  ServiceUnaryCaller(const GemmClient& client, double timeout_s, const std::string& client_id)
      : client_(client) {
    options_.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
    options_.client_id = client_id;
    EnableRelease(client, client_id, timeout_s);
  }
  void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) override {
    SetStatus(client_.Gemm(request, &response_, options_), s);
    if (s->code != 0) return;
    CheckSize(p, request, response_.c().size(), s);
    CheckKept(p, request, response_.c_matrix(), s);
    CopyTiming(response_.timing(), s);
    reply_.swap(*response_.mutable_c());
    execution_ = response_.execution();
  }

 private:
  GemmClient client_;
  CallOptions options_;
  v1::GemmResponse response_;
};

// EchoService.Echo with the same payload sizes.
class EchoUnaryCaller final : public Caller {
 public:
  EchoUnaryCaller(std::shared_ptr<grpc::Channel> channel, double timeout_s)
      : stub_(EchoService::NewStub(std::move(channel))), timeout_s_(timeout_s) {}
  void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(int64_t(timeout_s_ * 1000)));
    SetStatus(stub_->Echo(&context, p.echo, &response_), s);
    CheckSize(p, request, response_.payload().size(), s);
  }

 private:
  std::unique_ptr<EchoService::Stub> stub_;
  const double timeout_s_;
  EchoReply response_;
};

// Operand bytes as GemmStream sends them (WriteStreamedGemm): A in chunks, then B in chunks;
// none for an operand given by handle. The echo stream moves the same chunks.
int64_t OperandBytes(const v1::GemmRequest& r) {
  return int64_t(r.a().size() + r.b().size());  // a handle leaves its oneof's bytes empty
}
template <typename WriteChunk>
bool WriteOperands(const v1::GemmRequest& r, int64_t chunk_bytes, WriteChunk write) {
  for (auto [operand, bytes] :
       {std::pair{v1::OPERAND_A, &r.a()}, std::pair{v1::OPERAND_B, &r.b()}}) {
    for (size_t offset = 0; offset < bytes->size(); offset += chunk_bytes) {
      const size_t n = std::min<size_t>(chunk_bytes, bytes->size() - offset);
      if (!write(operand, offset, bytes->data() + offset, n)) return false;
    }
  }
  return true;
}

// What the stream callers share: one stream per worker and route (the replica the GEMM's
// handles live on; "" for calls naming none), open for the whole point, one call in flight on
// it. A broken stream is finished (its status is the call's) and the next call on its route
// opens a new one.
template <typename Request, typename Reply>
class StreamCaller : public Caller {
 protected:
  using Stream = grpc::ClientReaderWriter<Request, Reply>;
  using Open = std::function<std::unique_ptr<Stream>(grpc::ClientContext*, const std::string& route)>;

  StreamCaller(std::chrono::system_clock::time_point deadline, std::string client_id, Open open)
      : deadline_(deadline), client_id_(std::move(client_id)), open_(std::move(open)) {}
  ~StreamCaller() override {
    for (auto& [route, open] : streams_) {
      current_ = &open;
      open.stream->WritesDone();
      Drain();
    }
  }

  // The open stream to `route` (opened now if there is none) and the id of the next call on it.
  Stream* Next(const std::string& route, uint64_t* id) {
    current_ = &streams_[route];
    if (!current_->stream) {
      current_->context = std::make_unique<grpc::ClientContext>();
      current_->context->set_deadline(deadline_);
      if (!client_id_.empty()) current_->context->AddMetadata("x-client-id", client_id_);
      current_->stream = open_(current_->context.get(), route);
    }
    *id = next_id_++;
    return current_->stream.get();
  }
  // Drain, Broken and ProtocolError act on the stream of the last Next().
  void Drain() {
    while (current_->stream->Read(&response_)) {
    }
    status_ = current_->stream->Finish();
    current_->stream.reset();
    current_->context.reset();
  }
  void Broken(Sample* s) {
    Drain();
    SetStatus(status_.ok() ? grpc::Status(grpc::StatusCode::UNKNOWN, "stream ended early") : status_, s);
  }
  // An answer that does not fit the call: the stream can't be trusted any more; cancel it and
  // let the next call open a new one.
  void ProtocolError(int code, const std::string& message, Sample* s) {
    current_->context->TryCancel();
    Drain();
    SetError(code, message, s);
  }
  const grpc::Status& last_stream_status() const { return status_; }

  Reply response_;

 private:
  struct OpenStream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<Stream> stream;
  };
  const std::chrono::system_clock::time_point deadline_;
  const std::string client_id_;
  const Open open_;
  std::map<std::string, OpenStream> streams_;  // by route
  OpenStream* current_ = nullptr;              // the last Next()'s
  grpc::Status status_;
  uint64_t next_id_ = 0;
};

// GemmService.GemmStream: each call writes one GEMM and reads its C chunks and done.
class ServiceStreamCaller final
    : public StreamCaller<v1::GemmStreamRequest, v1::GemmStreamResponse> {
 public:
  ServiceStreamCaller(const GemmClient& client, std::chrono::system_clock::time_point deadline,
                      int64_t chunk_bytes, const std::string& client_id, double timeout_s)
      : StreamCaller(deadline, client_id,
                     [client](grpc::ClientContext* context, const std::string& route) {
                       return v1::GemmService::NewStub(client.ChannelTo(route))->GemmStream(context);
                     }),
        chunk_bytes_(chunk_bytes) {
    EnableRelease(client, client_id, timeout_s);
  }

  void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) override {
    std::string replica;
    if (grpc::Status routed = GemmClient::ReplicaOf(request, &replica); !routed.ok()) {
      return SetStatus(routed, s);
    }
    uint64_t id;
    Stream* stream = Next(replica, &id);
    if (!WriteStreamedGemm(request, id, chunk_bytes_, stream)) return Broken(s);
    reply_.resize(request.keep_c_resident() ? 0 : p.shape.ReplyBytes());
    size_t received = 0;
    while (stream->Read(&response_)) {
      if (response_.gemm_id() != id) {
        return ProtocolError(int(grpc::StatusCode::INTERNAL),
                             fmt::format("answer for gemm_id {}, expected {}", response_.gemm_id(), id), s);
      }
      if (response_.has_chunk()) {
        const std::string& data = response_.chunk().data();
        if (response_.chunk().offset() + data.size() > reply_.size()) {
          return ProtocolError(kWrongReplySize, "result chunk past the end of C", s);
        }
        std::memcpy(reply_.data() + response_.chunk().offset(), data.data(), data.size());
        received += data.size();
      } else if (response_.has_done()) {
        const v1::GemmDone& done = response_.done();
        SetStatus(grpc::Status(grpc::StatusCode(done.status_code()), done.status_message()), s);
        CheckSize(p, request, received, s);
        CheckKept(p, request, done.c_matrix(), s);
        CopyTiming(done.timing(), s);
        execution_ = done.execution();
        return;
      }
    }
    Broken(s);
  }

 private:
  const int64_t chunk_bytes_;
};

// EchoService.EchoStream, the same shape of traffic as ServiceStreamCaller: the same chunks up,
// replies in the server's chunk size down, reassembled into one buffer as C is.
class EchoStreamCaller final : public StreamCaller<EchoStreamRequest, EchoStreamReply> {
 public:
  EchoStreamCaller(std::shared_ptr<grpc::Channel> channel,
                   std::chrono::system_clock::time_point deadline, int64_t chunk_bytes,
                   int64_t reply_chunk_bytes)
      : StreamCaller(deadline, "",
                     [stub = std::shared_ptr(EchoService::NewStub(std::move(channel)))](
                         grpc::ClientContext* context, const std::string&) {
                       return stub->EchoStream(context);
                     }),
        chunk_bytes_(chunk_bytes),
        reply_chunk_bytes_(reply_chunk_bytes) {}

  void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) override {
    uint64_t id;
    Stream* stream = Next("", &id);
    EchoStreamRequest message;
    EchoHeader* header = message.mutable_header();
    header->set_call_id(id);
    const int64_t reply_bytes = request.keep_c_resident() ? 0 : p.shape.ReplyBytes();
    header->set_request_bytes(OperandBytes(request));
    header->set_reply_bytes(reply_bytes);
    header->set_reply_chunk_bytes(reply_chunk_bytes_);
    bool ok = stream->Write(message);
    ok = ok && WriteOperands(request, chunk_bytes_,
                             [&](v1::Operand, size_t, const char* data, size_t n) {
                               message.set_data(data, n);
                               return stream->Write(message);
                             });
    if (!ok) return Broken(s);
    reply_.resize(reply_bytes);
    size_t received = 0;
    while (stream->Read(&response_)) {
      if (response_.call_id() != id) {
        return ProtocolError(int(grpc::StatusCode::INTERNAL), "answer for another call", s);
      }
      const std::string& data = response_.data();
      if (received + data.size() > reply_.size()) {
        return ProtocolError(kWrongReplySize, "reply past the end", s);
      }
      std::memcpy(reply_.data() + received, data.data(), data.size());
      received += data.size();
      if (response_.done()) {
        s->code = 0;
        CheckSize(p, request, received, s);
        return;
      }
    }
    Broken(s);
  }

 private:
  const int64_t chunk_bytes_;
  const int64_t reply_chunk_bytes_;
};

// Statistics of the successful samples among `samples` (of one shape, or all if shape < 0).
// The server breakdown only for `kind` kService (the echo reports no timing).
PointStats Summarize(const std::vector<Sample>& samples, int shape, double seconds,
                     const std::vector<Shape>& shapes, Target kind, Resident resident) {
  PointStats st;
  st.shape = shape >= 0 ? shapes[shape].Name() : shapes.size() == 1 ? shapes[0].Name() : "mix";
  st.seconds = seconds;
  std::vector<double> latencies;
  double flops = 0, bytes = 0, sum = 0;
  for (const Sample& s : samples) {
    if (shape >= 0 && s.shape != shape) continue;
    if (s.code != 0) {
      ++st.errors;
      continue;
    }
    latencies.push_back(s.latency_ms);
    sum += s.latency_ms;
    bytes += double(SentBytes(shapes[s.shape], resident) + ReceivedBytes(shapes[s.shape], resident));
    if (kind != Target::kService) continue;
    flops += shapes[s.shape].Flops();
    ServerBreakdown& b = st.server;
    ++b.count;
    b.queue_ms += s.queue_ms;
    b.h2d_ms += s.h2d_ms;
    b.kernel_ms += s.kernel_ms;
    b.d2h_ms += s.d2h_ms;
    b.total_ms += s.total_ms;
  }
  st.requests = int64_t(latencies.size());
  if (st.requests == 0) return st;
  ServerBreakdown& b = st.server;
  if (b.count > 0) {
    for (double* v : {&b.queue_ms, &b.h2d_ms, &b.kernel_ms, &b.d2h_ms, &b.total_ms}) *v /= b.count;
  }
  std::sort(latencies.begin(), latencies.end());
  st.p50_ms = Percentile(latencies, 50);
  st.p90_ms = Percentile(latencies, 90);
  st.p99_ms = Percentile(latencies, 99);
  st.min_ms = latencies.front();
  st.max_ms = latencies.back();
  st.mean_ms = sum / st.requests;
  if (seconds > 0) {
    st.requests_per_s = st.requests / seconds;
    st.gflops = flops / seconds / 1e9;
    st.payload_gb_per_s = bytes / seconds / 1e9;
  }
  return st;
}

}  // namespace

LoadGenerator::LoadGenerator(LoadOptions options) : options_(std::move(options)) {
  if (options_.client_id.empty()) options_.client_id = fmt::format("hgemm_load-{}", ::getpid());
  std::mt19937_64 rng(options_.seed);
  for (const Shape& shape : options_.shapes) {
    auto p = std::make_unique<Payload>();
    p->shape = shape;
    const std::vector<uint16_t> a = RandomHalfMatrix(int64_t(shape.m) * shape.k, rng);
    const std::vector<uint16_t> b = RandomHalfMatrix(int64_t(shape.k) * shape.n, rng);
    p->gemm.set_m(shape.m);
    p->gemm.set_n(shape.n);
    p->gemm.set_k(shape.k);
    p->gemm.set_a(reinterpret_cast<const char*>(a.data()), 2 * a.size());
    p->gemm.set_b(reinterpret_cast<const char*>(b.data()), 2 * b.size());
    p->gemm.mutable_options()->set_kernel(options_.kernel);
    p->gemm.mutable_options()->set_accumulation(options_.accumulation);
    std::string* payload = p->echo.mutable_payload();
    payload->reserve(SentBytes(shape, options_.resident));
    if (options_.resident != Resident::kAll) payload->append(p->gemm.a());
    if (options_.resident == Resident::kNone) payload->append(p->gemm.b());
    p->echo.set_reply_bytes(ReceivedBytes(shape, options_.resident));
    payloads_.push_back(std::move(p));
  }
}

LoadGenerator::~LoadGenerator() = default;

std::shared_ptr<grpc::Channel> LoadGenerator::MakeChannel(const std::string& target,
                                                          ConnectOptions connect) {
  connect.private_subchannels = true;
  return Connect(target, connect);
}

GemmClient LoadGenerator::MakeClient(const std::string& target, ConnectOptions connect) {
  connect.private_subchannels = true;
  return GemmClient(target, connect);
}

std::unique_ptr<load_internal::Caller> LoadGenerator::MakeCaller(
    Target kind, const GemmClient& client,
    std::chrono::system_clock::time_point stream_deadline) const {
  const LoadOptions& o = options_;
  if (kind == Target::kService) {
    if (o.mode == Mode::kUnary) {
      return std::make_unique<ServiceUnaryCaller>(client, o.call_timeout_s, o.client_id);
    }
    return std::make_unique<ServiceStreamCaller>(client, stream_deadline, o.chunk_bytes,
                                                 o.client_id, o.call_timeout_s);
  }
  if (o.mode == Mode::kUnary) {
    return std::make_unique<EchoUnaryCaller>(client.ChannelTo(""), o.call_timeout_s);
  }
  return std::make_unique<EchoStreamCaller>(client.ChannelTo(""), stream_deadline, o.chunk_bytes,
                                            o.reply_chunk_bytes);
}

std::string LoadGenerator::PrepareRequests(Target kind, const GemmClient& client,
                                           std::vector<const v1::GemmRequest*>* requests,
                                           std::vector<std::unique_ptr<v1::GemmRequest>>* owned,
                                           std::vector<std::string>* uploaded, int* code) const {
  const Resident resident = options_.resident;
  requests->clear();
  if (resident == Resident::kNone) {
    for (const auto& p : payloads_) requests->push_back(&p->gemm);
    return "";
  }
  CallOptions call;
  call.client_id = options_.client_id;
  call.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  // A handle for one operand: uploaded (service), or a placeholder the echo never sends.
  auto handle = [&](const Shape& shape, const char* which, uint32_t rows, uint32_t cols,
                    const std::string& data, std::string* out) -> std::string {
    if (kind == Target::kEcho) {
      *out = "echo-placeholder";
      return "";
    }
    v1::MatrixInfo info;
    const grpc::Status status = client.UploadMatrix(
        rows, cols, data, &info, /*ttl_seconds=*/0,
        fmt::format("hgemm_load {} of {}", which, shape.Name()), call);
    if (!status.ok()) {
      *code = int(status.error_code());
      return fmt::format("UploadMatrix {} of {}: {} (code {})", which, shape.Name(),
                         status.error_message(), *code);
    }
    uploaded->push_back(info.handle());
    *out = info.handle();
    call.replica = info.replica();  // the shape's other operand goes where this one lives
    return "";
  };
  for (const auto& p : payloads_) {
    const Shape& shape = p->shape;
    auto r = std::make_unique<v1::GemmRequest>();
    r->set_m(shape.m);
    r->set_n(shape.n);
    r->set_k(shape.k);
    *r->mutable_options() = p->gemm.options();
    call.replica.clear();  // each shape's first upload is balanced
    std::string e;
    if (resident == Resident::kAll) {
      e = handle(shape, "A", shape.m, shape.k, p->gemm.a(), r->mutable_a_handle());
      r->set_keep_c_resident(true);
    } else {
      r->set_a(p->gemm.a());
    }
    if (e.empty()) e = handle(shape, "B", shape.k, shape.n, p->gemm.b(), r->mutable_b_handle());
    if (!e.empty()) return e;
    requests->push_back(r.get());
    owned->push_back(std::move(r));
  }
  return "";
}

void LoadGenerator::ReleaseUploads(const GemmClient& client,
                                   const std::vector<std::string>& handles) const {
  if (handles.empty()) return;
  CallOptions call;
  call.client_id = options_.client_id;
  call.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  for (const std::string& h : handles) client.ReleaseMatrix(h, call);  // best effort
}

VerifyResult LoadGenerator::Verify(const std::string& target, int per_shape) {
  VerifyResult result;
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000)) *
                            (per_shape * payloads_.size() + 1);
  const GemmClient client = MakeClient(target, options_.connect);
  std::vector<const v1::GemmRequest*> requests;
  std::vector<std::unique_ptr<v1::GemmRequest>> owned;
  std::vector<std::string> uploaded;
  int code = 0;
  if (std::string e = PrepareRequests(Target::kService, client, &requests, &owned, &uploaded, &code);
      !e.empty()) {
    ReleaseUploads(client, uploaded);
    result.checked = result.failed = 1;
    result.lines.push_back(e);
    return result;
  }
  CallOptions download_options;
  download_options.client_id = options_.client_id;
  download_options.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  std::string kept_c;
  std::unique_ptr<Caller> caller = MakeCaller(Target::kService, client, deadline);
  std::mt19937_64 rng(options_.seed ^ 0x5eed);
  for (size_t shape_index = 0; shape_index < payloads_.size(); ++shape_index) {
    const auto& p = payloads_[shape_index];
    const Shape& shape = p->shape;
    for (int i = 0; i < per_shape; ++i) {
      ++result.checked;
      Sample s;
      caller->Call(*p, *requests[shape_index], &s);
      caller->Tidy();
      if (s.code != 0) {
        ++result.failed;
        result.lines.push_back(fmt::format("{}: call failed: {}", shape.Name(), caller->error()));
        continue;
      }
      const std::string* c_bytes = &caller->reply();
      if (requests[shape_index]->keep_c_resident()) {
        // C stayed on the server: fetch it (as a chain's last step would).
        const grpc::Status status =
            client.DownloadMatrix(caller->kept_c(), &kept_c, download_options);
        if (!status.ok() || int64_t(kept_c.size()) != shape.ReplyBytes()) {
          ++result.failed;
          result.lines.push_back(fmt::format(
              "{}: DownloadMatrix of the kept C failed: {} (code {}), {} bytes", shape.Name(),
              status.error_message(), int(status.error_code()), kept_c.size()));
          continue;
        }
        c_bytes = &kept_c;
      }
      int64_t rows = shape.m, row0 = 0;
      if (shape.Flops() / 2 > double(int64_t{1} << 27)) {
        rows = std::min<int64_t>(shape.m, 16);
        row0 = int64_t(rng() % uint64_t(shape.m - rows + 1));
      }
      const auto* a = reinterpret_cast<const uint16_t*>(p->gemm.a().data());
      const auto* b = reinterpret_cast<const uint16_t*>(p->gemm.b().data());
      const auto* c = reinterpret_cast<const uint16_t*>(c_bytes->data());
      const std::vector<float> reference =
          ReferenceGemm(a + row0 * shape.k, b, rows, shape.n, shape.k);
      const double error =
          RelativeFrobeniusError(c + row0 * shape.n, reference.data(), rows * int64_t(shape.n));
      const v1::Execution& e = caller->execution();
      const double tolerance = e.accumulation() == v1::ACCUMULATION_FP16 ? 2e-2 : 1e-3;
      const bool ok = error <= tolerance;
      if (!ok) ++result.failed;
      result.max_error = std::max(result.max_error, error);
      result.lines.push_back(fmt::format(
          "{} rows {}..{}{}: kernel {} ({}) on {} [{}], relative error {:.2e} (tolerance {:.0e}): {}",
          shape.Name(), row0, row0 + rows - 1,
          options_.resident == Resident::kNone ? ""
          : options_.resident == Resident::kB  ? " (B resident)"
                                               : " (A, B resident; kept C downloaded)",
          e.kernel(),
          e.accumulation() == v1::ACCUMULATION_FP16 ? "fp16" : "fp32",
          e.device_name().empty() ? "-" : e.device_name(), e.backend().empty() ? "-" : e.backend(),
          error, tolerance, ok ? "OK" : "FAILED"));
    }
  }
  caller.reset();  // releases its kept C
  ReleaseUploads(client, uploaded);
  return result;
}

PointResult LoadGenerator::RunPoint(Target kind, const std::string& target, int concurrency,
                                    double rate_per_s) {
  const LoadOptions& o = options_;
  PointResult result;
  result.target = kind;
  result.mode = o.mode;
  result.resident = o.resident;
  result.concurrency = concurrency;
  result.rate_per_s = rate_per_s;
  for (const Shape& shape : o.shapes) {
    result.shapes += (result.shapes.empty() ? "" : ",") + shape.Name() +
                     (o.shapes.size() > 1 ? fmt::format(":{}", shape.weight) : "");
  }

  const int per_channel = o.workers_per_channel <= 0 ? concurrency : o.workers_per_channel;
  std::vector<GemmClient> clients;  // one channel to the target each, and their replicas'
  for (int i = 0; i < (concurrency + per_channel - 1) / per_channel; ++i) {
    clients.push_back(MakeClient(target, kind == Target::kService ? o.connect : ConnectOptions{}));
  }
  std::vector<int> weights;
  for (const auto& p : payloads_) weights.push_back(p->shape.weight);

  // Resident operands: uploaded once per shape for all workers, before the warm-up.
  std::vector<const v1::GemmRequest*> requests;
  std::vector<std::unique_ptr<v1::GemmRequest>> owned;
  std::vector<std::string> uploaded;
  {
    const Clock::time_point upload_start = Clock::now();
    int code = 0;
    std::string e = PrepareRequests(kind, clients[0], &requests, &owned, &uploaded, &code);
    result.upload_s = Seconds(Clock::now() - upload_start);
    std::set<std::string> replicas;
    for (const std::string& handle : uploaded) {
      if (std::string replica = GemmClient::ReplicaOf(handle); !replica.empty()) replicas.insert(replica);
    }
    result.upload_replicas.assign(replicas.begin(), replicas.end());
    if (!e.empty()) {
      ReleaseUploads(clients[0], uploaded);
      result.first_error = e;
      result.error_codes[code] = 1;
      result.stats.push_back(Summarize({}, -1, 0, o.shapes, kind, o.resident));
      return result;
    }
  }

  const auto stream_deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(int64_t((o.max_point_s + o.call_timeout_s) * 1000));
  const Clock::time_point start = Clock::now();
  const Clock::time_point hard_end = start + std::chrono::milliseconds(int64_t(o.max_point_s * 1000));
  Recorder recorder;
  std::atomic<bool> stop{false};
  std::atomic<int> warm_workers{0};
  std::atomic<int64_t> next_ticket{0};
  std::mutex stop_mu;
  std::condition_variable stop_cv;

  auto worker = [&](int index) {
    std::unique_ptr<Caller> caller = MakeCaller(kind, clients[index / per_channel], stream_deadline);
    std::mt19937_64 rng(o.seed + 7919 * (index + 1));
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    bool warm = false;
    while (!stop.load()) {
      Clock::time_point begin = Clock::now();
      if (rate_per_s > 0) {
        const int64_t ticket = next_ticket++;
        begin = start + std::chrono::nanoseconds(int64_t(ticket * 1e9 / rate_per_s));
        if (begin >= hard_end) break;
        std::unique_lock<std::mutex> lock(stop_mu);
        if (stop_cv.wait_until(lock, begin, [&] { return stop.load(); })) break;
      }
      Sample s;
      s.shape = pick(rng);
      caller->Call(*payloads_[s.shape], *requests[s.shape], &s);
      const Clock::time_point end = Clock::now();
      s.end_s = Seconds(end - start);
      s.latency_ms = Seconds(end - begin) * 1e3;
      recorder.Add(s, caller->error());
      caller->Tidy();  // releases the previous kept C, outside the measured latency
      if (!warm) {
        warm = true;
        ++warm_workers;
      }
      // The server says "not now" (queue full): back off a little instead of spinning.
      if (s.code == int(grpc::StatusCode::UNAVAILABLE) ||
          s.code == int(grpc::StatusCode::RESOURCE_EXHAUSTED)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < concurrency; ++i) threads.emplace_back(worker, i);

  auto elapsed = [&] { return Seconds(Clock::now() - start); };
  const auto poll = std::chrono::milliseconds(5);
  // Warm-up: connections, streams, the server's per-shape kernel choice and buffers.
  while (elapsed() < o.max_point_s) {
    const bool all_warm = rate_per_s > 0 ? recorder.size() > 0 : warm_workers.load() >= concurrency;
    if (elapsed() >= o.warmup_s && all_warm) break;
    std::this_thread::sleep_for(poll);
  }
  result.warmup_requests = int64_t(recorder.size());

  struct Window {
    size_t begin = 0, end = 0;
    double t0 = 0, t1 = 0;
    double requests_per_s = 0, p50_ms = 0;
    int64_t ok = 0;
  };
  std::vector<Window> windows;
  auto within = [&](auto get) {
    const size_t k = o.stable_windows;
    if (windows.size() < k) return false;
    double mean = 0;
    for (size_t i = windows.size() - k; i < windows.size(); ++i) mean += get(windows[i]) / k;
    for (size_t i = windows.size() - k; i < windows.size(); ++i) {
      if (windows[i].ok == 0 || std::abs(get(windows[i]) - mean) > o.stable_tolerance * mean) return false;
    }
    return mean > 0;
  };
  while (elapsed() < o.max_point_s) {
    Window w;
    w.begin = recorder.size();
    w.t0 = elapsed();
    while (elapsed() < o.max_point_s) {
      if (elapsed() - w.t0 >= o.window_s &&
          recorder.size() - w.begin >= size_t(o.min_window_requests)) {
        break;
      }
      std::this_thread::sleep_for(poll);
    }
    w.t1 = elapsed();
    w.end = recorder.size();
    std::vector<double> latencies;
    for (const Sample& s : recorder.Slice(w.begin, w.end)) {
      if (s.code == 0) latencies.push_back(s.latency_ms);
    }
    w.ok = int64_t(latencies.size());
    if (!latencies.empty()) {
      std::sort(latencies.begin(), latencies.end());
      w.p50_ms = Percentile(latencies, 50);
      w.requests_per_s = w.ok / std::max(w.t1 - w.t0, 1e-9);
    }
    windows.push_back(w);
    if (within([](const Window& x) { return x.requests_per_s; }) &&
        within([](const Window& x) { return x.p50_ms; })) {
      result.stable = true;
      break;
    }
    if (int(windows.size()) >= o.max_windows) break;
  }
  stop = true;
  {
    std::lock_guard<std::mutex> lock(stop_mu);
    stop_cv.notify_all();
  }
  for (std::thread& t : threads) t.join();  // the callers have released their kept Cs
  result.elapsed_s = elapsed();
  result.calls = int64_t(recorder.size());
  ReleaseUploads(clients[0], uploaded);
  result.windows = int(windows.size());
  for (const Window& w : windows) result.window_requests_per_s.push_back(w.requests_per_s);
  result.first_error = recorder.first_error();
  for (const Sample& s : recorder.Slice(0, recorder.size())) {
    if (s.code != 0) ++result.error_codes[s.code];
  }

  // Statistics over the stable windows, or over all of them when it never settled.
  std::vector<Sample> measured;
  double seconds = 0;
  if (!windows.empty()) {
    const size_t first = result.stable ? windows.size() - o.stable_windows : 0;
    measured = recorder.Slice(windows[first].begin, windows.back().end);
    seconds = windows.back().t1 - windows[first].t0;
  }
  result.stats.push_back(Summarize(measured, -1, seconds, o.shapes, kind, o.resident));
  if (o.shapes.size() > 1) {
    for (size_t i = 0; i < o.shapes.size(); ++i) {
      result.stats.push_back(Summarize(measured, int(i), seconds, o.shapes, kind, o.resident));
    }
  }
  return result;
}

namespace {

const PointStats* Match(const PointResult* echo, const std::string& shape) {
  if (echo == nullptr) return nullptr;
  for (const PointStats& s : echo->stats) {
    if (s.shape == shape) return &s;
  }
  return nullptr;
}

std::string ErrorCodes(const PointResult& p) {
  std::string out;
  for (auto [code, count] : p.error_codes) {
    out += fmt::format("{}{}:{}", out.empty() ? "" : " ", code, count);
  }
  return out;
}

}  // namespace

std::string FormatTableHeader() {
  return fmt::format(
      "{:<7} {:<6} {:<4} {:>4} {:>6} {:<16} {:>7} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7} | "
      "{:>8} {:>7} {:>9} {:>7} {:>9} | {:>3} {:<6}\n",
      "target", "mode", "res", "conc", "rate", "shape", "reqs", "err", "req/s", "p50_ms", "p90_ms",
      "p99_ms", "GFLOP/s", "GB/s", "vs_echo", "queue_ms", "h2d_ms", "kernel_ms", "d2h_ms",
      "server_ms", "win", "stable");
}

std::string FormatTableRows(const PointResult& p, const PointResult* echo) {
  std::string out;
  const std::string rate = p.rate_per_s > 0 ? fmt::format("{:.0f}", p.rate_per_s) : "-";
  for (const PointStats& s : p.stats) {
    const PointStats* e = p.target == Target::kService ? Match(echo, s.shape) : nullptr;
    const std::string ratio =
        e && e->payload_gb_per_s > 0 ? fmt::format("{:.2f}", s.payload_gb_per_s / e->payload_gb_per_s) : "-";
    std::string server;
    if (p.target == Target::kService && s.server.count > 0) {
      server = fmt::format("{:>8.3f} {:>7.3f} {:>9.3f} {:>7.3f} {:>9.3f}", s.server.queue_ms,
                           s.server.h2d_ms, s.server.kernel_ms, s.server.d2h_ms, s.server.total_ms);
    } else {
      server = fmt::format("{:>8} {:>7} {:>9} {:>7} {:>9}", "-", "-", "-", "-", "-");
    }
    const std::string gflops = p.target == Target::kService ? fmt::format("{:.1f}", s.gflops) : "-";
    out += fmt::format(
        "{:<7} {:<6} {:<4} {:>4} {:>6} {:<16} {:>7} {:>5} {:>9.1f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9} "
        "{:>8.3f} {:>7} | {} | {:>3} {:<6}\n",
        TargetName(p.target), ModeName(p.mode), ResidentName(p.resident), p.concurrency, rate, s.shape, s.requests, s.errors,
        s.requests_per_s, s.p50_ms, s.p90_ms, s.p99_ms, gflops, s.payload_gb_per_s, ratio, server,
        p.windows, p.stable ? "yes" : "no");
  }
  if (p.target == Target::kService && p.resident != Resident::kNone && p.upload_s > 0) {
    std::string where;
    for (const std::string& replica : p.upload_replicas) where += (where.empty() ? "" : ", ") + replica;
    out += fmt::format("  resident operands uploaded in {:.3f} s before the warm-up (not measured){}\n",
                       p.upload_s, where.empty() ? "" : ", to replicas " + where);
  }
  if (!p.stable && !p.window_requests_per_s.empty()) {
    std::string windows;
    for (double r : p.window_requests_per_s) windows += fmt::format(" {:.1f}", r);
    out += fmt::format("  not stable: req/s per window{}\n", windows);
  }
  if (!p.error_codes.empty()) {
    out += fmt::format("  errors (code:count) {}; first: {}\n", ErrorCodes(p), p.first_error);
  }
  if (p.server_metrics) out += FormatServerMetricsRow(*p.server_metrics);
  return out;
}

void WriteCsvHeader(std::ostream& out) {
  out << "device,backend,target,mode,resident,concurrency,rate_per_s,shape,requests,errors,seconds,"
         "requests_per_s,p50_ms,p90_ms,p99_ms,mean_ms,min_ms,max_ms,gflops,payload_gb_per_s,"
         "echo_payload_gb_per_s,ratio_to_echo,server_queue_ms,server_h2d_ms,server_kernel_ms,"
         "server_d2h_ms,server_total_ms,windows,stable,warmup_requests,error_codes,shapes,calls,"
         "metrics_rpc,metrics_requests,metrics_ok,metrics_agree,metrics_gemms,metrics_queue_ms,"
         "metrics_h2d_ms,metrics_kernel_ms,metrics_d2h_ms,metrics_total_ms\n";
}

void WriteCsvRows(std::ostream& out, const PointResult& p, const PointResult* echo,
                  const std::string& device, const std::string& backend) {
  auto quote = [](std::string s) {
    std::replace(s.begin(), s.end(), '"', '\'');
    return "\"" + s + "\"";
  };
  for (const PointStats& s : p.stats) {
    const PointStats* e = p.target == Target::kService ? Match(echo, s.shape) : nullptr;
    const bool server = p.target == Target::kService;
    out << fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{:.4f},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},"
        "{:.6g},{},{},{},{},{},{},{},{},{},{},{},{}",
        quote(device), backend, TargetName(p.target), ModeName(p.mode), ResidentName(p.resident),
        p.concurrency, p.rate_per_s,
        s.shape, s.requests, s.errors, s.seconds, s.requests_per_s, s.p50_ms, s.p90_ms, s.p99_ms,
        s.mean_ms, s.min_ms, s.max_ms, s.gflops, s.payload_gb_per_s,
        e ? fmt::format("{:.6g}", e->payload_gb_per_s) : "",
        e && e->payload_gb_per_s > 0 ? fmt::format("{:.4f}", s.payload_gb_per_s / e->payload_gb_per_s) : "",
        server ? fmt::format("{:.6g}", s.server.queue_ms) : "",
        server ? fmt::format("{:.6g}", s.server.h2d_ms) : "",
        server ? fmt::format("{:.6g}", s.server.kernel_ms) : "",
        server ? fmt::format("{:.6g}", s.server.d2h_ms) : "",
        server ? fmt::format("{:.6g}", s.server.total_ms) : "", p.windows, p.stable ? 1 : 0,
        p.warmup_requests, quote(ErrorCodes(p)), quote(p.shapes));
    const ServerMetricsDelta* m = &s == &p.stats[0] && p.server_metrics ? &*p.server_metrics : nullptr;
    out << fmt::format(",{}", p.calls);
    if (m != nullptr) {
      out << fmt::format(",{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g}\n", m->rpc, m->requests,
                         m->ok_requests, m->Agrees() ? 1 : 0, m->gemms, m->queue_ms, m->h2d_ms,
                         m->kernel_ms, m->d2h_ms, m->total_ms);
    } else {
      out << ",,,,,,,,,,\n";
    }
  }
}

}  // namespace hgemm::bench
