// The CPU backend: fp16 → fp32, OpenBLAS sgemm (multi-threaded), → fp16. Always fp32
// accumulation. Used when no GPU is present, and as the backend of the server's tests. Its
// Freivalds check (GemmJob::verify_repetitions) runs the host passes of
// server/verify/freivalds.h, op(B)·r kept per resident B.
#ifndef HGEMM_SERVER_BACKEND_CPU_BACKEND_H_
#define HGEMM_SERVER_BACKEND_CPU_BACKEND_H_

#include <functional>
#include <memory>

#include "server/backend/backend.h"

namespace hgemm {

struct CpuBackendOptions {
  // Concurrent GEMMs; each one is itself parallelised by OpenBLAS.
  int workers = 2;
  // Largest GEMM one worker takes (operand + result bytes; fp32 temporaries come on top).
  int64_t max_job_bytes = int64_t{8} << 30;
  // Host memory resident matrices may take in all.
  int64_t resident_budget_bytes = int64_t{8} << 30;
  // Released resident memory (buffers of at least 1 MiB) kept for the next allocation of the
  // same size, on top of the budget. Fresh memory costs a page fault and a zeroed page per
  // 4 KiB at its first touch, which is the upload's copy: most of an upload's server CPU.
  // Like device memory, a reused buffer holds its last matrix's bytes until overwritten.
  int64_t resident_reuse_bytes = int64_t{1} << 30;
  // Runs on C (the job's whole C, as written) between the GEMM and its check
  // (GemmJob::verify_repetitions), on the slot's thread: the tests' fault injector, which
  // corrupts C there as a faulty device would. Empty in the server.
  std::function<void(int slot, const GemmJob& job, void* c)> after_gemm;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_CPU_BACKEND_H_
