#include "server/stream_reactor.h"

#include <memory>
#include <utility>

#include "server/convert.h"
#include "server/status_util.h"
#include "server/stream_session.h"

namespace hgemm {

// One GemmStream call (see stream_reactor.h): the reads, writes and finish its StreamSession
// asks for, and the GemmStreamResponses they carry.
class GemmStreamReactor final
    : public grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>,
      public GemmServiceImpl::TrackedCall,
      public StreamTransport {
 public:
  GemmStreamReactor(GemmServiceImpl& service, grpc::CallbackServerContext* context,
                    std::string owner)
      : service_(service),
        context_(context),
        owner_(std::move(owner)),
        session_(service.stream_services_, this, owner_, SteadyDeadline(*context),
                 std::string(CallTraceparent(*context))) {
    grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>::StartRead(&request_);
    service_.Track(this);  // after StartRead: a drain may finish the call at once
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      session_.OnRead(request_);
    } else {  // the client closed its side, or the call was cancelled
      session_.OnReadsDone();
    }
  }
  void OnWriteDone(bool ok) override { session_.OnWriteDone(ok); }
  void OnDone() override {
    service_.Untrack(this);
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
    if (service_.metrics_ != nullptr) {
      service_.metrics_->AddSentBytes(Rpc::kGemmStream, int64_t(data.size()));
    }
    StartWrite(&chunk_message_);
  }

  void StartWriteDone(const AnnouncedGemm& gemm, const absl::Status& status,
                      const GemmReport& report, const ResidentMatrix& kept_c) override {
    done_message_.Clear();
    done_message_.set_gemm_id(gemm.gemm_id);
    v1::GemmDone* done = done_message_.mutable_done();
    const grpc::Status answer = ToGrpcStatus(status);
    done->set_status_code(answer.error_code());
    done->set_status_message(answer.error_message());
    done->set_request_id(gemm.job.request_id);
    service_.Answered(Rpc::kGemmStream, status, context_, owner_, gemm.job.request_id,
                      gemm.gemm_id);
    if (status.ok()) {
      if (service_.metrics_ != nullptr) {
        service_.metrics_->ObserveGemm(report, report.Tflops(gemm.job.shape));
      }
      ToProto(gemm.job.shape, report, done->mutable_timing(), done->mutable_execution());
      done->mutable_execution()->set_backend(service_.backend_->Name());
      if (gemm.keep_c && kept_c.buffer) service_.Describe(kept_c, done->mutable_c_matrix());
    }
    StartWrite(&done_message_);
  }

  void Finish(const absl::Status& status) override {
    service_.StreamEnded(status, context_, owner_);
    grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>::Finish(
        ToGrpcStatus(status));
  }

  bool IsCancelled() const override { return context_->IsCancelled(); }

  GemmServiceImpl& service_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  v1::GemmStreamRequest request_;         // the read in flight
  v1::GemmStreamResponse chunk_message_;  // the C chunk being written
  v1::GemmStreamResponse done_message_;   // the GemmDone being written
  StreamSession session_;                 // last: it calls back into the members above
};

grpc::ServerBidiReactor<v1::GemmStreamRequest, v1::GemmStreamResponse>* NewGemmStreamReactor(
    GemmServiceImpl& service, grpc::CallbackServerContext* context, std::string owner) {
  return new GemmStreamReactor(service, context, std::move(owner));
}

}  // namespace hgemm
