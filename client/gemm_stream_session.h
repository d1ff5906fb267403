// GemmStreamSession: one persistent GemmStream on which a caller submits GEMMs one at a time and
// reads their answers as they come (the C ABI's hgemm_stream_*, which Python's gemm_many
// pipelines through).
//
// A writer thread of the session sends the queued GEMMs in order: each one's header, then its
// operands in chunks of CallOptions::chunk_bytes, copied from the request or read from the
// caller's memory (`borrowed`). Next() reads the answers: C's chunks go straight into the buffer
// submitted with their GEMM (StreamAnswer), then its done is handed over. An answer that breaks
// the protocol cancels the stream and becomes its end status (INTERNAL).
//
// Thread safety: Submit, Close and Cancel may be called from any thread at any time, also while
// Next runs; Next from one thread at a time.
#ifndef HGEMM_CLIENT_GEMM_STREAM_SESSION_H_
#define HGEMM_CLIENT_GEMM_STREAM_SESSION_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "client/gemm_client.h"
#include "proto/hgemm.pb.h"

namespace hgemm {

class GemmStreamSession {
 public:
  // Opens the stream to options.replica ("": the target) with the options' metadata, chunk size
  // and deadline (timeout 0: none). The session keeps a copy of `client` (its channels). Throws
  // std::system_error when the writer thread cannot be made.
  GemmStreamSession(const GemmClient& client, const CallOptions& options);
  // A stream not over is cancelled and its remaining answers dropped (nothing more is written
  // into any GEMM's C), then the writer ends.
  ~GemmStreamSession();

  GemmStreamSession(const GemmStreamSession&) = delete;
  GemmStreamSession& operator=(const GemmStreamSession&) = delete;

  // Queues GEMM `gemm_id`: `request` (keep_c_resident and c_ttl_seconds included), its A and B
  // taken from `borrowed` where it names them (request.a and request.b then unset), its C
  // written into `c` (capacity 0 for a C kept on the server). FAILED_PRECONDITION once closed;
  // INVALID_ARGUMENT when `gemm_id` is still in flight on this session.
  // REQUIRES: `borrowed`'s and `c`'s memory stay valid until Next has answered the GEMM or the
  // session is destroyed.
  grpc::Status Submit(uint64_t gemm_id, v1::GemmRequest request, OperandBytes borrowed, CBuffer c);

  // Waits for the next answer. True: GEMM *gemm_id is answered, *done is its answer (its status
  // is StatusOf(*done); C, if it came back, is in the GEMM's buffer) and `gemm_id` may be
  // submitted again. False: the stream is over and *end says how (OK: closed, every GEMM
  // answered); every later call returns false with the same *end.
  bool Next(uint64_t* gemm_id, v1::GemmDone* done, grpc::Status* end);

  // No more submits: once the queued GEMMs are written, the stream is half-closed.
  void Close();
  // Ends the stream now (its end status CANCELLED); the GEMMs not answered never will be.
  void Cancel();

 private:
  struct Queued {
    uint64_t gemm_id;
    v1::GemmRequest request;
    OperandBytes borrowed;
  };

  // The writer thread's loop.
  void Write();
  // Before GEMM `gemm_id`'s answer is handed over: the writer reads its operands no more.
  void Answered(uint64_t gemm_id);
  // Ends the writer and takes the call's status.
  grpc::Status Finish();

  const int64_t chunk_bytes_;
  const GemmClient client_;  // a copy: the stream keeps the channels
  grpc::ClientContext context_;
  std::unique_ptr<GemmAnswerStream> stream_;
  std::thread writer_;

  // The writer reads a GEMM's operands (borrowed ones are the caller's memory) only under
  // borrow_mu_ and only while the GEMM is unanswered; the reader marks the GEMM it answers
  // (Answered) under borrow_mu_ before the caller learns of it and may free them. The server
  // answers a refused GEMM at once and drops the chunks still to come, so the writer may still
  // be sending it. Lock order: borrow_mu_, then mu_.
  std::mutex borrow_mu_;
  uint64_t writing_id_ = 0;        // guarded by borrow_mu_: the GEMM the writer sends or sent last
  bool writing_answered_ = false;  // guarded by borrow_mu_: its answer was read

  std::mutex mu_;                 // guards what follows
  std::condition_variable wake_;  // the writer's: a GEMM queued, or closing
  std::deque<Queued> queue_;
  bool closing_ = false;  // no more submits; the writer half-closes once the queue is written
  std::unordered_map<uint64_t, CBuffer> in_flight_;  // submitted, not yet answered

  // The reader's (one at a time).
  StreamAnswer answer_;  // its c_of: the in-flight GEMM's buffer
  bool over_ = false;
  grpc::Status end_;  // once over
  grpc::Status protocol_error_;
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_GEMM_STREAM_SESSION_H_
