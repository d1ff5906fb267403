#include "bench/load_callers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "client/error_details.h"
#include "client/ring_client.h"
#include "client/shared_region.h"

namespace hgemm::bench::load_internal {

Caller::~Caller() {
  Tidy();
  Release(&kept_c_);
}

void Caller::SetError(int code, const std::string& message, Sample* s) {
  s->code = code;
  error_ = fmt::format("{} (code {})", message, code);
}

void Caller::SetStatus(const grpc::Status& status, Sample* s) {
  if (status.ok()) {
    s->code = 0;
  } else {
    SetError(int(status.error_code()), status.error_message(), s);
  }
}

void Caller::CheckSize(const Payload& p, const v1::GemmRequest& r, size_t got, Sample* s) {
  const int64_t expected = r.keep_c_resident() ? 0 : p.shape.ReplyBytes();
  if (s->code == 0 && int64_t(got) != expected) {
    SetError(kWrongReplySize, fmt::format("reply of {} bytes, expected {}", got, expected), s);
  }
}

void Caller::CheckKept(const Payload& p, const v1::GemmRequest& r, const v1::MatrixInfo& c,
                       Sample* s) {
  if (s->code != 0 || !r.keep_c_resident()) return;
  if (c.handle().empty() || c.rows() != p.shape.m || c.cols() != p.shape.n) {
    return SetError(kWrongReplySize,
                    fmt::format("kept C '{}' of {}x{}, expected {}x{}", c.handle(), c.rows(),
                                c.cols(), p.shape.m, p.shape.n),
                    s);
  }
  if (!previous_c_.empty()) Release(&previous_c_);  // only if Tidy was skipped
  previous_c_.swap(kept_c_);
  kept_c_ = c.handle();
}

void Caller::EnableRelease(const GemmClient& client, const std::string& client_id,
                           double timeout_s) {
  releaser_ = std::make_unique<GemmClient>(client);
  release_options_.client_id = client_id;
  release_options_.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
}

void Caller::Release(std::string* handle) {
  if (handle->empty()) return;
  if (releaser_) releaser_->ReleaseMatrix(*handle, release_options_);  // best effort (TTL)
  handle->clear();
}

namespace {

void CopyTiming(const v1::Timing& t, Sample* s) {
  s->queue_ms = t.queue_wait_ms();
  s->h2d_ms = t.host_to_device_ms();
  s->kernel_ms = t.kernel_ms();
  s->d2h_ms = t.device_to_host_ms();
  s->total_ms = t.server_total_ms();
  s->verify_ms = t.verify_ms();
}

// GemmService.Gemm through the client library, or with `parallel_parts` > 1 every GEMM as
// parallel parts (GemmClient::Run).
class ServiceUnaryCaller final : public Caller {
 public:
  ServiceUnaryCaller(const GemmClient& client, double timeout_s, const std::string& client_id,
                     int parallel_parts)
      : client_(client) {
    options_.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
    options_.client_id = client_id;
    options_.parallel_parts = parallel_parts;
    options_.parallel_min_bytes = 0;
    EnableRelease(client, client_id, timeout_s);
  }
  void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) override {
    SetStatus(options_.parallel_parts > 1 ? client_.Run(request, &response_, options_)
                                          : client_.Gemm(request, &response_, options_),
              s);
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

// A region of one caller for C, as large as the largest C of the shapes, registered for the
// caller's life.
class OwnCRegion {
 public:
  OwnCRegion(const GemmClient& client, const LoadOptions& o, const CallOptions& options)
      : client_(client), options_(options) {
    int64_t c_bytes = 1;
    for (const Shape& shape : o.shapes) c_bytes = std::max(c_bytes, shape.ReplyBytes());
    std::string error;
    region_ = SharedRegion::Create(c_bytes, &error);
    if (!region_) {
      setup_error_ = "C's shared region: " + error;
      return;
    }
    v1::RegionInfo info;
    setup_status_ =
        client_.RegisterRegion(region_->path(), region_->bytes(), "hgemm_load C", &info, options_);
    handle_ = info.region();
  }
  ~OwnCRegion() {
    if (!handle_.empty()) client_.UnregisterRegion(handle_, options_);  // best effort (TTL)
  }
  const std::string& handle() const { return handle_; }
  std::string_view bytes(int64_t size) const {
    return region_ ? std::string_view(reinterpret_cast<const char*>(region_->data()), size)
                   : std::string_view();
  }
  const std::string& setup_error() const { return setup_error_; }
  const grpc::Status& setup_status() const { return setup_status_; }

 private:
  const GemmClient& client_;
  const CallOptions options_;
  std::unique_ptr<SharedRegion> region_;
  std::string handle_, setup_error_;
  grpc::Status setup_status_;
};

// GemmService.Gemm with C written into a region of this caller (the request names A and B
// in shared memory already): only small messages travel, over the Unix socket.
class ShmUnaryCaller final : public Caller {
 public:
  ShmUnaryCaller(const GemmClient& client, const LoadOptions& o)
      : client_(client), options_(CallOptionsOf(o)), c_(client_, o, options_) {}
  void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) override {
    if (!c_.setup_error().empty()) {
      return SetError(int(grpc::StatusCode::INTERNAL), c_.setup_error(), s);
    }
    if (!c_.setup_status().ok()) return SetStatus(c_.setup_status(), s);
    request_ = request;
    request_.mutable_c_region()->set_region(c_.handle());
    request_.mutable_c_region()->set_offset(0);
    SetStatus(client_.Gemm(request_, &response_, options_), s);
    if (s->code != 0) return;
    if (!response_.c().empty()) {
      return SetError(
          kWrongReplySize,
          fmt::format("{} bytes of C inline, though C's region was named", response_.c().size()),
          s);
    }
    CopyTiming(response_.timing(), s);
    execution_ = response_.execution();
    reply_size_ = p.shape.ReplyBytes();
  }
  std::string_view reply() const override { return c_.bytes(reply_size_); }

  static CallOptions CallOptionsOf(const LoadOptions& o) {
    CallOptions options;
    options.timeout = std::chrono::milliseconds(int64_t(o.call_timeout_s * 1000));
    options.client_id = o.client_id;
    return options;
  }

 private:
  GemmClient client_;
  const CallOptions options_;
  OwnCRegion c_;
  v1::GemmRequest request_;
  v1::GemmResponse response_;
  int64_t reply_size_ = 0;
};

// The same GEMMs through a submission ring of this caller (RingClient), attached at its first
// call with A's and B's region (slot 0) and its C region (slot 1): no gRPC call per GEMM. A
// resident B (b_handle) is a matrix slot of the ring, bound when a call first names it.
class RingCaller final : public Caller {
 public:
  RingCaller(const GemmClient& client, const LoadOptions& o)
      : client_(client),
        options_(ShmUnaryCaller::CallOptionsOf(o)),
        c_(client_, o, options_),
        timeout_(int64_t(o.call_timeout_s * 1e6)) {}
  void Call(const Payload& p, const v1::GemmRequest& request, Sample* s) override {
    if (!c_.setup_error().empty()) {
      return SetError(int(grpc::StatusCode::INTERNAL), c_.setup_error(), s);
    }
    if (!c_.setup_status().ok()) return SetStatus(c_.setup_status(), s);
    const std::string& operands = request.a_region().region();
    const std::string& b_handle = request.b_handle();
    if (!ring_) {
      grpc::Status attached;
      std::vector<std::string> matrices;
      if (!b_handle.empty()) matrices.push_back(b_handle);
      ring_ = RingClient::Attach(client_, {operands, c_.handle()}, matrices,
                                 {.sq_entries = 4, .cq_entries = 4, .call = options_}, &attached);
      if (!ring_) return SetStatus(attached, s);
      operands_ = operands;
    }
    if (operands != operands_ || (b_handle.empty() && request.b_region().region() != operands_)) {
      return SetError(int(grpc::StatusCode::INTERNAL),
                      "A (and B, unless resident) must be in the ring's region", s);
    }
    if (!b_handle.empty() && !ring_->HasMatrix(b_handle)) {  // another shape's B
      if (grpc::Status bound = ring_->Bind({}, {b_handle}); !bound.ok()) {
        return SetStatus(bound, s);
      }
    }
    RingSubmission entry;
    if (grpc::Status e = ring_->ToSubmission(request, "", timeout_, &entry); !e.ok()) {
      return SetStatus(e, s);
    }
    entry.c = {kRingOperandRegion, 1, 0};
    RingCompletion done{};
    SetStatus(ring_->Gemm(entry, &done), s);
    if (s->code != 0) return;
    s->queue_ms = done.queue_wait_ms;
    s->kernel_ms = done.kernel_ms;
    s->total_ms = done.server_total_ms;
    // A completion names no kernel: what was asked for.
    execution_.set_kernel(request.options().kernel().empty() ? "auto" : request.options().kernel());
    execution_.set_accumulation(request.options().accumulation());
    reply_size_ = p.shape.ReplyBytes();
  }
  std::string_view reply() const override { return c_.bytes(reply_size_); }

 private:
  GemmClient client_;
  const CallOptions options_;
  OwnCRegion c_;
  const std::chrono::microseconds timeout_;
  std::unique_ptr<RingClient> ring_;  // detached before c_ is unregistered
  std::string operands_;
  int64_t reply_size_ = 0;
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
  using Open =
      std::function<std::unique_ptr<Stream>(grpc::ClientContext*, const std::string& route)>;

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
    SetStatus(
        status_.ok() ? grpc::Status(grpc::StatusCode::UNKNOWN, "stream ended early") : status_, s);
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
      : StreamCaller(
            deadline, client_id,
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
        return ProtocolError(
            int(grpc::StatusCode::INTERNAL),
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
        SetStatus(StatusOf(done), s);
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
    ok = ok &&
         WriteOperands(request, chunk_bytes_, [&](v1::Operand, size_t, const char* data, size_t n) {
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

}  // namespace

std::unique_ptr<Caller> MakeCaller(Target kind, const LoadOptions& o, const GemmClient& client,
                                   std::chrono::system_clock::time_point stream_deadline,
                                   Transport transport) {
  if (kind == Target::kService && transport == Transport::kShm) {
    return std::make_unique<ShmUnaryCaller>(client, o);
  }
  if (kind == Target::kService && transport == Transport::kRing) {
    return std::make_unique<RingCaller>(client, o);
  }
  if (kind == Target::kService) {
    if (o.mode == Mode::kUnary) {
      return std::make_unique<ServiceUnaryCaller>(client, o.call_timeout_s, o.client_id,
                                                  o.parallel_parts);
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

}  // namespace hgemm::bench::load_internal
