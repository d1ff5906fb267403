// The memory layout of a submission ring (proto/hgemm.proto, "Submission ring"): what a
// same-host client and the server both map. Little-endian, offsets from the region's start:
//
//   0                      RingHeader (kRingHeaderBytes): magic, version, then the SQ head,
//                          SQ tail, CQ head, CQ tail and the two "sleeping" words, each a
//                          32-bit atomic alone on its cache line
//   kRingHeaderBytes       sq_entries RingSubmission (128 bytes each)
//   RingCqOffset(sq)       cq_entries RingCompletion (128 bytes each)
//
// Heads and tails count entries ever consumed / published (they wrap at 2^32); entry i is at
// index i & (entries - 1). The client writes SQ entries, then the SQ tail (release); the
// server reads the tail (acquire), copies each entry out once and writes the SQ head. The
// server writes CQ entries, then the CQ tail; the client reads them and writes the CQ head.
// A side that found nothing to do for a while sets its "sleeping" word to 1, checks once more
// and sleeps on that word while it is 1 (FUTEX_WAIT, not private: the words are in a shared
// mapping). The other side, after publishing, swaps the word to 0 and wakes it (FUTEX_WAKE)
// only if it was 1: a wake that comes before the sleep makes the sleep return at once.
//
// The server trusts nothing in the ring: the sizes are its own copy of AttachRingRequest's,
// every entry is copied out before it is read, and an impossible tail or head detaches the
// ring.
// Thread safety: plain layout; the atomics are the only words both sides write.
#ifndef HGEMM_PROTO_RING_LAYOUT_H_
#define HGEMM_PROTO_RING_LAYOUT_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace hgemm {

inline constexpr uint32_t kRingMagic = 0x48524e47;  // "HRNG"
inline constexpr uint32_t kRingVersion = 1;
inline constexpr uint32_t kRingMaxEntries = 4096;
inline constexpr uint32_t kRingCacheLine = 64;

struct RingHeader {
  uint32_t magic;    // kRingMagic, written by the client before AttachRing
  uint32_t version;  // kRingVersion
  alignas(kRingCacheLine) std::atomic<uint32_t> sq_head;  // the server's: entries consumed
  alignas(kRingCacheLine) std::atomic<uint32_t> sq_tail;  // the client's: entries published
  alignas(kRingCacheLine) std::atomic<uint32_t> cq_head;  // the client's: completions reaped
  alignas(kRingCacheLine) std::atomic<uint32_t> cq_tail;  // the server's: completions published
  alignas(kRingCacheLine) std::atomic<uint32_t> server_sleeping;  // 1: the server sleeps on it
  alignas(kRingCacheLine) std::atomic<uint32_t> client_sleeping;  // 1: a client thread does
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");

inline constexpr uint32_t kRingHeaderBytes = 512;
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);

// Where an operand is.
enum RingOperandKind : uint32_t {
  kRingOperandNone = 0,    // no operand (C_in without beta)
  kRingOperandRegion = 1,  // region slot `slot`, from byte `offset`
  kRingOperandMatrix = 2,  // resident matrix slot `slot` (offset unused)
};

struct RingOperand {
  uint32_t kind;  // RingOperandKind
  uint32_t slot;  // AttachRingRequest.regions or .matrices index
  uint64_t offset;
};

enum RingSubmissionFlags : uint32_t {
  kRingTransposeA = 1,  // GemmRequest.transpose_a
  kRingTransposeB = 2,
  kRingHasAlpha = 4,  // alpha is set (else 1)
  // C stays on the server as a new resident matrix of the owner (GemmRequest.keep_c_resident;
  // `c` is kRingOperandNone): an OK completion's message is its handle.
  kRingKeepC = 8,
  // deadline_ns is set: an entry the server reads after it, or would start after it, completes
  // with DEADLINE_EXCEEDED without running (its C is not written).
  kRingHasDeadline = 16,
};

// RingSubmission.dtype and c_dtype: the numbers of hgemm.v1.DataType.
inline constexpr uint32_t kRingDataTypeUnspecified = 0;  // A and B fp16; C their type
inline constexpr uint32_t kRingDataTypeFp16 = 1;
inline constexpr uint32_t kRingDataTypeBf16 = 2;
inline constexpr uint32_t kRingDataTypeFp32 = 3;  // C only

// RingSubmission.accumulation and RingCompletion.accumulation: the numbers of
// hgemm.v1.Accumulation.
inline constexpr uint32_t kRingAccumulationUnspecified = 0;  // FP32
inline constexpr uint32_t kRingAccumulationFp16 = 1;
inline constexpr uint32_t kRingAccumulationFp32 = 2;

// One GEMM, as GemmRequest would say it.
struct RingSubmission {
  uint64_t user_data;  // echoed in its completion
  uint32_t m, n, k;
  uint32_t flags;           // RingSubmissionFlags
  uint32_t dtype, c_dtype;  // kRingDataType*
  uint32_t accumulation;    // kRingAccumulation*
  uint32_t kernel;          // 0: auto; i: RingAttached.kernels[i - 1]
  float alpha, beta;
  uint64_t timeout_us;  // 0: none; else the GEMM's deadline, from when the server reads it
  RingOperand a, b;     // region or matrix
  RingOperand c_in;     // read only when beta ≠ 0
  RingOperand c;        // a region, or a matrix that C is written into in place; or
                        // kRingOperandNone with kRingKeepC
  // With kRingHasDeadline: CLOCK_MONOTONIC nanoseconds (std::chrono::steady_clock on Linux),
  // the same clock for both sides on one host (outside time namespaces), so that time spent
  // waiting in the SQ counts, unlike timeout_us's.
  uint64_t deadline_ns;
};
static_assert(sizeof(RingSubmission) == 128);

enum RingCompletionFlags : uint32_t {
  // kernel, accumulation, device_id and stream_id are set: what ran the GEMM (on OK).
  kRingCompletionExecution = 1,
};

// How one GEMM ended.
//
// The execution fields took the last 8 bytes of what was a 96-byte message, and the flags
// word was a reserved one, always 0: a client built before them reads a message that still
// ends at its NUL and ignores the rest, and a client built after them, served by a server
// from before, sees no kRingCompletionExecution. So kRingVersion stays 1.
struct RingCompletion {
  uint64_t user_data;
  int32_t code;    // google.rpc.Code (as grpc::StatusCode): 0 OK
  uint32_t flags;  // RingCompletionFlags
  float queue_wait_ms, kernel_ms, server_total_ms, tflops;
  // The status message, cut to fit, NUL-terminated; on OK of a kRingKeepC entry the kept C's
  // handle (at most kRingMaxHandleBytes).
  char message[88];
  // With kRingCompletionExecution, what GemmResponse.execution says of a Gemm call; the
  // names are in the ring's RingAttached (proto/ring_execution.h resolves them).
  uint16_t kernel;        // i: RingAttached.kernels[i - 1]; 0: a kernel not in that list
  uint16_t accumulation;  // the kRingAccumulation* used
  int16_t device_id;      // Execution.device_id (-1 on the CPU backend): RingAttached.devices
  uint16_t stream_id;     // Execution.stream_id
};
inline constexpr size_t kRingMaxHandleBytes = sizeof(RingCompletion::message) - 1;
static_assert(sizeof(RingCompletion) == 128);

// Offsets and the region size a ring of these counts takes.
constexpr uint64_t RingSqOffset() { return kRingHeaderBytes; }
constexpr uint64_t RingCqOffset(uint32_t sq_entries) {
  return RingSqOffset() + uint64_t{sq_entries} * sizeof(RingSubmission);
}
constexpr uint64_t RingBytes(uint32_t sq_entries, uint32_t cq_entries) {
  return RingCqOffset(sq_entries) + uint64_t{cq_entries} * sizeof(RingCompletion);
}

// Sleeps while *word == expected, at most `timeout_ns` (woken by RingFutexWake on the same
// word in any process mapping it). Spurious returns are fine: callers check again.
inline void RingFutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  timespec timeout{time_t(timeout_ns / 1000000000), long(timeout_ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

// Wakes every sleeper on `word`.
inline void RingFutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// The waker's half: clears a "sleeping" word and wakes its sleeper if there was one.
inline void RingWakeSleeper(std::atomic<uint32_t>* sleeping) {
  if (sleeping->exchange(0) != 0) RingFutexWake(sleeping);
}

}  // namespace hgemm

#endif  // HGEMM_PROTO_RING_LAYOUT_H_
