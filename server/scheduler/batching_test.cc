// Batching through the scheduler on the CPU backend: GEMMs queued together against one
// resident B run as one launch (Backend::RunBatch) and each gets its own C, checked against an
// fp32 reference; what may not share a launch (other scales, another owner, batching off, past
// max_batch_rows) does not; cancelled, expired and failing members are answered on their own;
// a lone GEMM runs alone; the batch window waits for a late member; a failed check reruns the
// members alone. The only slot is held by a GEMM at a gate while a test queues its members, so
// that they are all queued when the worker takes the first.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "server/backend/cpu_backend.h"
#include "server/scheduler/scheduler.h"
#include "server/testing/c_faults.h"
#include "server/testing/gated_backend.h"
#include "server/testing/shared_b_gemms.h"

namespace hgemm {
namespace {

// Answers by member index.
class Answers {
 public:
  GemmDone For(int index) {
    return [this, index](const absl::Status& s, const GemmReport& report) {
      std::lock_guard<std::mutex> lock(mu_);
      done_[index] = {s, report};
      cv_.notify_all();
    };
  }
  void WaitFor(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_.size() >= count; });
  }
  absl::Status status(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_.at(index).first;
  }
  GemmReport report(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_.at(index).second;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::pair<absl::Status, GemmReport>> done_;  // guarded by mu_
};

class BatchingTest : public ::testing::Test {
 protected:
  // A scheduler over a CPU backend of one slot behind a gate, and a resident B of `form`.
  void Start(SchedulerOptions options = {}, CpuBackendOptions cpu = {}, const GemmForm& form = {}) {
    cpu.workers = 1;
    backend_ = std::make_unique<GatedBackend>(MakeCpuBackend(cpu));
    scheduler_ = std::make_unique<Scheduler>(backend_.get(), options);
    b_ = std::make_unique<SharedB>(backend_.get(), 48, 96, form, rng_);
  }
  void TearDown() override {
    if (scheduler_) scheduler_->Shutdown();
  }

  // Holds the only slot: a GEMM (of host operands, never batched) waits at the gate until
  // Release(), so that what is enqueued meanwhile is queued together.
  void HoldTheSlot() {
    blocker_.shape = {.m = 4, .n = 4, .k = 4};
    blocker_.a = blocker_operands_.data();
    blocker_.b = blocker_operands_.data();
    blocker_.c = blocker_c_.data();
    ASSERT_TRUE(scheduler_->Enqueue(blocker_, blocker_answer_.For(0)).ok());
    backend_->AwaitWaiting();
  }
  void Release() {
    backend_->Open();
    blocker_answer_.WaitFor(1);
  }

  std::unique_ptr<RowsGemm> Member(int64_t m, float alpha = 1, float beta = 0,
                                   CSink sink = CSink::kHost) {
    return std::make_unique<RowsGemm>(backend_.get(), *b_, m, rng_, alpha, beta, sink);
  }
  void Enqueue(const RowsGemm& member, int index) {
    ASSERT_TRUE(scheduler_->Enqueue(member.job, answers_.For(index)).ok());
  }
  // Nothing queued, running or admitted is left, and every admitted GEMM completed.
  void ExpectSettled() {
    const Scheduler::Stats stats = scheduler_->GetStats();
    EXPECT_EQ(stats.queued, 0);
    EXPECT_EQ(stats.running, 0);
    EXPECT_EQ(stats.admitted_bytes, 0);
    EXPECT_EQ(stats.completed_total, stats.admitted_total);
  }

  // Four members, three of them checked; `corrupted`: the first launch's C is damaged (that
  // of a GEMM on the shared B: not the one holding the slot).
  void ChecksMembers(bool corrupted) {
    corrupt_ = corrupted ? 1 : 0;
    Start({.verify_failures_to_retire = 0},
          {.after_gemm = [this](int, const GemmJob& job, void* c) {
            if (job.b_resident && corrupt_.fetch_sub(1) > 0) {
              CorruptC(CFault::kRowZeroed, job.shape.c_type, job.shape.n, c, job.shape.m - 1, 0);
            }
          }});
    HoldTheSlot();
    std::vector<std::unique_ptr<RowsGemm>> members;
    for (int i = 0; i < 4; ++i) {
      members.push_back(Member(4 + i));
      members.back()->job.verify = i < 3;  // the last one is not checked: a batch of its own
      Enqueue(*members.back(), i);
    }
    Release();
    answers_.WaitFor(4);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(answers_.status(i).ok()) << answers_.status(i);
      const GemmReport report = answers_.report(i);
      EXPECT_EQ(report.batch_size, i == 3 || corrupted ? 1 : 3) << i;
      EXPECT_EQ(report.batch_rows, i == 3 || corrupted ? 0 : 4 + 5 + 6) << i;
      EXPECT_EQ(report.verified_repetitions, i == 3 ? 0 : 1) << i;
      EXPECT_TRUE(members[i]->Correct(report)) << i;
    }
    const Scheduler::VerifyStats verify = scheduler_->GetVerifyStats()[0];
    EXPECT_EQ(verify.verified, 3);
    EXPECT_EQ(verify.failures, corrupted ? 1 : 0);
    ExpectSettled();
  }
  void RunsAsOneGemm(const GemmForm& form);

  std::mt19937_64 rng_{20261208};
  std::atomic<int> corrupt_{0};  // runs whose C the backend damages (ChecksMembers)
  std::unique_ptr<GatedBackend> backend_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<SharedB> b_;
  Answers answers_;
  GemmJob blocker_;
  std::vector<uint16_t> blocker_operands_ = std::vector<uint16_t>(16, 0x3C00);
  std::vector<uint16_t> blocker_c_ = std::vector<uint16_t>(16);
  Answers blocker_answer_;
};

// Members of different m, scaled with their own C_in, into every sink, in `form`.
void BatchingTest::RunsAsOneGemm(const GemmForm& form) {
  Start({}, {}, form);
  HoldTheSlot();
  std::vector<std::unique_ptr<RowsGemm>> members;
  members.push_back(Member(1, 0.75f, -1.25f));
  members.push_back(Member(7, 0.75f, -1.25f, CSink::kKeepC));
  members.push_back(Member(16, 0.75f, -1.25f, CSink::kDevice));
  members.push_back(Member(3, 0.75f, -1.25f));
  members.push_back(Member(33, 0.75f, -1.25f, CSink::kKeepC));
  for (size_t i = 0; i < members.size(); ++i) Enqueue(*members[i], int(i));
  Release();
  answers_.WaitFor(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    ASSERT_TRUE(answers_.status(int(i)).ok()) << i << ": " << answers_.status(int(i));
    const GemmReport report = answers_.report(int(i));
    EXPECT_EQ(report.batch_size, 5) << i;
    EXPECT_EQ(report.batch_rows, 60) << i;
    EXPECT_GE(report.queue_wait_ms, 0);
    EXPECT_GE(report.server_total_ms, report.queue_wait_ms);
    EXPECT_TRUE(members[i]->Correct(report)) << i;
  }
  const Scheduler::BatchStats stats = scheduler_->GetBatchStats();
  EXPECT_EQ(stats.batches, 1);
  EXPECT_EQ(stats.by_members, (std::map<int64_t, int64_t>{{5, 1}}));
  EXPECT_EQ(stats.by_rows, (std::map<int64_t, int64_t>{{60, 1}}));
  ExpectSettled();
}

TEST_F(BatchingTest, QueuedMembersRunAsOneGemmEachWithItsOwnC) { RunsAsOneGemm({}); }

TEST_F(BatchingTest, TransposedMembersWithAnFp32CRunAsOneGemm) {
  RunsAsOneGemm({.transpose_a = true, .transpose_b = true, .c_fp32 = true});
}

TEST_F(BatchingTest, OtherScalesRunInAnotherBatch) {
  Start();
  HoldTheSlot();
  std::vector<std::unique_ptr<RowsGemm>> members;
  for (int i = 0; i < 4; ++i) members.push_back(Member(5 + i, i % 2 == 0 ? 2.0f : 0.5f));
  for (size_t i = 0; i < members.size(); ++i) Enqueue(*members[i], int(i));
  Release();
  answers_.WaitFor(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    ASSERT_TRUE(answers_.status(int(i)).ok()) << answers_.status(int(i));
    const GemmReport report = answers_.report(int(i));
    EXPECT_EQ(report.batch_size, 2) << i;
    EXPECT_EQ(report.batch_rows, i % 2 == 0 ? 5 + 7 : 6 + 8) << i;
    EXPECT_TRUE(members[i]->Correct(report)) << i;
  }
  EXPECT_EQ(scheduler_->GetBatchStats().batches, 2);
  ExpectSettled();
}

// Cancelled and expired members are answered so without running; a member whose C cannot be
// kept (past the backend's budget) fails on its own; the others run together and are right.
TEST_F(BatchingTest, CancelledExpiredAndFailingMembersLeaveTheOthersAlone) {
  const int64_t b_bytes = 48 * 96 * 2;
  Start({}, {.resident_budget_bytes = b_bytes + 4096});
  HoldTheSlot();
  std::unique_ptr<RowsGemm> first = Member(9), cancelled = Member(4), expired = Member(6),
                            unkept = Member(64, 1, 0, CSink::kKeepC), last = Member(12);
  cancelled->job.is_cancelled = [] { return true; };
  expired->job.deadline = Clock::now();
  Enqueue(*first, 0);
  Enqueue(*cancelled, 1);
  Enqueue(*expired, 2);
  Enqueue(*unkept, 3);
  Enqueue(*last, 4);
  Release();
  answers_.WaitFor(5);
  for (int i : {0, 4}) {
    ASSERT_TRUE(answers_.status(i).ok()) << answers_.status(i);
    EXPECT_EQ(answers_.report(i).batch_size, 3);  // with `unkept`, which then ran alone
    EXPECT_EQ(answers_.report(i).batch_rows, 9 + 64 + 12);
  }
  EXPECT_TRUE(first->Correct(answers_.report(0)));
  EXPECT_TRUE(last->Correct(answers_.report(4)));
  EXPECT_EQ(answers_.status(1).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(cancelled->Untouched());
  EXPECT_EQ(answers_.status(2).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(expired->Untouched());
  EXPECT_EQ(answers_.status(3).code(), absl::StatusCode::kResourceExhausted) << answers_.status(3);
  EXPECT_EQ(answers_.report(3).batch_size, 1);
  EXPECT_EQ(answers_.report(3).c_resident, nullptr);
  ExpectSettled();
}

// Handles are private to their owner, so two owners never share a B in the server; were they
// to (as here), their GEMMs still would not share a launch.
TEST_F(BatchingTest, TwoOwnersNeverShareABatch) {
  Start();
  HoldTheSlot();
  std::vector<std::unique_ptr<RowsGemm>> members;
  for (int i = 0; i < 4; ++i) {
    members.push_back(Member(3 + i));
    members.back()->job.owner = i % 2 == 0 ? "alice" : "bob";
    Enqueue(*members.back(), i);
  }
  Release();
  answers_.WaitFor(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(answers_.status(i).ok()) << answers_.status(i);
    EXPECT_EQ(answers_.report(i).batch_size, 2);
    EXPECT_EQ(answers_.report(i).batch_rows, i % 2 == 0 ? 3 + 5 : 4 + 6);
    EXPECT_TRUE(members[i]->Correct(answers_.report(i)));
  }
  ExpectSettled();
}

TEST_F(BatchingTest, ALoneGemmRunsAlone) {
  Start();
  backend_->Open();  // no slot to hold
  std::unique_ptr<RowsGemm> member = Member(11);
  Enqueue(*member, 0);
  answers_.WaitFor(1);
  ASSERT_TRUE(answers_.status(0).ok()) << answers_.status(0);
  EXPECT_EQ(answers_.report(0).batch_size, 1);
  EXPECT_EQ(answers_.report(0).batch_rows, 0);
  EXPECT_TRUE(member->Correct(answers_.report(0)));
  EXPECT_EQ(scheduler_->GetBatchStats().batches, 0);
  ExpectSettled();
}

// The worker holding a GEMM waits out the window for a member that comes later; the batch is
// full (max_batch_rows) once it has, so the long window ends there.
TEST_F(BatchingTest, TheWindowGathersALateMember) {
  Start({.batch_window = std::chrono::seconds(60), .max_batch_rows = 10 + 6});
  backend_->Open();  // no slot to hold
  std::unique_ptr<RowsGemm> early = Member(10), late = Member(6);
  Enqueue(*early, 0);
  // Taken by the worker, which now waits for more.
  while (scheduler_->GetStats().running == 0) std::this_thread::yield();
  Enqueue(*late, 1);
  answers_.WaitFor(2);
  for (int i : {0, 1}) {
    ASSERT_TRUE(answers_.status(i).ok()) << answers_.status(i);
    EXPECT_EQ(answers_.report(i).batch_size, 2);
    EXPECT_EQ(answers_.report(i).batch_rows, 16);
  }
  EXPECT_TRUE(early->Correct(answers_.report(0)));
  EXPECT_TRUE(late->Correct(answers_.report(1)));
  ExpectSettled();
}

TEST_F(BatchingTest, AWindowWithNoLateMemberEndsWithTheGemmAlone) {
  Start({.batch_window = std::chrono::milliseconds(20)});
  backend_->Open();  // no slot to hold
  std::unique_ptr<RowsGemm> member = Member(10);
  Enqueue(*member, 0);
  answers_.WaitFor(1);
  ASSERT_TRUE(answers_.status(0).ok()) << answers_.status(0);
  EXPECT_EQ(answers_.report(0).batch_size, 1);
  EXPECT_TRUE(member->Correct(answers_.report(0)));
  ExpectSettled();
}

TEST_F(BatchingTest, BatchingOffNeverBatches) {
  Start({.batching = false});
  HoldTheSlot();
  std::vector<std::unique_ptr<RowsGemm>> members;
  for (int i = 0; i < 3; ++i) {
    members.push_back(Member(2 + i));
    Enqueue(*members.back(), i);
  }
  Release();
  answers_.WaitFor(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(answers_.status(i).ok()) << answers_.status(i);
    EXPECT_EQ(answers_.report(i).batch_size, 1);
    EXPECT_TRUE(members[i]->Correct(answers_.report(i)));
  }
  EXPECT_EQ(scheduler_->GetBatchStats().batches, 0);
  ExpectSettled();
}

// Members join while the rows fit; a GEMM larger than the bound on its own runs alone.
TEST_F(BatchingTest, MaxBatchRowsBoundsABatch) {
  Start({.max_batch_rows = 20});
  HoldTheSlot();
  std::vector<std::unique_ptr<RowsGemm>> members;
  for (int64_t m : {8, 8, 30, 8, 8}) {
    members.push_back(Member(m));
    Enqueue(*members.back(), int(members.size()) - 1);
  }
  Release();
  answers_.WaitFor(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    ASSERT_TRUE(answers_.status(int(i)).ok()) << answers_.status(int(i));
    EXPECT_EQ(answers_.report(int(i)).batch_size, i == 2 ? 1 : 2) << i;
    EXPECT_TRUE(members[i]->Correct(answers_.report(int(i)))) << i;
  }
  EXPECT_EQ(scheduler_->GetBatchStats().by_rows, (std::map<int64_t, int64_t>{{16, 2}}));
  ExpectSettled();
}

// Checked members share a launch only with members checked alike, and the launch's C is
// checked once.
TEST_F(BatchingTest, CheckedMembersAreCheckedTogether) { ChecksMembers(/*corrupted=*/false); }

// When the launch's check fails, every member is rerun alone, and answered right.
TEST_F(BatchingTest, AFailedCheckRerunsTheMembersAlone) { ChecksMembers(/*corrupted=*/true); }

}  // namespace
}  // namespace hgemm
