#include "server/session/stream_session.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/backend/cpu_backend.h"
#include "server/testing/fake_read_call.h"
#include "server/testing/stream_messages.h"

namespace hgemm {
namespace {

TEST(ClientPendingBudget, BoundsEachClientOnItsOwn) {
  ClientPendingBudget budget(100);
  ASSERT_TRUE(budget.Charge("alice", 60).ok());
  EXPECT_EQ(budget.Charge("alice", 50).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(budget.Charge("bob", 50).ok());
  budget.Release("alice", 60);
  EXPECT_TRUE(budget.Charge("alice", 100).ok());
}

// What a session asked of its transport, in order.
struct Output {
  enum Kind { kChunk, kDone, kFinish } kind;
  uint64_t gemm_id = 0;
  int64_t offset = 0;
  std::string data;       // kChunk
  absl::Status status;    // kDone, kFinish
  GemmReport report;      // kDone
  ResidentMatrix kept_c;  // kDone
};

void AddFailure(const std::string& what) { ADD_FAILURE() << what; }

// One stream: a session over a transport that records what it is asked to write and, like
// gRPC, completes each write later on another thread. The test plays the client: it delivers
// messages while a read is outstanding.
class TestStream final : public FakeReadCall<StreamTransport, StreamSession, StreamMessage> {
 public:
  TestStream(GemmCoreInterface& core, const StreamOptions& options, std::string owner)
      : FakeReadCall(&AddFailure, std::chrono::seconds(60)) {
    Open(core, options, this, std::move(owner), Clock::time_point::max(), "");
    acker_ = std::thread([this] { AckWrites(); });
  }
  ~TestStream() override {
    WaitFinished();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    acker_.join();
  }

  // The GemmDone of `gemm_id` (the first one, once written), and the C chunks before it.
  Output WaitDone(uint64_t gemm_id, std::string* c = nullptr) {
    Output done{.kind = Output::kFinish};
    EXPECT_TRUE(WaitUntil([&] {
      for (const Output& o : outputs_) {
        if (o.kind == Output::kDone && o.gemm_id == gemm_id) return done = o, true;
      }
      return false;
    })) << "no answer for gemm_id "
        << gemm_id;
    if (c != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      c->clear();
      for (const Output& o : outputs_) {
        if (o.kind == Output::kChunk && o.gemm_id == gemm_id) {
          EXPECT_EQ(o.offset, int64_t(c->size()));
          *c += o.data;
        }
      }
    }
    return done;
  }
  absl::Status WaitFinish() {
    EXPECT_TRUE(WaitFinished()) << "the call never finished";
    std::lock_guard<std::mutex> lock(mu_);
    return finish_status_;
  }
  std::vector<Output> outputs() {
    std::lock_guard<std::mutex> lock(mu_);
    return outputs_;
  }

 private:
  void StartWriteChunk(uint64_t gemm_id, int64_t offset, std::string_view data) override {
    Record(
        {.kind = Output::kChunk, .gemm_id = gemm_id, .offset = offset, .data = std::string(data)});
  }
  void StartWriteDone(const AnnouncedGemm& gemm, const absl::Status& status,
                      const GemmResult& result) override {
    Record({.kind = Output::kDone,
            .gemm_id = gemm.gemm_id,
            .status = status,
            .report = result.report,
            .kept_c = result.kept_c});
  }
  void Finish(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(writing_) << "finished with a write outstanding";
    finish_status_ = status;
    outputs_.push_back({.kind = Output::kFinish, .status = status});
    FinishedLocked();
  }
  bool IsCancelled() const override { return false; }

  void Record(Output output) {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(writing_) << "two writes at once";
    EXPECT_FALSE(finished_) << "a write after Finish";
    writing_ = true;
    outputs_.push_back(std::move(output));
    changed_.notify_all();
  }

  // Completes each write, as gRPC does: later, on its own thread.
  void AckWrites() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [this] { return stopping_ || writing_; });
      if (stopping_) return;
      writing_ = false;
      lock.unlock();
      session().OnWriteDone(true);
      lock.lock();
    }
  }

  bool writing_ = false;
  bool stopping_ = false;
  absl::Status finish_status_;
  std::vector<Output> outputs_;
  std::thread acker_;
};

// Real core services on the CPU backend, as the server composes them.
class StreamSessionTest : public ::testing::Test {
 protected:
  StreamSessionTest() {
    options_.stream_chunk_bytes = 16;  // several C chunks even for small GEMMs
    options_.max_stream_pending_bytes = 1 << 20;
  }

  std::unique_ptr<TestStream> Open(const std::string& owner = "alice") {
    return std::make_unique<TestStream>(*core_, options_, owner);
  }

  std::unique_ptr<GemmCore> MakeCore(int64_t max_client_pending_bytes) {
    return std::make_unique<GemmCore>(
        &scheduler_, backend_.get(), &store_, &uploads_,
        GemmCoreOptions{.rules = {.kernels = backend_->Kernels()},
                        .max_client_pending_bytes = max_client_pending_bytes,
                        .result_buffer_pool_bytes = 1 << 20});
  }

  // Random operands of an m×n×k GEMM, and its fp32 reference.
  struct Operands {
    std::string a, b;
    std::vector<float> reference;
  };
  Operands Random(int64_t m, int64_t n, int64_t k) {
    const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng_),
                                b = RandomHalfMatrix(k * n, rng_);
    return {.a = std::string(reinterpret_cast<const char*>(a.data()), 2 * a.size()),
            .b = std::string(reinterpret_cast<const char*>(b.data()), 2 * b.size()),
            .reference = ReferenceGemm(a.data(), b.data(), m, n, k)};
  }

  // Sends a whole m×n×k GEMM (A in two chunks, B in one) and checks its answer and C.
  void RunGemm(TestStream& stream, uint64_t id, int64_t m, int64_t n, int64_t k) {
    const Operands ops = Random(m, n, k);
    const size_t half = ops.a.size() / 2;
    ASSERT_TRUE(stream.Deliver(StreamHeader(id, m, n, k)));
    ASSERT_TRUE(stream.Deliver(StreamChunk(id, ChunkOperand::kA, 0, ops.a.substr(0, half))));
    ASSERT_TRUE(stream.Deliver(StreamChunk(id, ChunkOperand::kA, half, ops.a.substr(half))));
    ASSERT_TRUE(stream.Deliver(StreamChunk(id, ChunkOperand::kB, 0, ops.b)));
    std::string c;
    const Output done = stream.WaitDone(id, &c);
    ASSERT_TRUE(done.status.ok()) << done.status;
    ASSERT_EQ(c.size(), size_t(2 * m * n));
    EXPECT_LT(RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()),
                                     ops.reference.data(), m * n),
              1e-2);
  }

  std::unique_ptr<Backend> backend_ = MakeCpuBackend({.workers = 2});
  MatrixStore store_{backend_.get(), {}};
  Scheduler scheduler_{backend_.get(), {.idle_spin = std::chrono::microseconds(0)}};
  UploadQueue uploads_{backend_.get(), 2};
  std::unique_ptr<GemmCore> core_ = MakeCore(1 << 20);
  StreamOptions options_;
  std::mt19937_64 rng_{13};
};

TEST_F(StreamSessionTest, AnswersEachGemmWithItsCInChunksThenFinishesOk) {
  auto stream = Open();
  RunGemm(*stream, 1, 4, 8, 4);  // C: 64 bytes, four 16-byte chunks
  RunGemm(*stream, 2, 3, 5, 7);  // C: 30 bytes, the last chunk short
  stream->CloseReads();
  EXPECT_TRUE(stream->WaitFinish().ok());
  int chunks_of_1 = 0;
  for (const Output& o : stream->outputs())
    chunks_of_1 += o.kind == Output::kChunk && o.gemm_id == 1;
  EXPECT_EQ(chunks_of_1, 4);
}

TEST_F(StreamSessionTest, AGemmRefusedAtItsHeaderIsAnsweredAtOnceAndLaterOnesGoOn) {
  auto stream = Open();
  // Unknown handle: refused by the session (NOT_FOUND), before any chunk is sent.
  ASSERT_TRUE(stream->Deliver(StreamHeader(1, 4, 4, 4, "no-such-matrix")));
  EXPECT_EQ(stream->WaitDone(1).status.code(), absl::StatusCode::kNotFound);
  // Its B chunks are dropped, and the stream reads on.
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kB, 0, std::string(32, '\0'))));
  // A bad header: refused by the assembler (INVALID_ARGUMENT); its chunks are dropped too.
  ASSERT_TRUE(stream->Deliver(StreamHeader(2, 0, 4, 4)));
  EXPECT_EQ(stream->WaitDone(2).status.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(stream->Deliver(StreamChunk(2, ChunkOperand::kA, 0, std::string(8, '\0'))));
  RunGemm(*stream, 3, 4, 4, 4);
  stream->CloseReads();
  EXPECT_TRUE(stream->WaitFinish().ok());
}

TEST_F(StreamSessionTest, AnIdleGemmIsAnsweredAndItsLateChunksAreDropped) {
  auto stream = Open();
  const Operands ops = Random(4, 4, 4);
  ASSERT_TRUE(stream->Deliver(StreamHeader(1, 4, 4, 4)));
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kA, 0, ops.a.substr(0, 8))));
  stream->session().ExpireIdle(Clock::now() + std::chrono::hours(1));
  EXPECT_EQ(stream->WaitDone(1).status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kA, 8, ops.a.substr(8))));
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kB, 0, ops.b)));
  RunGemm(*stream, 2, 4, 4, 4);
  stream->CloseReads();
  EXPECT_TRUE(stream->WaitFinish().ok());
  int answers_of_1 = 0;
  for (const Output& o : stream->outputs())
    answers_of_1 += o.kind == Output::kDone && o.gemm_id == 1;
  EXPECT_EQ(answers_of_1, 1);
}

TEST_F(StreamSessionTest, RefusesAHeaderOverTheStreamsPendingBytes) {
  options_.max_stream_pending_bytes = 100;
  auto stream = Open();
  const Operands ops = Random(4, 4, 4);  // 64 bytes of A and B
  ASSERT_TRUE(stream->Deliver(StreamHeader(1, 4, 4, 4)));
  ASSERT_TRUE(stream->Deliver(StreamHeader(2, 4, 4, 4)));  // 128 pending: over
  EXPECT_EQ(stream->WaitDone(2).status.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kA, 0, ops.a)));
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kB, 0, ops.b)));
  EXPECT_TRUE(stream->WaitDone(1).status.ok());
  RunGemm(*stream, 3, 4, 4, 4);  // 1 is all in: its bytes are free again
  stream->CloseReads();
  EXPECT_TRUE(stream->WaitFinish().ok());
}

TEST_F(StreamSessionTest, RefusesAHeaderOverTheClientsPendingBytesAcrossStreams) {
  core_ = MakeCore(100);
  auto first = Open("alice"), second = Open("alice"), other = Open("bob");
  const Operands ops = Random(4, 4, 4);
  ASSERT_TRUE(first->Deliver(StreamHeader(1, 4, 4, 4)));  // alice: 64 of 100 pending
  ASSERT_TRUE(second->Deliver(StreamHeader(1, 4, 4, 4)));
  const Output refused = second->WaitDone(1);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status.message().find("max_client_pending_bytes"), std::string::npos);
  RunGemm(*other, 1, 4, 4, 4);  // bob has a budget of his own
  ASSERT_TRUE(first->Deliver(StreamChunk(1, ChunkOperand::kA, 0, ops.a)));
  ASSERT_TRUE(first->Deliver(StreamChunk(1, ChunkOperand::kB, 0, ops.b)));
  EXPECT_TRUE(first->WaitDone(1).status.ok());
  RunGemm(*second, 2, 4, 4, 4);  // alice's bytes are free again
  for (TestStream* s : {first.get(), second.get(), other.get()}) {
    s->CloseReads();
    EXPECT_TRUE(s->WaitFinish().ok());
  }
}

TEST_F(StreamSessionTest, DrainEndsAnIdleStreamAtOnce) {
  auto stream = Open();
  RunGemm(*stream, 1, 4, 4, 4);
  stream->session().Drain();
  EXPECT_EQ(stream->WaitFinish().code(), absl::StatusCode::kUnavailable);
}

TEST_F(StreamSessionTest, DrainRefusesNewGemmsAndWaitsForAHalfReceivedOne) {
  auto stream = Open();
  const Operands ops = Random(4, 4, 4);
  ASSERT_TRUE(stream->Deliver(StreamHeader(1, 4, 4, 4)));
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kA, 0, ops.a)));
  stream->session().Drain();
  ASSERT_TRUE(stream->Deliver(StreamHeader(2, 4, 4, 4)));
  EXPECT_EQ(stream->WaitDone(2).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(stream->finished());  // 1 is half-received
  ASSERT_TRUE(stream->Deliver(StreamChunk(1, ChunkOperand::kB, 0, ops.b)));
  std::string c;
  EXPECT_TRUE(stream->WaitDone(1, &c).status.ok());
  EXPECT_LT(
      RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()), ops.reference.data(), 16),
      1e-2);
  EXPECT_EQ(stream->WaitFinish().code(), absl::StatusCode::kUnavailable);
}

TEST_F(StreamSessionTest, ABrokenOrderRuleStopsTheReadsAndFailsTheCallAfterTheAnswers) {
  auto stream = Open();
  RunGemm(*stream, 1, 4, 4, 4);
  ASSERT_TRUE(stream->Deliver(StreamChunk(9, ChunkOperand::kA, 0, "xx")));  // no header for 9
  EXPECT_FALSE(stream->Deliver(StreamHeader(10, 4, 4, 4)));                 // no read was started
  const absl::Status s = stream->WaitFinish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk.gemm_id"), std::string::npos) << s;
  EXPECT_EQ(stream->outputs().back().kind, Output::kFinish);
}

TEST_F(StreamSessionTest, ClosingWithAnIncompleteGemmFailsTheCall) {
  auto stream = Open();
  const Operands ops = Random(4, 4, 4);
  ASSERT_TRUE(stream->Deliver(StreamHeader(5, 4, 4, 4)));
  ASSERT_TRUE(stream->Deliver(StreamChunk(5, ChunkOperand::kA, 0, ops.a)));
  stream->CloseReads();
  const absl::Status s = stream->WaitFinish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gemm_id 5 was incomplete"), std::string::npos) << s;
}

}  // namespace
}  // namespace hgemm
