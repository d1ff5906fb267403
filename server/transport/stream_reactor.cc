#include "server/transport/stream_reactor.h"

#include <memory>
#include <utility>

#include "server/session/stream_session.h"
#include "server/transport/convert.h"
#include "server/transport/status_util.h"

namespace hgemm {

// One GemmStream call (see stream_reactor.h): the reads, writes and finish its StreamSession
// asks for, the GemmStreamResponses they carry, and the call's metrics.
class GemmStreamReactor final
    : public grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>,
      public TrackedCall,
      public StreamTransport {
 public:
  GemmStreamReactor(const CallServices& services, grpc::CallbackServerContext* context,
                    std::string owner)
      : services_(services),
        context_(context),
        owner_(std::move(owner)),
        session_(*services.core, *services.stream, this, owner_, SteadyDeadline(*context),
                 std::string(CallTraceparent(*context))) {
    grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>::StartRead(&request_);
    services_.calls->Track(this);  // after StartRead: a drain may finish the call at once
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      StreamMessage message = ToStreamMessage(request_);
      services_.log->Received(Rpc::kGemmStream, session_.OnRead(message), *context_);
    } else {  // the client closed its side, or the call was cancelled
      session_.OnReadsDone();
    }
  }
  void OnWriteDone(bool ok) override { session_.OnWriteDone(ok); }
  void OnDone() override {
    services_.calls->Untrack(this);
    delete this;
  }

  void Drain() override { session_.Drain(); }
  void ExpireIdle(Clock::time_point cutoff) override { session_.ExpireIdle(cutoff); }

 private:
  // StreamTransport (called with the session's mutex held, which also guards the messages):
  void StartRead() override {
    grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>::StartRead(&request_);
  }

  void StartWriteChunk(uint64_t gemm_id, int64_t offset, std::string_view data) override {
    // chunk_message_ stays a chunk, so its 1 MiB buffer is reused: reallocating it per message
    // (as Clear() on the oneof would) cost more than the copy itself.
    chunk_message_.set_gemm_id(gemm_id);
    v1::ResultChunk* chunk = chunk_message_.mutable_chunk();
    chunk->set_offset(offset);
    chunk->set_data(data.data(), data.size());
    services_.log->Sent(Rpc::kGemmStream, int64_t(data.size()), *context_);
    StartWrite(&chunk_message_);
  }

  void StartWriteDone(const AnnouncedGemm& gemm, const absl::Status& status,
                      const GemmResult& result) override {
    done_message_.Clear();
    done_message_.set_gemm_id(gemm.gemm_id);
    v1::GemmDone* done = done_message_.mutable_done();
    const grpc::Status answer = ToGrpcStatus(status);
    done->set_status_code(answer.error_code());
    done->set_status_message(answer.error_message());
    if (!status.ok()) *done->mutable_status() = ToRpcStatus(status);
    const GemmJob& job = gemm.order.job;
    done->set_request_id(job.request_id);
    services_.log->Answered(Rpc::kGemmStream, status, context_, owner_, job.request_id,
                            gemm.gemm_id);
    if (status.ok()) {
      services_.log->Ran(job.shape, result);
      ToProto(job.shape, result, done->mutable_timing(), done->mutable_execution());
      if (gemm.keep_c() && result.kept_c.buffer) {
        Describe(*services_.core, result.kept_c, done->mutable_c_matrix());
      }
    }
    StartWrite(&done_message_);
  }

  void Finish(const absl::Status& status) override {
    services_.log->StreamEnded(status, context_, owner_);
    grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>::Finish(
        ToGrpcStatus(status));
  }

  bool IsCancelled() const override { return context_->IsCancelled(); }

  const CallServices& services_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  v1::GemmStreamRequest request_;         // the read in flight
  v1::GemmStreamResponse chunk_message_;  // the C chunk being written
  v1::GemmStreamResponse done_message_;   // the GemmDone being written
  StreamSession session_;                 // last: it calls back into the members above
};

grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>* NewGemmStreamReactor(
    const CallServices& services, grpc::CallbackServerContext* context, std::string owner) {
  return new GemmStreamReactor(services, context, std::move(owner));
}

}  // namespace hgemm
