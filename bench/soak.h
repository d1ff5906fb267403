// Soak: the core of hgemm_soak (docs/soak.md). Many concurrent clients send a mix of valid but
// varied requests to an hgemm server for a long run, and count what must never happen:
//
//   * lost responses: a call the server never finished (it ran into the generous safety
//     deadline, --call_timeout_s, instead of completing), or a GEMM on a stream that ended OK
//     without its `done`;
//   * wrong results: a successful C whose relative Frobenius error against a local fp32
//     reference (ReferenceGemm) is over the tolerance, or whose size is wrong.
//
// Each client (one thread, its own channel and TCP connection, its own x-client-id) loops over
// scenarios picked at random: a unary Gemm; a GemmStream carrying several GEMMs; a resident
// round trip (UploadMatrix A and B, Gemm by handle, sometimes keep C and DownloadMatrix it,
// ReleaseMatrix everything); a unary call, a stream or a slow upload cancelled by the client
// (TryCancel) after a random delay; a unary or stream call with a very short deadline. Every GEMM
// gets fresh random fp16 inputs (never all zeros) of random small odd-and-even shapes, so the
// references are cheap. Every call and every streamed GEMM is one request, counted by kind and
// status code. With weight_large > 0, some unary GEMMs ("large") are of log-uniform shapes up to
// large_max_dim³ (8192³ by default); a C with more than full_check_max_mnk multiply-adds and
// at least 32 rows is checked with Freivalds' random-vector test (FreivaldsError) instead of a
// full reference.
//
// Thread safety: RunSoak starts and joins its own threads; the functions are not reentrant.
#ifndef HGEMM_BENCH_SOAK_H_
#define HGEMM_BENCH_SOAK_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "proto/numerics/error_stats.h"

namespace hgemm::bench {

struct SoakOptions {
  std::string target;         // the server, HOST:PORT
  int clients = 64;           // concurrent client threads, one channel each
  int64_t requests = 100000;  // stop once this many requests (calls + streamed GEMMs) are counted
  double max_seconds = 0;     // or once this many seconds have passed (0: no time limit)
  uint32_t max_dim = 48;      // m, n, k drawn from [1, max_dim]
  int stream_gemms = 4;       // GEMMs per stream: drawn from [2, stream_gemms]
  // Scenario weights (relative): unary, stream, resident round trip, cancel, short deadline.
  int weight_unary = 35, weight_stream = 20, weight_resident = 20, weight_cancel = 12,
      weight_deadline = 13;
  // Unary GEMMs of m, n, k log-uniform in [1, large_max_dim] (one in 20 exactly
  // large_max_dim³); 0: none.
  int weight_large = 0;
  uint32_t large_max_dim = 8192;
  // Cs of more multiply-adds (m·n·k) than this are checked by FreivaldsError, not in full.
  int64_t full_check_max_mnk = int64_t{1} << 24;
  double short_deadline_max_ms = 20;              // short deadlines are uniform in [0.05, this] ms
  double cancel_after_max_ms = 20;                // TryCancel after a uniform delay in [0, this] ms
  double call_timeout_s = 60;                     // every other call's deadline: hitting it = lost
  double tolerance = kServiceTolerance.fp32_acc;  // relative Frobenius error of a correct C
  int64_t chunk_bytes = 4096;                     // stream operand chunks (several per operand)
  int64_t upload_chunk_bytes = 1024;              // chunks of the cancelled (slow) uploads
  uint64_t seed = 20261203;
  std::string client_id_prefix;  // "" → "soak-<pid>"; client i is "<prefix>-<i>"
};

struct SoakResult {
  // (kind, gRPC status code) → requests. Calls: unary, stream, upload, gemm_by_handle,
  // download, release, cancel_unary, cancel_stream, deadline_unary, deadline_stream (a stream
  // by its final status). GEMMs on streams, by their `done` status: stream_gemm,
  // cancel_stream_gemm, deadline_stream_gemm (those that got no done are in `unanswered`).
  std::map<std::pair<std::string, int>, int64_t> by_kind_status;
  int64_t requests = 0;
  int64_t lost = 0;
  int64_t wrong = 0;
  int64_t verified = 0;    // successful Cs compared with the reference
  double max_error = 0;    // largest relative error among them
  int64_t unanswered = 0;  // streamed GEMMs without a done on a stream that failed (expected)
  double seconds = 0;
  std::vector<std::string> problems;  // the first lost/wrong cases, described (at most 20)
  // Action (unary, stream, resident, large, cancel_*, deadline_*: one pick of the client's
  // loop, all its calls) → the client's wall time of each, in ms.
  std::map<std::string, std::vector<double>> action_ms;
};

// Freivalds' test of C ≈ A·B (row-major fp16, m×k by k×n) in O(mk + kn + mn) per random vector
// x ∈ [-1, 1)ⁿ instead of O(mnk): sqrt(Σ ‖C·x − A·(B·x)‖² / Σ Σᵢⱼ (cᵢⱼ·xⱼ)²) over `vectors`
// vectors, in double, which estimates C's relative Frobenius error (a right fp16 C: ~3e-4; a
// wrong block, row or a stale C: far more). It averages over m·vectors sums: give it rows (the
// soak checks Cs of fewer than 32 rows in full).
double FreivaldsError(const uint16_t* a, const uint16_t* b, const uint16_t* c, int64_t m, int64_t n,
                      int64_t k, int vectors, uint64_t seed);

// Runs the soak. REQUIRES: options.clients ≥ 1, options.requests ≥ 1, options.max_dim ≥ 1.
SoakResult RunSoak(const SoakOptions& options);

// The kind × status table, lost, wrong, and the run's length.
std::string FormatSoakResult(const SoakResult& result, const SoakOptions& options);

// VmRSS and VmHWM of a process in KiB, from /proc/<pid>/status; -1 if unreadable.
struct ProcessMemory {
  int64_t rss_kib = -1;
  int64_t hwm_kib = -1;
};
ProcessMemory ReadProcessMemory(int pid);

// "OK", "CANCELLED", ... for a gRPC status code.
std::string StatusCodeName(int code);

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_SOAK_H_
