#include "server/transport/matrix_reactors.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "server/core/status.h"
#include "server/session/part_session.h"
#include "server/session/upload_session.h"
#include "server/transport/convert.h"
#include "server/transport/lone_chunk.h"
#include "server/transport/status_util.h"

namespace hgemm {

namespace {

static_assert(v1::UploadMatrixRequest::kChunkFieldNumber == kLoneChunkField);
static_assert(v1::PartRequest::kChunkFieldNumber == kLoneChunkField);

// `message` serialized into `response`; INTERNAL naming `rpc` if it does not serialize.
template <typename Message>
absl::Status SerializeAnswer(const Message& message, const char* rpc, grpc::ByteBuffer* response) {
  bool own_buffer = false;
  if (!grpc::SerializationTraits<Message>::Serialize(message, response, &own_buffer).ok()) {
    return absl::InternalError(fmt::format("{}: the response did not serialize", rpc));
  }
  return absl::OkStatus();
}

// What an upload reactor does with the message read into `request`: a lone chunk goes to
// `session` as its slices; anything else is parsed into a `Message` and converted by `convert`
// (ToUploadMessage, ToPartMessage). A message that does not parse ends the reads, as a typed
// method's failed read does. Returns the bytes the session accepted.
template <typename Message, typename Session, typename Convert>
int64_t ConsumeUploadMessage(grpc::ByteBuffer& request, Session& session, Convert convert) {
  using SessionMessage = decltype(convert(std::declval<Message&>()));
  WireBytes chunk;
  if (LoneChunkOf(request, &chunk)) {
    SessionMessage message{std::move(chunk)};
    return session.OnRead(message);
  }
  Message parsed;
  if (!grpc::SerializationTraits<Message>::Deserialize(&request, &parsed).ok()) {
    session.OnReadsDone();
    return 0;
  }
  SessionMessage message = convert(parsed);
  return session.OnRead(message);
}

}  // namespace

// UploadMatrix: the reads and the finish its UploadSession asks for, and the call's metrics.
// The method is registered raw (ByteBuffer in and out) so that a chunk's bytes go from gRPC's
// slices to the upload queue without a protobuf string (LoneChunkOf); the wire is unchanged.
class UploadMatrixReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>,
                                  public TrackedCall,
                                  public UploadTransport {
 public:
  UploadMatrixReactor(const CallServices& services, grpc::CallbackServerContext* context,
                      std::string owner, grpc::ByteBuffer* response)
      : services_(services),
        context_(context),
        owner_(std::move(owner)),
        response_(response),
        session_(*services.core, this, owner_, services.calls->idle_timeout(),
                 OverUnixSocket(*context)) {
    grpc::ServerReadReactor<grpc::ByteBuffer>::StartRead(&request_);
    services_.calls->Track(this);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return session_.OnReadsDone();  // the client has sent everything (or went away)
    const int64_t region_before = session_.region_bytes();
    const int64_t accepted =
        ConsumeUploadMessage<v1::UploadMatrixRequest>(request_, session_, ToUploadMessage);
    services_.log->Received(Rpc::kUploadMatrix, accepted, *context_);
    services_.log->SharedMemory(session_.region_bytes() - region_before, 0);
  }

  void OnDone() override {
    services_.calls->Untrack(this);
    session_.OnCallDone(context_->IsCancelled());
    delete this;
  }

  void Drain() override {}  // an upload in progress gets the drain deadline
  void ExpireIdle(Clock::time_point cutoff) override { session_.ExpireIdle(cutoff); }

 private:
  // UploadTransport (called with the session's mutex held):
  void StartRead() override { grpc::ServerReadReactor<grpc::ByteBuffer>::StartRead(&request_); }

  void Finish(const absl::Status& status, const ResidentMatrix& matrix) override {
    absl::Status s = status;
    if (s.ok()) {
      v1::MatrixInfo info;
      Describe(*services_.core, matrix, &info);
      s = SerializeAnswer(info, "UploadMatrix", response_);
    }
    services_.log->Answered(Rpc::kUploadMatrix, s, context_, owner_);
    grpc::ServerReadReactor<grpc::ByteBuffer>::Finish(ToGrpcStatus(s));
  }

  bool IsCancelled() const override { return context_->IsCancelled(); }

  const CallServices& services_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer request_;  // the read in flight
  UploadSession session_;     // last: it calls back into the members above
};

// UploadPart: the reads and the finish its PartSession asks for, and the call's metrics. Raw as
// UploadMatrix, for the same reason.
class UploadPartReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>,
                                public TrackedCall,
                                public PartTransport {
 public:
  UploadPartReactor(const CallServices& services, grpc::CallbackServerContext* context,
                    std::string owner, grpc::ByteBuffer* response)
      : services_(services),
        context_(context),
        owner_(std::move(owner)),
        response_(response),
        session_(*services.core, this, owner_, services.calls->idle_timeout()) {
    grpc::ServerReadReactor<grpc::ByteBuffer>::StartRead(&request_);
    services_.calls->Track(this);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return session_.OnReadsDone();  // the client has sent everything (or went away)
    const int64_t accepted =
        ConsumeUploadMessage<v1::PartRequest>(request_, session_, ToPartMessage);
    services_.log->Received(Rpc::kUploadPart, accepted, *context_);
  }

  void OnDone() override {
    services_.calls->Untrack(this);
    delete this;
  }

  void Drain() override {}  // a part in progress gets the drain deadline
  void ExpireIdle(Clock::time_point cutoff) override { session_.ExpireIdle(cutoff); }

 private:
  // PartTransport (called with the session's mutex held):
  void StartRead() override { grpc::ServerReadReactor<grpc::ByteBuffer>::StartRead(&request_); }

  void Finish(const absl::Status& status, int64_t missing_bytes) override {
    absl::Status s = status;
    if (s.ok()) {
      v1::PartResponse response;
      response.set_missing_bytes(missing_bytes);
      s = SerializeAnswer(response, "UploadPart", response_);
    }
    services_.log->Answered(Rpc::kUploadPart, s, context_, owner_);
    grpc::ServerReadReactor<grpc::ByteBuffer>::Finish(ToGrpcStatus(s));
  }

  const CallServices& services_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer request_;  // the read in flight
  PartSession session_;       // last: it calls back into the members above
};

// DownloadMatrix: the device copy (of the whole matrix, or of the range asked for) runs on an
// upload thread, straight into chunk-sized host buffers that then become the chunks' data in
// turn (swapped into the message, not copied), one write at a time.
class DownloadMatrixReactor final : public grpc::ServerWriteReactor<v1::ResultChunk> {
 public:
  DownloadMatrixReactor(const CallServices& services, grpc::CallbackServerContext* context,
                        std::string owner, const v1::DownloadMatrixRequest& request)
      : services_(services),
        context_(context),
        owner_(std::move(owner)),
        chunk_bytes_(services.stream->stream_chunk_bytes),
        buffers_(services.core->host_buffers()) {
    GemmCoreInterface& core = *services.core;
    ResidentMatrix m;
    absl::Status s = core.LookupMatrix(owner_, request.handle(), "handle", &m);
    const uint64_t bytes = s.ok() ? uint64_t(m.buffer->bytes) : 0;
    if (s.ok()) s = CheckByteRange(m, request.offset(), request.length());
    if (s.ok() && request.release_after()) {
      int64_t freed = 0;  // the buffer lives on in `m` until the read is done
      s = core.ReleaseMatrix(owner_, request.handle(), /*admin=*/false, &freed);
    }
    if (!s.ok()) {
      Answer(s);
      return;
    }
    total_ = int64_t(bytes);
    first_ = offset_ = int64_t(request.offset());
    end_ = request.length() == 0 ? int64_t(bytes) : first_ + int64_t(request.length());
    core.uploads().Post([this, &core, buffer = m.buffer] {
      absl::Status read;
      try {
        for (int64_t at = first_; at < end_ && read.ok(); at += chunk_bytes_) {
          const int64_t size = std::min(chunk_bytes_, end_ - at);
          pieces_.push_back(buffers_.Take(size));
          read = core.ReadMatrix(*buffer, at, size, pieces_.back().data());
        }
      } catch (...) {
        read = status::FromCurrentException("DownloadMatrix");
      }
      if (!read.ok()) return Answer(read);
      NextWrite();
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Answer(status::Cancelled());
    NextWrite();
  }

  void OnDone() override {
    for (std::string& piece : pieces_) buffers_.Give(std::move(piece));
    buffers_.Give(std::move(*chunk_.mutable_data()));
    delete this;
  }

 private:
  void Answer(const absl::Status& s) {
    services_.log->Answered(Rpc::kDownloadMatrix, s, context_, owner_);
    Finish(ToGrpcStatus(s));
  }

  // Chunk offsets are the matrix's; pieces_[i] holds the i-th chunk of [first_, end_).
  void NextWrite() {
    if (offset_ >= end_) return Answer(absl::OkStatus());
    std::string& piece = pieces_[size_t((offset_ - first_) / chunk_bytes_)];
    const int64_t size = int64_t(piece.size());
    services_.log->Sent(Rpc::kDownloadMatrix, size, *context_);
    chunk_.set_offset(offset_);
    chunk_.mutable_data()->swap(piece);  // the sent piece goes back in its place
    chunk_.set_total_bytes(offset_ == 0 ? total_ : 0);
    offset_ += size;
    StartWrite(&chunk_);
  }

  const CallServices& services_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  const int64_t chunk_bytes_;
  HostBufferPool& buffers_;
  std::vector<std::string> pieces_;  // from the pool: the chunks' data, read off the device
  int64_t total_ = 0;                // the matrix's bytes
  int64_t first_ = 0, end_ = 0;      // the bytes asked for
  int64_t offset_ = 0;               // the next chunk's
  v1::ResultChunk chunk_;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadMatrixReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner,
    grpc::ByteBuffer* response) {
  return new UploadMatrixReactor(services, context, std::move(owner), response);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadPartReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner,
    grpc::ByteBuffer* response) {
  return new UploadPartReactor(services, context, std::move(owner), response);
}

grpc::ServerWriteReactor<v1::ResultChunk>* NewDownloadMatrixReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner,
    const v1::DownloadMatrixRequest& request) {
  return new DownloadMatrixReactor(services, context, std::move(owner), request);
}

}  // namespace hgemm
