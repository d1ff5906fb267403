// RunJob: enqueues one GEMM on a Scheduler and waits for its answer, for the tests and
// benchmarks that drive the scheduler in process. Test-only.
// Thread safety: as Scheduler::Enqueue; blocks the calling thread until the answer.
#ifndef HGEMM_SERVER_TESTING_RUN_JOB_H_
#define HGEMM_SERVER_TESTING_RUN_JOB_H_

#include <absl/status/status.h>

#include <future>
#include <utility>

#include "server/scheduler/scheduler.h"

namespace hgemm {

struct JobAnswer {
  absl::Status status;  // the refusal, if the job was not admitted
  GemmReport report;
};

inline JobAnswer RunJob(Scheduler& scheduler, GemmJob job) {
  std::promise<JobAnswer> answered;
  auto future = answered.get_future();
  const absl::Status admitted =
      scheduler.Enqueue(std::move(job), [&](const absl::Status& s, const GemmReport& r) {
        // A fresh Status, not a copy: a copy shares s's reference-counted message, whose count
        // lives in Debian's uninstrumented absl, and TSan then sees the worker's final release
        // race this thread's earlier read of the message.
        answered.set_value({absl::Status(s.code(), s.message()), r});
      });
  if (!admitted.ok()) return {admitted, {}};
  return future.get();
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_RUN_JOB_H_
