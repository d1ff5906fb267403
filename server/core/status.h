// The server's status type is absl::Status. Every status the server returns is made here, so
// that each code keeps one meaning (docs/errors.md is their description for clients):
//   INVALID_ARGUMENT    the request is malformed (the message names the field)
//   NOT_FOUND           a handle (matrix, region, ring) names nothing this client may use
//   RESOURCE_EXHAUSTED  the request is larger than a configured limit; retrying will not help
//   UNAVAILABLE         the server is busy (queue full) or shutting down: nothing was run,
//                       retry with backoff, elsewhere; or the device the GEMM needed has
//                       failed (a sticky CUDA error): retry on another server
//   DEADLINE_EXCEEDED   the call's deadline passed while it waited; it was not run (or, for
//                       a streamed GEMM or upload, its chunks stopped coming: Idle)
//   CANCELLED           the client went away
//   INTERNAL            the backend failed on this GEMM alone (a CUDA error that is not
//                       sticky, an exception); the server keeps serving
//   UNAUTHENTICATED     the call names no principal the server accepts
//   OUT_OF_RANGE        an offset and size that reach past a shared-memory region's or a
//                       matrix's end
//   FAILED_PRECONDITION the state forbids it now: shared memory is off, a region's file is
//                       not sealed against shrinking, a region in use is unregistered
//   PERMISSION_DENIED   shared memory asked for over a connection that is not a Unix socket,
//                       or a region's file the server may not open
//   DATA_LOSS           C failed its Freivalds check on two runs (server/verify): no C is
//                       returned (C's memory in a region or resident matrix holds no result)
// Messages are cut at 1024 characters, as TF Serving does. Besides code and message, each
// status carries Details (below) as absl::Status payloads, for programs to act on without
// reading the message. The transport turns these into gRPC statuses with google.rpc.Status
// details in one place (server/transport/status_util.h); nothing below it knows of gRPC.
// Thread safety: pure functions, callable from any thread.
#ifndef HGEMM_SERVER_CORE_STATUS_H_
#define HGEMM_SERVER_CORE_STATUS_H_

#include <absl/status/status.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace hgemm::status {

absl::Status InvalidArgument(const std::string& field, const std::string& problem);
absl::Status NotFound(const std::string& what);
// `limit` names the limit passed (Details::limit), so that a program can tell which one.
absl::Status OverLimit(const std::string& limit, const std::string& what);
// The queue (or the device memory it admits into) is full: nothing ran; retry after
// kQueueFullRetryDelay.
absl::Status QueueFull(const std::string& what);
// Nothing ran; retry at once, on another server.
absl::Status ShuttingDown();
absl::Status DeadlineExpired(double waited_ms);
absl::Status Cancelled();
// A streamed GEMM or upload whose chunks stopped coming (DEADLINE_EXCEEDED).
absl::Status Idle(const std::string& what);
absl::Status BackendFailure(const std::string& what);
// A device that has failed for good (a sticky CUDA error) refused or aborted the work
// (UNAVAILABLE): nothing it computed is returned. `what` names the device and the error.
absl::Status DeviceFailed(const std::string& what);
// C failed its Freivalds check on its run and on its rerun (DATA_LOSS); `what` names both.
absl::Status VerifyFailed(const std::string& what);
absl::Status Unauthenticated(const std::string& what);
absl::Status OutOfRange(const std::string& field, const std::string& problem);
absl::Status FailedPrecondition(const std::string& what);
absl::Status PermissionDenied(const std::string& what);

// `s` with "<context>: " before its message; the code and the details stay. REQUIRES: !s.ok().
absl::Status WithContext(const std::string& context, const absl::Status& s);

// What a client waits before sending a request refused by QueueFull again: its own first
// backoff (client/retry.h), as the queue moves at the pace of the GEMMs ahead.
inline constexpr std::chrono::milliseconds kQueueFullRetryDelay{50};

// The machine-readable parts of a status made here (google.rpc.Status details on the wire:
// docs/errors.md). Kept as payloads of plain strings, the core having no protobuf.
struct Details {
  // ErrorInfo.reason: which constructor made it, e.g. "QUEUE_FULL", "DEVICE_FAILED"; empty for
  // a status that names none (absl's own): the transport then sends the code's name.
  std::string reason;
  // BadRequest.FieldViolation (INVALID_ARGUMENT, OUT_OF_RANGE): the field's path in the request
  // ("header.options.kernel", "a_region.offset") and what is wrong with it; empty: none.
  std::string field;
  std::string field_problem;
  // QuotaFailure.Violation.subject (RESOURCE_EXHAUSTED): the limit passed, by the name of the
  // server flag that sets it without "--" ("max_queued_bytes", also ServerInfo.limits' field
  // where that has one), or for the limits no flag sets "max_group_problems", "ring_slots",
  // "device_memory", "host_memory"; empty only for a status not made by OverLimit.
  std::string limit;
  // RetryInfo.retry_delay (UNAVAILABLE that ran nothing): wait at least this, then retry.
  std::optional<std::chrono::milliseconds> retry_delay;
};
Details DetailsOf(const absl::Status& s);

// The message of `s` as a std::string (absl's string_view is not std's: fmt and `+` need this).
inline std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Inside a `catch (...)`: the status the exception in flight becomes (RESOURCE_EXHAUSTED for
// std::bad_alloc and std::length_error: a size the machine can't hold; INTERNAL otherwise),
// logged with `where`. Lets reactors and worker threads answer their call instead of dying.
absl::Status FromCurrentException(const char* where);
// Inside a `catch (...)` where nobody waits for an answer (a worker thread's loop): logs the
// exception in flight as FromCurrentException does, and drops it.
inline void LogCurrentException(const char* where) { (void)FromCurrentException(where); }

// A client-supplied string (handle, kernel name, client id) for a message: in quotes, at most
// its first 64 bytes, bytes outside printable ASCII escaped (\xHH), and its length if it was
// cut. Keeps a 100 000-byte handle from turning NOT_FOUND into an oversized trailer.
std::string Quote(std::string_view client_string);

// The canonical name of a status code ("OK", "INVALID_ARGUMENT", ...), as in logs and in the
// `code` label of hgemm_requests_total; "UNKNOWN" for a value outside the enum. The codes are
// gRPC's, number for number.
std::string CodeName(absl::StatusCode code);

}  // namespace hgemm::status

#endif  // HGEMM_SERVER_CORE_STATUS_H_
