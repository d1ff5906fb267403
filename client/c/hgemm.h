/* hgemm.h: the stable C ABI of the hgemm-serve client (libhgemm_client.so), over the C++ client
 * library (client/gemm_client.h). What Python (hgemm, through ctypes) and any other language
 * binds.
 *
 * Conventions (those of leveldb's include/leveldb/c.h):
 *  - Objects are opaque struct pointers, each made by a *_create function and freed by its
 *    *_destroy. Options are set one setter at a time, so they can grow without breaking callers.
 *  - Buffers are a pointer plus a length in bytes; strings are NUL-terminated UTF-8.
 *  - Every pointer argument is non-NULL unless its comment says it may be NULL.
 *  - Errors: a function that can fail takes `int* code, char** errptr` last. On success *code is
 *    0 (HGEMM_OK) and *errptr is left alone; on failure *code is the gRPC status code (the
 *    HGEMM_* values below; hgemm_status_name() names it) and *errptr a malloc()ed message, any
 *    message already there being freed first. Callers start with *errptr = NULL and free the
 *    message with hgemm_free().
 *  - unsigned char stands for a bool.
 *  - Strings and buffers the library returns are malloc()ed and owned by the caller
 *    (hgemm_free()); buffers the caller passes in stay the caller's and are not kept past the
 *    call.
 *
 * Thread safety: an hgemm_client_t may be used from many threads at once (each call is
 * independent, and blocks only its own thread); an options object may be read by many calls at
 * once but must not be changed meanwhile. Every blocking call but the ring's also has a form
 * that does not block (hgemm_gemm_async and the *_start functions of revision 7), whose
 * callback runs on a thread of the library.
 *
 * Symbols: the library exports only the hgemm_* functions (built with -fvisibility=hidden and a
 * linker version script), so it can be loaded next to another copy of gRPC or protobuf (e.g.
 * grpcio's, in a Python process) without either one's symbols binding to the other's.
 *
 * ABI version: HGEMM_ABI_VERSION, raised on any incompatible change (a function removed, a
 * signature, struct layout or meaning changed); hgemm_abi_version() is the library's, to be checked
 * by a binding at load time. Additions (functions, enum values) keep the version and raise
 * HGEMM_ABI_REVISION instead; each is marked "[revision N]" below. A binding that needs revision N
 * checks hgemm_abi_revision() >= N (a library without hgemm_abi_revision is revision 1).
 *
 * Python's ctypes declarations are generated from this file (client/python/gen_native_decls.py,
 * which reads the declaration forms used here and stops at any other): regenerate after a change.
 */
#ifndef HGEMM_CLIENT_C_HGEMM_H_
#define HGEMM_CLIENT_C_HGEMM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define HGEMM_EXPORT __attribute__((visibility("default")))
#else
#define HGEMM_EXPORT
#endif

#define HGEMM_ABI_VERSION 1
#define HGEMM_ABI_REVISION 11

/* gRPC status codes (grpc::StatusCode), as *code reports them. */
enum {
  HGEMM_OK = 0,
  HGEMM_CANCELLED = 1,
  HGEMM_UNKNOWN = 2,
  HGEMM_INVALID_ARGUMENT = 3,
  HGEMM_DEADLINE_EXCEEDED = 4,
  HGEMM_NOT_FOUND = 5,
  HGEMM_ALREADY_EXISTS = 6,
  HGEMM_PERMISSION_DENIED = 7,
  HGEMM_RESOURCE_EXHAUSTED = 8,
  HGEMM_FAILED_PRECONDITION = 9,
  HGEMM_ABORTED = 10,
  HGEMM_OUT_OF_RANGE = 11,
  HGEMM_UNIMPLEMENTED = 12,
  HGEMM_INTERNAL = 13,
  HGEMM_UNAVAILABLE = 14,
  HGEMM_DATA_LOSS = 15,
  HGEMM_UNAUTHENTICATED = 16
};

/* GemmOptions.accumulation (proto/hgemm.proto). */
enum {
  HGEMM_ACCUMULATION_DEFAULT = 0, /* the server's default (fp32) */
  HGEMM_ACCUMULATION_FP16 = 1,
  HGEMM_ACCUMULATION_FP32 = 2
};

/* Element types (proto DataType) [revision 2]. */
enum {
  HGEMM_DTYPE_DEFAULT = 0, /* A and B: fp16; C: the type of A and B */
  HGEMM_DTYPE_FP16 = 1,    /* IEEE binary16 */
  HGEMM_DTYPE_BF16 = 2,    /* bfloat16 */
  HGEMM_DTYPE_FP32 = 3     /* IEEE binary32; C only */
};

/* How a GEMM travels. */
enum {
  /* hgemm_gemm(): parallel parts (A, B, C over 4 connections) for a plain GEMM of at least
   * 16 MiB of A + B + C, else unary up to the client's unary_limit_bytes, else a GemmStream;
   * the other calls: no parts. */
  HGEMM_MODE_AUTO = 0,
  HGEMM_MODE_UNARY = 1, /* one Gemm call */
  HGEMM_MODE_STREAM = 2 /* a one-GEMM GemmStream, operands in chunks */
};

typedef struct hgemm_client_options_t hgemm_client_options_t;
typedef struct hgemm_client_t hgemm_client_t;
typedef struct hgemm_gemm_options_t hgemm_gemm_options_t;
typedef struct hgemm_call_options_t hgemm_call_options_t;
typedef struct hgemm_server_info_t hgemm_server_info_t;
typedef struct hgemm_batch_t hgemm_batch_t;             /* [revision 2] */
typedef struct hgemm_call_t hgemm_call_t;               /* [revision 2] */
typedef struct hgemm_matrix_list_t hgemm_matrix_list_t; /* [revision 3] */
typedef struct hgemm_stream_t hgemm_stream_t;           /* [revision 3] */
typedef struct hgemm_region_t hgemm_region_t;           /* [revision 5] */
typedef struct hgemm_region_list_t hgemm_region_list_t; /* [revision 5] */
typedef struct hgemm_ring_t hgemm_ring_t;               /* [revision 6] */
typedef struct hgemm_result_t hgemm_result_t;           /* [revision 7] */

/* What the server reports of one GEMM: proto Timing and Execution. Strings longer than their
 * array are cut off (always NUL-terminated). */
typedef struct hgemm_gemm_info_t {
  double queue_wait_ms;
  double host_to_device_ms;
  double kernel_ms;
  double device_to_host_ms;
  double server_total_ms;
  double tflops;
  char kernel[128]; /* the variant that ran (never "auto") */
  int accumulation; /* HGEMM_ACCUMULATION_* */
  char backend[16]; /* "cuda" or "cpu" */
  int device_id;    /* -1 on the CPU backend */
  char device_name[128];
  int stream_id;
  char request_id[128];
  unsigned char streamed; /* 1 if it went on a GemmStream, 0 if unary or parallel parts */
} hgemm_gemm_info_t;

/* A resident matrix as the server describes it (proto MatrixInfo, but for its handle). */
typedef struct hgemm_matrix_info_t {
  uint32_t rows;
  uint32_t cols;
  uint64_t bytes;
  int device_id; /* -1 on the CPU backend */
  double ttl_seconds;
} hgemm_matrix_info_t;

/* The library. */

/* The ABI version of the loaded library (HGEMM_ABI_VERSION of the header it was built with). */
HGEMM_EXPORT int hgemm_abi_version(void);
/* The ABI revision of the loaded library (HGEMM_ABI_REVISION of its header) [revision 2]. */
HGEMM_EXPORT int hgemm_abi_revision(void);
/* The name of a status code ("NOT_FOUND"); "UNKNOWN" for a code outside 0..16. Static storage. */
HGEMM_EXPORT const char* hgemm_status_name(int code);
/* Frees what the library returned (messages, handles). ptr may be NULL. */
HGEMM_EXPORT void hgemm_free(void* ptr);

/* [revision 10] Error details (docs/errors.md, "Details"): what the server said of the last
 * failure the library reported on the calling thread, beyond its code and message, so that a
 * program acts on the field, the limit or the retry delay without reading the message. A
 * failure is reported by a call's *code, by hgemm_batch_result() and hgemm_stream_next() for
 * one GEMM, and to a done callback (hgemm_gemm_async(), hgemm_gemm_keep_c_async(), and the
 * *_start calls, whose done runs on the thread that ran the call): read them right there. Each
 * failure replaces them (with none for a failure without details: the library's own checks,
 * gRPC's errors, a server from before them); a success leaves them. Strings and bytes stay
 * valid until the next failure reported on the thread. */
/* ErrorInfo.reason, e.g. "QUEUE_FULL", "INVALID_FIELD" ("": none). */
HGEMM_EXPORT const char* hgemm_error_reason(void);
/* BadRequest: the fields that are wrong. Violation i's field path ("header.options.kernel"),
 * and in *description (may be NULL) what is wrong with it. REQUIRES: i < the count. */
HGEMM_EXPORT size_t hgemm_error_field_violation_count(void);
HGEMM_EXPORT const char* hgemm_error_field_violation(size_t i, const char** description);
/* QuotaFailure: the limits passed. Violation i's subject (the limit: a server flag's name such
 * as "max_queued_bytes"), and in *description (may be NULL) its text. REQUIRES: i < count. */
HGEMM_EXPORT size_t hgemm_error_quota_violation_count(void);
HGEMM_EXPORT const char* hgemm_error_quota_violation(size_t i, const char** description);
/* RetryInfo: the request ran nothing; wait at least this many milliseconds, then send it again.
 * -1: no RetryInfo. */
HGEMM_EXPORT int64_t hgemm_error_retry_delay_ms(void);
/* The whole google.rpc.Status, serialized (proto/google/rpc/status.proto), for a binding that
 * reads it with protobuf; *bytes its length (0 and a non-NULL pointer when there is none). */
HGEMM_EXPORT const void* hgemm_error_status(size_t* bytes);

/* [revision 11] The server's Freivalds check of a GEMM (GemmOptions.verify;
 * docs/verification.md): of the GEMM whose hgemm_gemm_info_t was filled last on the calling
 * thread (by hgemm_gemm*(), hgemm_result_gemm_info() in a done callback, hgemm_batch_result()),
 * read right there: *verify_ms what the check added to the GEMM's time, *repetitions the
 * random vectors its C passed (0: not checked), *suspect_device_id the device whose first run
 * failed the check when the answer is a rerun's (-1: none). Each may be NULL. A C that failed
 * the check twice is never reported: the GEMM fails with HGEMM_DATA_LOSS. */
HGEMM_EXPORT void hgemm_gemm_verify(double* verify_ms, uint32_t* repetitions,
                                    int* suspect_device_id);

/* Client options: how hgemm_client_create() connects, and defaults of its calls. */

/* Defaults: plaintext, no token, no timeout, 1 MiB chunks, unary up to 3 MiB of A + B or C. */
HGEMM_EXPORT hgemm_client_options_t* hgemm_client_options_create(void);
HGEMM_EXPORT void hgemm_client_options_destroy(hgemm_client_options_t* options);
/* TLS with the system's root certificates; implied by any of the paths below. */
HGEMM_EXPORT void hgemm_client_options_set_tls(hgemm_client_options_t* options, unsigned char on);
/* PEM file of the CA that signed the server's certificate ("": the system's roots). */
HGEMM_EXPORT void hgemm_client_options_set_tls_ca(hgemm_client_options_t* options,
                                                  const char* path);
/* PEM files of the client's certificate and key, for mutual TLS (both or neither). */
HGEMM_EXPORT void hgemm_client_options_set_tls_cert(hgemm_client_options_t* options,
                                                    const char* path);
HGEMM_EXPORT void hgemm_client_options_set_tls_key(hgemm_client_options_t* options,
                                                   const char* path);
/* The name the server's certificate must carry, if not the target's host. */
HGEMM_EXPORT void hgemm_client_options_set_tls_server_name(hgemm_client_options_t* options,
                                                           const char* name);
/* Sent as "authorization: Bearer TOKEN" on every call ("": none). */
HGEMM_EXPORT void hgemm_client_options_set_token(hgemm_client_options_t* options,
                                                 const char* token);
/* Sent as "x-client-id" on every call: the owner of resident matrices ("": the peer address). */
HGEMM_EXPORT void hgemm_client_options_set_client_id(hgemm_client_options_t* options,
                                                     const char* client_id);
/* Sent as "traceparent" on every call (W3C trace context; "": none). */
HGEMM_EXPORT void hgemm_client_options_set_traceparent(hgemm_client_options_t* options,
                                                       const char* traceparent);
/* The deadline of every call that sets none of its own, in milliseconds (0: none). */
HGEMM_EXPORT void hgemm_client_options_set_timeout_ms(hgemm_client_options_t* options,
                                                      int64_t timeout_ms);
/* The size of the chunks streamed operands and uploads are sent in (default 1 MiB). REQUIRES:
 * chunk_bytes >= 1. */
HGEMM_EXPORT void hgemm_client_options_set_chunk_bytes(hgemm_client_options_t* options,
                                                       int64_t chunk_bytes);
/* HGEMM_MODE_AUTO: a GEMM whose A + B bytes or C bytes pass this goes on a GemmStream. */
HGEMM_EXPORT void hgemm_client_options_set_unary_limit_bytes(hgemm_client_options_t* options,
                                                             int64_t unary_limit_bytes);

/* [revision 2] How the blocking calls (hgemm_gemm, hgemm_upload, hgemm_release,
 * hgemm_server_info) retry UNAVAILABLE: `attempts` tries in all (1: no retries), with
 * exponential backoff from initial_backoff_ms, times backoff_multiplier per retry, at most
 * max_backoff_ms, each times a jitter in [0.5, 1). Retried: an UNAVAILABLE that certainly did
 * not run the request (the server's queue full or shutting down, no connection made), and any
 * UNAVAILABLE of the idempotent calls (hgemm_gemm, hgemm_server_info). Never past the call's
 * deadline, which covers all its tries. Default: 5, 50, 2000, 2.0. hgemm_client_create() fails
 * with INVALID_ARGUMENT unless attempts >= 1, 0 <= initial <= max and multiplier >= 1.
 * hgemm_gemm_async() and hgemm_gemm_many() do not retry (their callers do). */
HGEMM_EXPORT void hgemm_client_options_set_retry_policy(hgemm_client_options_t* options,
                                                        int attempts, int64_t initial_backoff_ms,
                                                        int64_t max_backoff_ms,
                                                        double backoff_multiplier);

/* The client. */

/* A client of the server (or replicas) at `target` ("127.0.0.1:50051", "dns:///svc:50051",
 * "ipv4:H:P1,H:P2"), connecting as `options` say (NULL: the defaults); the options are copied.
 * The connection is made at the first call, so an unreachable server fails that call
 * (UNAVAILABLE), not this one. Fails with INVALID_ARGUMENT when a TLS file cannot be read or
 * only one of cert and key is set; returns NULL then. Free with hgemm_client_destroy(). */
HGEMM_EXPORT hgemm_client_t* hgemm_client_create(const char* target,
                                                 const hgemm_client_options_t* options, int* code,
                                                 char** errptr);
/* Waits until every hgemm_gemm_async() of the client is over (its done has returned), then
 * frees the client and closes its channels. [revision 7] Calls of the *_start functions not
 * started yet get done(HGEMM_CANCELLED); running ones are waited for (a stream next's stream is
 * cancelled), and the client's completion threads joined. REQUIRES: no blocking call of it is
 * running, and none of its done callbacks calls this. */
HGEMM_EXPORT void hgemm_client_destroy(hgemm_client_t* client);
/* The bytes (A, B and C) from which the client's HGEMM_MODE_AUTO GEMMs go as parallel parts
 * (CallOptions::parallel_min_bytes), for a binding that picks unary or stream itself below it
 * [revision 4]. */
HGEMM_EXPORT int64_t hgemm_client_parallel_min_bytes(const hgemm_client_t* client);

/* GEMM options (hgemm_gemm()). */

/* Defaults: kernel "auto", the server's accumulation, no request id, HGEMM_MODE_AUTO, A and B
 * sent (no handles), the client's timeout. */
HGEMM_EXPORT hgemm_gemm_options_t* hgemm_gemm_options_create(void);
HGEMM_EXPORT void hgemm_gemm_options_destroy(hgemm_gemm_options_t* options);
/* "auto" or a name from ListKernels. */
HGEMM_EXPORT void hgemm_gemm_options_set_kernel(hgemm_gemm_options_t* options, const char* kernel);
/* HGEMM_ACCUMULATION_*. */
HGEMM_EXPORT void hgemm_gemm_options_set_accumulation(hgemm_gemm_options_t* options,
                                                      int accumulation);
/* Echoed in the response and the server's log lines ("": the server makes one). */
HGEMM_EXPORT void hgemm_gemm_options_set_request_id(hgemm_gemm_options_t* options,
                                                    const char* request_id);
/* HGEMM_MODE_*. */
HGEMM_EXPORT void hgemm_gemm_options_set_mode(hgemm_gemm_options_t* options, int mode);
/* A (or B) is the resident matrix `handle` instead of bytes ("": bytes, the default). The GEMM
 * goes to the replica that holds it. */
HGEMM_EXPORT void hgemm_gemm_options_set_a_handle(hgemm_gemm_options_t* options,
                                                  const char* handle);
HGEMM_EXPORT void hgemm_gemm_options_set_b_handle(hgemm_gemm_options_t* options,
                                                  const char* handle);
/* This GEMM's deadline in milliseconds (0: none; default: the client's). */
HGEMM_EXPORT void hgemm_gemm_options_set_timeout_ms(hgemm_gemm_options_t* options,
                                                    int64_t timeout_ms);
/* [revision 2] Layout and types (proto GemmRequest's transpose_a, transpose_b, dtype, c_dtype);
 * the defaults are 0: C = A·B of fp16 row-major A (m×k) and B (k×n), fp16 C.
 * transpose_a: A is stored k×m (Aᵀ row-major, a transposed view passed as stored, no copy);
 * transpose_b: B is stored n×k (an nn.Linear weight). dtype (A and B): HGEMM_DTYPE_DEFAULT, FP16
 * or BF16; c_dtype: HGEMM_DTYPE_DEFAULT (dtype's), dtype itself, or FP32 (4 bytes an element of
 * C). Other combinations are the server's INVALID_ARGUMENT; a value outside HGEMM_DTYPE_* is
 * refused by the call before anything is sent. */
HGEMM_EXPORT void hgemm_gemm_options_set_transpose_a(hgemm_gemm_options_t* options,
                                                     unsigned char on);
HGEMM_EXPORT void hgemm_gemm_options_set_transpose_b(hgemm_gemm_options_t* options,
                                                     unsigned char on);
HGEMM_EXPORT void hgemm_gemm_options_set_dtype(hgemm_gemm_options_t* options, int dtype);
HGEMM_EXPORT void hgemm_gemm_options_set_c_dtype(hgemm_gemm_options_t* options, int c_dtype);
/* [revision 11] The server checks C by Freivalds' method before answering (GemmOptions.verify,
 * verify_repetitions: 0 the server's default); see hgemm_gemm_verify(). Default: off. */
HGEMM_EXPORT void hgemm_gemm_options_set_verify(hgemm_gemm_options_t* options, unsigned char on,
                                                uint32_t repetitions);

/* [revision 3] Scales, a C input and batches (proto GemmRequest's alpha, beta, c_in,
 * c_in_handle, batch): C = alpha·op(A)·op(B) + beta·C_in in fp32, rounded once (BLAS
 * semantics; the server refuses them, INVALID_ARGUMENT, for kernels and types without
 * KernelInfo.scaled_types). Defaults: no alpha (1), beta 0, no C input, batch 0 (one GEMM).
 * alpha and beta must be finite (the server's INVALID_ARGUMENT). */
HGEMM_EXPORT void hgemm_gemm_options_set_alpha(hgemm_gemm_options_t* options, float alpha);
HGEMM_EXPORT void hgemm_gemm_options_set_beta(hgemm_gemm_options_t* options, float beta);
/* C_in as bytes: batch·m·n elements of C's type (c_dtype), c_in_bytes of them, read by each
 * call made with these options (the options keep the pointer, not a copy: the memory must stay
 * alive and unchanged while such a call runs; hgemm_batch_add copies it). NULL and 0: none.
 * A call refuses, INVALID_ARGUMENT before sending, a c_in_bytes that is not C's size, and a
 * C_in given both as bytes and by handle. It is sent only with beta ≠ 0. */
HGEMM_EXPORT void hgemm_gemm_options_set_c_in(hgemm_gemm_options_t* options, const void* c_in,
                                              size_t c_in_bytes);
/* C_in is the resident matrix `handle` (m×n of C's type, e.g. a C kept by hgemm_gemm_keep_c);
 * "": none. */
HGEMM_EXPORT void hgemm_gemm_options_set_c_in_handle(hgemm_gemm_options_t* options,
                                                     const char* handle);
/* Strided-batched: `batch` GEMMs of one shape packed one after the other in a, b, C_in and c
 * (each buffer `batch` times one matrix's bytes; 0 or 1: one GEMM). Operands by handle take
 * batch <= 1 (the server's INVALID_ARGUMENT). */
HGEMM_EXPORT void hgemm_gemm_options_set_batch(hgemm_gemm_options_t* options, uint32_t batch);

/* [revision 5] One problem of a grouped GEMM (hgemm_gemm_grouped): its sizes, A (2·m·k bytes),
 * B (2·k·n), C_in (m·n of C's type; read only when beta != 0, else NULL and 0) and the buffer
 * its C is written into (c_capacity bytes, at least m·n of C's type). Every buffer stays the
 * caller's. */
typedef struct hgemm_group_problem_t {
  uint32_t m, n, k;
  const void* a;
  size_t a_bytes;
  const void* b;
  size_t b_bytes;
  const void* c_in;
  size_t c_in_bytes;
  void* c;
  size_t c_capacity;
} hgemm_group_problem_t;

/* [revision 5] Operands and C in shared memory (same host: a "unix:" target, the server
 * started with --allow_shared_memory; see hgemm_region_create()): {region, offset} of the
 * bytes A, B, C_in or C would hold, `region` the server's handle (hgemm_region_handle(), or
 * any region of this client); "" clears. An operand named so is not passed (a or b NULL and 0
 * bytes, C_in not set by hgemm_gemm_options_set_c_in); a C named so is written there by the
 * server (pass c NULL and c_capacity 0). Only hgemm_gemm() takes them, and sends such a GEMM
 * as one Gemm call whatever its mode; the other GEMM calls refuse them (INVALID_ARGUMENT). The
 * server checks the rest: NOT_FOUND for a region that is not this client's, OUT_OF_RANGE for
 * bytes past its end, INVALID_ARGUMENT for an odd offset. */
HGEMM_EXPORT void hgemm_gemm_options_set_a_region(hgemm_gemm_options_t* options, const char* region,
                                                  uint64_t offset);
HGEMM_EXPORT void hgemm_gemm_options_set_b_region(hgemm_gemm_options_t* options, const char* region,
                                                  uint64_t offset);
HGEMM_EXPORT void hgemm_gemm_options_set_c_in_region(hgemm_gemm_options_t* options,
                                                     const char* region, uint64_t offset);
HGEMM_EXPORT void hgemm_gemm_options_set_c_region(hgemm_gemm_options_t* options, const char* region,
                                                  uint64_t offset);

/* Options of the other calls (upload, release, server info). */

/* Defaults: the client's timeout, balanced over the target. */
HGEMM_EXPORT hgemm_call_options_t* hgemm_call_options_create(void);
HGEMM_EXPORT void hgemm_call_options_destroy(hgemm_call_options_t* options);
/* The call's deadline in milliseconds (0: none; default: the client's). */
HGEMM_EXPORT void hgemm_call_options_set_timeout_ms(hgemm_call_options_t* options,
                                                    int64_t timeout_ms);
/* The replica (an address, as a handle names it) the call goes to ("": balanced). */
HGEMM_EXPORT void hgemm_call_options_set_replica(hgemm_call_options_t* options,
                                                 const char* replica);

/* Calls. Each blocks the calling thread until the call is over. */

/* C = op(A)·op(B): op(A) is m×k, op(B) k×n, C m×n, row-major, dense, little-endian; fp16 unless
 * the options set transposes and types (and scales, a C input or a batch [revision 3]: then
 * every size below is times the batch). Unary or streamed as the options' mode says. a (a_bytes
 * = 2·m·k) and b (b_bytes = 2·k·n) are read during the call only; an operand named by handle
 * (options) passes NULL and 0. C is written into c, of c_capacity bytes, which must hold m·n
 * elements of C's type (2·m·n bytes, 4·m·n for fp32); info (may be NULL) gets the timing and
 * execution. options may be NULL (the defaults).
 * Errors: INVALID_ARGUMENT, before anything is sent, when a_bytes or b_bytes is not what m, n,
 * k say, c_capacity is short of C's bytes (nothing is written to c) or a dtype is not one of
 * HGEMM_DTYPE_*; otherwise the server's
 * status (INVALID_ARGUMENT for a dimension of 0, NOT_FOUND for an unknown handle, ...) or
 * gRPC's (UNAVAILABLE when the server cannot be reached, DEADLINE_EXCEEDED). On failure c may
 * have been partly written (within c_capacity). */
HGEMM_EXPORT void hgemm_gemm(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                             uint32_t m, uint32_t n, uint32_t k, const void* a, size_t a_bytes,
                             const void* b, size_t b_bytes, void* c, size_t c_capacity,
                             hgemm_gemm_info_t* info, int* code, char** errptr);

/* [revision 2] Many GEMMs pipelined on one GemmStream per replica (the server works on early
 * GEMMs while later ones upload), C written into each GEMM's caller buffer as it arrives.
 * A batch is a list of GEMMs, each added with hgemm_gemm()'s arguments, then run by
 * hgemm_gemm_many() (which may run it again: e.g. the GEMMs a broken stream left unanswered),
 * then read GEMM by GEMM. Thread safety: a batch belongs to one thread at a time.
 * Ownership: a, b and c stay the caller's; a and b must stay alive until the batch is
 * destroyed, c (not read meanwhile) until the last hgemm_gemm_many() of the batch returns. */
HGEMM_EXPORT hgemm_batch_t* hgemm_batch_create(void);
HGEMM_EXPORT void hgemm_batch_destroy(hgemm_batch_t* batch);
/* Adds a GEMM, as hgemm_gemm() takes it, but for the options' mode and timeout (a batch always
 * streams; its deadline is hgemm_gemm_many()'s); the options are copied. Returns its index
 * (0, 1, ...). Fails, adding nothing and returning SIZE_MAX, with hgemm_gemm()'s
 * INVALID_ARGUMENT of the checks made before sending (sizes, types). */
HGEMM_EXPORT size_t hgemm_batch_add(hgemm_batch_t* batch, const hgemm_gemm_options_t* options,
                                    uint32_t m, uint32_t n, uint32_t k, const void* a,
                                    size_t a_bytes, const void* b, size_t b_bytes, void* c,
                                    size_t c_capacity, int* code, char** errptr);
/* [revision 3] Adds a GEMM whose C stays on the server (hgemm_gemm_keep_c's: no C buffer;
 * its handle from hgemm_batch_c_handle once answered). As hgemm_batch_add otherwise. */
HGEMM_EXPORT size_t hgemm_batch_add_keep_c(hgemm_batch_t* batch,
                                           const hgemm_gemm_options_t* options, uint32_t m,
                                           uint32_t n, uint32_t k, const void* a, size_t a_bytes,
                                           const void* b, size_t b_bytes, uint32_t c_ttl_seconds,
                                           int* code, char** errptr);
/* [revision 3] The handle of GEMM i's kept C (malloc()ed; hgemm_free()) once it succeeded,
 * c_info (may be NULL) the matrix; NULL for a GEMM that kept no C or has not succeeded.
 * REQUIRES: i < hgemm_batch_size(batch). */
HGEMM_EXPORT char* hgemm_batch_c_handle(const hgemm_batch_t* batch, size_t i,
                                        hgemm_matrix_info_t* c_info);
HGEMM_EXPORT size_t hgemm_batch_size(const hgemm_batch_t* batch);
/* Sends the batch's GEMMs given by `indices` (count of them; indices NULL: every GEMM) and
 * waits for their answers. A GEMM can fail alone (its hgemm_batch_result) while the streams
 * succeed. *code and *errptr: the streams' status (the first that failed: UNAVAILABLE when the
 * server cannot be reached, DEADLINE_EXCEEDED, a stream-ending error naming "gemm_id I: " for
 * the GEMM whose header was refused). options (may be NULL): the deadline of the whole call
 * and the replica of GEMMs naming no handle.
 * REQUIRES: each index < hgemm_batch_size(batch). */
HGEMM_EXPORT void hgemm_gemm_many(hgemm_client_t* client, hgemm_batch_t* batch,
                                  const hgemm_call_options_t* options, const size_t* indices,
                                  size_t count, int* code, char** errptr);
/* GEMM i's outcome after hgemm_gemm_many(): returns 1 if it was answered, 0 if not (never
 * sent: UNKNOWN; or its stream broke first: *code is then the stream's status, or UNKNOWN if
 * the stream ended cleanly). *code and *errptr are its status; info (may
 * be NULL) gets its timing and execution when it succeeded.
 * REQUIRES: i < hgemm_batch_size(batch). */
HGEMM_EXPORT unsigned char hgemm_batch_result(const hgemm_batch_t* batch, size_t i,
                                              hgemm_gemm_info_t* info, int* code, char** errptr);

/* [revision 5] A grouped GEMM (proto GemmRequest.group) in one unary Gemm call: `count`
 * problems of their own sizes (problems[i]) and one form for all, the options' (transposes,
 * dtype, c_dtype, alpha, beta, kernel, accumulation, request_id, timeout; options may be NULL).
 * On HGEMM_OK problem i's C is in problems[i].c; info (may be NULL): the call's timing and
 * execution. Errors before sending (nothing written): INVALID_ARGUMENT for count 0, options
 * naming handles, regions, a C_in, a batch or a mode other than HGEMM_MODE_AUTO and
 * HGEMM_MODE_UNARY, and a problem's operand or C buffer of the wrong size (naming
 * "problems[i]."); else the server's status (INVALID_ARGUMENT from a server without groups, or
 * past its max_group_problems). Retried as hgemm_gemm() (idempotent). */
HGEMM_EXPORT void hgemm_gemm_grouped(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                                     const hgemm_group_problem_t* problems, size_t count,
                                     hgemm_gemm_info_t* info, int* code, char** errptr);

/* [revision 2] GEMMs that do not block: hgemm_gemm_async() starts one and returns; `done` is
 * called once it is over, on a thread of the library (no thread is made per call).
 *
 * done(user_data, code, message, info): code is HGEMM_OK or the GEMM's failure (as
 * hgemm_gemm() would return it), message its text ("" on success), info its timing and
 * execution (NULL on failure); message and info are valid during the call only. C is in c
 * when done is called with HGEMM_OK. done must not block (it holds up the library's thread) and
 * must not destroy the client. */
typedef void (*hgemm_gemm_done_fn)(void* user_data, int code, const char* message,
                                   const hgemm_gemm_info_t* info);
/* Starts hgemm_gemm() (same arguments and checks; mode HGEMM_MODE_AUTO is decided here) and
 * returns its call handle, freed with hgemm_call_destroy(). done then runs exactly once: on a
 * library thread, or on this one before hgemm_gemm_async() returns when the GEMM is refused at
 * once (handles on two replicas). Returns NULL, and done never runs, when a check made before
 * sending fails (hgemm_gemm()'s INVALID_ARGUMENT). Ownership: a, b and c stay the caller's and
 * must stay alive, c unread, until done has run. */
HGEMM_EXPORT hgemm_call_t* hgemm_gemm_async(hgemm_client_t* client,
                                            const hgemm_gemm_options_t* options, uint32_t m,
                                            uint32_t n, uint32_t k, const void* a, size_t a_bytes,
                                            const void* b, size_t b_bytes, void* c,
                                            size_t c_capacity, hgemm_gemm_done_fn done,
                                            void* user_data, int* code, char** errptr);
/* [revision 5] hgemm_gemm_async() of hgemm_gemm_keep_c(): C stays on the server for
 * c_ttl_seconds. done(user_data, code, message, info, c_handle, c_info) runs exactly once, as
 * hgemm_gemm_async()'s; on HGEMM_OK c_handle is the kept C's handle and c_info the m×n C as the
 * server describes it (valid during the call only: copy what is kept), else both are NULL.
 * Mode as hgemm_gemm_keep_c()'s (HGEMM_MODE_AUTO: a GemmStream above the unary limit). Not
 * retried. Ownership: a and b stay the caller's and must stay alive until done has run. */
typedef void (*hgemm_keep_c_done_fn)(void* user_data, int code, const char* message,
                                     const hgemm_gemm_info_t* info, const char* c_handle,
                                     const hgemm_matrix_info_t* c_info);
HGEMM_EXPORT hgemm_call_t* hgemm_gemm_keep_c_async(
    hgemm_client_t* client, const hgemm_gemm_options_t* options, uint32_t m, uint32_t n, uint32_t k,
    const void* a, size_t a_bytes, const void* b, size_t b_bytes, uint32_t c_ttl_seconds,
    hgemm_keep_c_done_fn done, void* user_data, int* code, char** errptr);
/* Cancels the call: if it is not over yet, done runs soon with HGEMM_CANCELLED (C may have been
 * partly written). Any thread, any time before hgemm_call_destroy(); a no-op once it is over.
 * [revision 7] For a *_start call: see "Exactly once" below (a call not started yet is
 * CANCELLED; a running one goes on to its end). */
HGEMM_EXPORT void hgemm_call_cancel(hgemm_call_t* call);
/* Frees the handle (the GEMM goes on; done still runs). call may be NULL. */
HGEMM_EXPORT void hgemm_call_destroy(hgemm_call_t* call);

/* [revision 3] Persistent streams: one GemmStream kept open for many GEMMs submitted over time
 * (from several threads), pipelined: a GEMM is written as soon as the ones submitted before it
 * are, while the server works on earlier ones; each answer is read with hgemm_stream_next(), C
 * written into the GEMM's buffer as it arrives. The stream has a writer thread of its own, so
 * submitting never waits for the network.
 * Thread safety: hgemm_stream_submit() from many threads at once; hgemm_stream_next() from one
 * thread at a time (any); hgemm_stream_close() and hgemm_stream_cancel() from any thread, any
 * time before hgemm_stream_destroy(). A stream shares its client's channels and may outlive
 * the client (hgemm_client_destroy() neither waits for nor ends it). */

/* Opens a stream to the options' replica ("": the target; options may be NULL), whose timeout
 * is the deadline of the whole stream (0 or unset: none, the client's timeout is not applied).
 * The connection is made by the first GEMM: an unreachable server shows as the stream's end
 * (UNAVAILABLE, from hgemm_stream_next). Returns NULL on failure (out of memory only). Free
 * with hgemm_stream_destroy(). */
HGEMM_EXPORT hgemm_stream_t* hgemm_stream_open(hgemm_client_t* client,
                                               const hgemm_call_options_t* options, int* code,
                                               char** errptr);
/* Submits a GEMM, hgemm_gemm()'s arguments (the options' mode and timeout are ignored), tagged
 * gemm_id (the caller's: unique among the stream's GEMMs not yet answered; named by answers
 * and by a stream-ending error, "gemm_id I: "). a and b are copied before this returns; c (not
 * read meanwhile) must stay alive until the GEMM's answer is read or the stream is over.
 * keep_c: C stays on the server (hgemm_gemm_keep_c's, its handle given by hgemm_stream_next();
 * pass c NULL and 0) for c_ttl_seconds. Errors, nothing sent: hgemm_gemm()'s INVALID_ARGUMENT
 * of the checks made before sending, INVALID_ARGUMENT for a gemm_id in use, and
 * FAILED_PRECONDITION once the stream is closed or over. */
HGEMM_EXPORT void hgemm_stream_submit(hgemm_stream_t* stream, uint64_t gemm_id,
                                      const hgemm_gemm_options_t* options, uint32_t m, uint32_t n,
                                      uint32_t k, const void* a, size_t a_bytes, const void* b,
                                      size_t b_bytes, void* c, size_t c_capacity,
                                      unsigned char keep_c, uint32_t c_ttl_seconds, int* code,
                                      char** errptr);
/* [revision 9] hgemm_stream_submit() without copying A and B: the stream's writer sends them
 * from a and b, which must stay alive and unchanged until hgemm_stream_next() has returned this
 * GEMM's answer, or has returned 0, or the stream is destroyed. Saves a copy of the operands per
 * GEMM. Once hgemm_stream_next() returns the answer, the writer reads a and b no more: the server
 * may refuse a GEMM before all of it was sent, and the rest of it is then not sent. */
HGEMM_EXPORT void hgemm_stream_submit_borrowed(hgemm_stream_t* stream, uint64_t gemm_id,
                                               const hgemm_gemm_options_t* options, uint32_t m,
                                               uint32_t n, uint32_t k, const void* a,
                                               size_t a_bytes, const void* b, size_t b_bytes,
                                               void* c, size_t c_capacity, unsigned char keep_c,
                                               uint32_t c_ttl_seconds, int* code, char** errptr);
/* Waits for the next answer (the server's order: usually submission order). Returns 1 with
 * *gemm_id the GEMM answered and *code / *errptr its status (the GEMM failed alone: the stream
 * goes on); on HGEMM_OK, C is in its buffer, info (may be NULL) gets its timing and execution,
 * and for a kept C *c_handle (may be NULL) its handle (malloc()ed, hgemm_free(); else NULL)
 * and c_info (may be NULL) the matrix. Returns 0 once the stream is over, again on every later
 * call: *code / *errptr are then the stream's end (HGEMM_OK after hgemm_stream_close() when
 * every GEMM was answered; CANCELLED; UNAVAILABLE; an error naming "gemm_id I: " for a GEMM
 * the server refused, ending the stream; INTERNAL when the server broke the protocol, e.g. C
 * past a buffer's capacity, nothing written past it). GEMMs not answered by then never will
 * be (their buffers are free). */
HGEMM_EXPORT int hgemm_stream_next(hgemm_stream_t* stream, uint64_t* gemm_id,
                                   hgemm_gemm_info_t* info, char** c_handle,
                                   hgemm_matrix_info_t* c_info, int* code, char** errptr);
/* Half-closes: GEMMs submitted so far are still written and answered; later submits fail. */
HGEMM_EXPORT void hgemm_stream_close(hgemm_stream_t* stream);
/* Ends the stream now: hgemm_stream_next() soon returns 0 with CANCELLED. */
HGEMM_EXPORT void hgemm_stream_cancel(hgemm_stream_t* stream);
/* Cancels the stream if it is not over, waits for its writer, and frees it. stream may be
 * NULL. REQUIRES: no other call of the stream is running. */
HGEMM_EXPORT void hgemm_stream_destroy(hgemm_stream_t* stream);

/* Uploads a rows×cols fp16 matrix (data: 2·rows·cols bytes) to keep on the server. ttl_seconds:
 * seconds after its last use at which the server frees it (0: the server's default). label:
 * free-form, shown by ListMatrices ("": none). info (may be NULL) gets what the server says of
 * it; options may be NULL. Returns its handle (malloc()ed; hgemm_free()), or NULL on failure:
 * INVALID_ARGUMENT when data_bytes is not 2·rows·cols, else the server's status
 * (RESOURCE_EXHAUSTED over the quota, ...). */
HGEMM_EXPORT char* hgemm_upload(hgemm_client_t* client, const hgemm_call_options_t* options,
                                uint32_t rows, uint32_t cols, const void* data, size_t data_bytes,
                                uint32_t ttl_seconds, const char* label, hgemm_matrix_info_t* info,
                                int* code, char** errptr);

/* [revision 3] hgemm_upload() of a matrix of `dtype` (HGEMM_DTYPE_DEFAULT or _FP16: fp16,
 * _BF16: bf16; data_bytes 2·rows·cols either way) kept on CUDA device `device_id` (< 0: the one
 * with the most free memory; the CPU backend ignores it). data is sent from where it lies (no
 * copy). Errors as hgemm_upload's, and INVALID_ARGUMENT before sending for a dtype that is not
 * one of those. */
HGEMM_EXPORT char* hgemm_upload_typed(hgemm_client_t* client, const hgemm_call_options_t* options,
                                      uint32_t rows, uint32_t cols, int dtype, int device_id,
                                      const void* data, size_t data_bytes, uint32_t ttl_seconds,
                                      const char* label, hgemm_matrix_info_t* info, int* code,
                                      char** errptr);

/* [revision 3] hgemm_gemm() whose C stays on the server as a resident matrix (proto
 * keep_c_resident) instead of coming back: e.g. the next GEMM's A or C_in. Returns C's handle
 * (malloc()ed; hgemm_free()), NULL on failure. c_ttl_seconds: as hgemm_upload's ttl_seconds.
 * info (may be NULL): the GEMM's timing and execution; c_info (may be NULL): the kept m×n C
 * as the server describes it. The options' mode is honoured (HGEMM_MODE_AUTO:
 * a GemmStream when A + B pass the unary limit, never parallel parts). Errors: hgemm_gemm()'s
 * (with no C buffer to check); retried only where UNAVAILABLE certainly did not run it (a
 * second run would keep a second C). */
HGEMM_EXPORT char* hgemm_gemm_keep_c(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                                     uint32_t m, uint32_t n, uint32_t k, const void* a,
                                     size_t a_bytes, const void* b, size_t b_bytes,
                                     uint32_t c_ttl_seconds, hgemm_gemm_info_t* info,
                                     hgemm_matrix_info_t* c_info, int* code, char** errptr);

/* [revision 3] Bytes [offset, offset + length) of the resident matrix `handle` (on the replica
 * it names; length 0: from offset to its end) written into `into` as they arrive, capacity bytes
 * at most. Returns the bytes written (0 on failure). options may be NULL. Errors:
 * INVALID_ARGUMENT before sending when length > capacity, or, the call cancelled, when the
 * matrix's bytes from offset pass capacity (known at its first chunk: nothing written then);
 * the server's OUT_OF_RANGE for a range past the matrix's end, NOT_FOUND, PERMISSION_DENIED;
 * INTERNAL when the server sends another range than asked for (a server from before ranges
 * with offset or length set). On failure `into` may have been partly written, never past
 * capacity. Retried as hgemm_gemm() (idempotent). */
HGEMM_EXPORT uint64_t hgemm_download(hgemm_client_t* client, const hgemm_call_options_t* options,
                                     const char* handle, uint64_t offset, uint64_t length,
                                     void* into, size_t capacity, int* code, char** errptr);

/* [revision 3] ListMatrices: this client's resident matrices on the replica the call reaches
 * (the options' replica, else balanced; options may be NULL). Returns NULL on failure. Free with
 * hgemm_matrix_list_destroy(). Thread safety: a list is read-only; any thread may read it. */
HGEMM_EXPORT hgemm_matrix_list_t* hgemm_list_matrices(hgemm_client_t* client,
                                                      const hgemm_call_options_t* options,
                                                      int* code, char** errptr);
HGEMM_EXPORT void hgemm_matrix_list_destroy(hgemm_matrix_list_t* list);
HGEMM_EXPORT size_t hgemm_matrix_list_size(const hgemm_matrix_list_t* list);
/* The client's resident bytes and its quota there. */
HGEMM_EXPORT uint64_t hgemm_matrix_list_client_bytes(const hgemm_matrix_list_t* list);
HGEMM_EXPORT uint64_t hgemm_matrix_list_quota_bytes(const hgemm_matrix_list_t* list);
/* Matrix i's fields (REQUIRES: i < hgemm_matrix_list_size(list)). Strings live as long as the
 * list. dtype: HGEMM_DTYPE_FP16, _BF16 or _FP32 (a C kept in fp32). */
HGEMM_EXPORT void hgemm_matrix_list_info(const hgemm_matrix_list_t* list, size_t i,
                                         hgemm_matrix_info_t* info);
HGEMM_EXPORT const char* hgemm_matrix_list_handle(const hgemm_matrix_list_t* list, size_t i);
HGEMM_EXPORT const char* hgemm_matrix_list_label(const hgemm_matrix_list_t* list, size_t i);
HGEMM_EXPORT const char* hgemm_matrix_list_replica(const hgemm_matrix_list_t* list, size_t i);
HGEMM_EXPORT int hgemm_matrix_list_dtype(const hgemm_matrix_list_t* list, size_t i);
HGEMM_EXPORT double hgemm_matrix_list_age_seconds(const hgemm_matrix_list_t* list, size_t i);
HGEMM_EXPORT double hgemm_matrix_list_idle_seconds(const hgemm_matrix_list_t* list, size_t i);

/* Frees the resident matrix `handle` (on the replica it names). Returns the bytes freed; 0 on
 * failure (NOT_FOUND if it does not exist, PERMISSION_DENIED if it is another client's).
 * options may be NULL. */
HGEMM_EXPORT uint64_t hgemm_release(hgemm_client_t* client, const hgemm_call_options_t* options,
                                    const char* handle, int* code, char** errptr);

/* [revision 5] Shared buffers: memory of this process the server maps too (client/
 * shared_region.h: a sealed memfd), registered as a region of this client. GEMMs name
 * {hgemm_region_handle(), offset} instead of sending bytes (hgemm_gemm_options_set_a_region).
 * Thread safety: a region's handle, data pointer and size never change; its bytes are the
 * caller's to synchronize (C is final once the hgemm_gemm() that writes it has returned). */

/* Makes a zero-filled region of `bytes` (>= 1) and registers it with the server (options may
 * be NULL; label: free-form, shown by the listing, at most 128 bytes). Returns NULL on
 * failure: INVALID_ARGUMENT for 0 bytes, INTERNAL naming the system call when the memfd cannot
 * be made, else the server's status (FAILED_PRECONDITION over TCP or without
 * --allow_shared_memory, RESOURCE_EXHAUSTED over the client's quota). Not retried. Free with
 * hgemm_region_destroy(). */
HGEMM_EXPORT hgemm_region_t* hgemm_region_create(hgemm_client_t* client,
                                                 const hgemm_call_options_t* options, size_t bytes,
                                                 const char* label, int* code, char** errptr);
/* The region's server handle ("r-..."; lives as long as the region), its memory (writable,
 * 4096-byte aligned) and size. */
HGEMM_EXPORT const char* hgemm_region_handle(const hgemm_region_t* region);
HGEMM_EXPORT void* hgemm_region_data(const hgemm_region_t* region);
HGEMM_EXPORT size_t hgemm_region_bytes(const hgemm_region_t* region);
/* Unmaps the memory here and frees the region object; does not unregister it (the server
 * keeps its own mapping until hgemm_unregister_region() or its --region_ttl_s). region may be
 * NULL. REQUIRES: no call naming it is running, and nothing reads its memory any more. */
HGEMM_EXPORT void hgemm_region_destroy(hgemm_region_t* region);
/* UnregisterRegion: the server unmaps region `handle` (any of this client's, by handle).
 * Errors: the server's (NOT_FOUND if it is not this client's, FAILED_PRECONDITION while GEMMs
 * use it). options may be NULL. */
HGEMM_EXPORT void hgemm_unregister_region(hgemm_client_t* client,
                                          const hgemm_call_options_t* options, const char* handle,
                                          int* code, char** errptr);

/* [revision 6] A submission ring (docs/data_plane.md, "Submission ring"; client/ring_client.h):
 * after the ring is opened, a GEMM whose A, B (and C_in) are in regions or resident matrices and
 * whose C goes to a region is one entry written into shared memory and one completion read
 * back, with no gRPC call. Same host only: a "unix:" target and --allow_shared_memory.
 * Thread safety: hgemm_ring_gemm() may be called from any number of threads at once (one ring
 * shared by all). Ownership: the ring is the caller's (hgemm_ring_close()); the client must
 * outlive it. */

/* Makes, registers and attaches a ring of `entries` submission and completion slots (a power of
 * two, at most 4096; 0: 64), binding `regions` (region handles of this client,
 * hgemm_region_handle()) and `matrices` (resident-matrix handles) for its GEMMs to name; a
 * handle bound to no slot cannot be used through this ring until hgemm_ring_bind() binds it
 * [revision 8] (before: open another). The arrays may be
 * NULL when their count is 0; the strings are copied. options (may be NULL): the timeout of
 * the setup calls. Returns NULL on failure: INVALID_ARGUMENT for bad entries, INTERNAL naming
 * the system call when the memfd cannot be made, else the server's status
 * (PERMISSION_DENIED over TCP, FAILED_PRECONDITION without --allow_shared_memory,
 * RESOURCE_EXHAUSTED past --max_rings_per_client). Not retried. */
HGEMM_EXPORT hgemm_ring_t* hgemm_ring_open(hgemm_client_t* client,
                                           const hgemm_call_options_t* options,
                                           const char* const* regions, size_t region_count,
                                           const char* const* matrices, size_t matrix_count,
                                           uint32_t entries, int* code, char** errptr);
/* hgemm_gemm() through the ring, blocking: A and B named by region (bound to a slot) or handle,
 * C by hgemm_gemm_options_set_c_region (its region bound to a slot), C_in (beta != 0) by region
 * or handle; options as hgemm_gemm() takes them, but for mode, request_id and batch. info (may
 * be NULL) gets queue_wait_ms, kernel_ms, server_total_ms and tflops (the rest zero/empty).
 * Errors: INVALID_ARGUMENT before anything is submitted for what a ring entry cannot say (bytes,
 * a batch, a C not in a region, a handle bound to no slot: the message names the field); the
 * server's status for the entry (NOT_FOUND, OUT_OF_RANGE, INVALID_ARGUMENT naming the field:
 * the ring keeps working); or, once the ring ended (the server shut down, restarted or was
 * killed, the AttachRing call ended, a protocol error), UNAVAILABLE with the reason, for this
 * GEMM in flight and every later GEMM of the ring (none hangs; the GEMM may go as
 * hgemm_gemm() instead). Not retried.
 * [revision 8] Deadline: the options' timeout (else the client's), from this call, is the
 * entry's deadline. Not complete by then: DEADLINE_EXCEEDED. The server does not start an
 * entry whose deadline passed (C's bytes are left as they were), but one it started before
 * runs to the end and writes all of C afterwards, until its late completion comes back (it
 * is dropped): C's region must not be reused before hgemm_ring_drain(). The server holds the
 * regions of a GEMM in flight (hgemm_unregister_region() is FAILED_PRECONDITION meanwhile). */
HGEMM_EXPORT void hgemm_ring_gemm(hgemm_ring_t* ring, const hgemm_gemm_options_t* options,
                                  uint32_t m, uint32_t n, uint32_t k, hgemm_gemm_info_t* info,
                                  int* code, char** errptr);
/* [revision 8] hgemm_ring_gemm() whose C stays on the server as a new resident matrix (as
 * hgemm_gemm_keep_c(), with the server's default TTL): no C region may be set. Returns its
 * handle (malloc()ed; hgemm_free()), NULL on failure (hgemm_ring_gemm()'s errors). */
HGEMM_EXPORT char* hgemm_ring_gemm_keep_c(hgemm_ring_t* ring, const hgemm_gemm_options_t* options,
                                          uint32_t m, uint32_t n, uint32_t k,
                                          hgemm_gemm_info_t* info, int* code, char** errptr);
/* [revision 8] Binds more region and matrix handles (as hgemm_ring_open()'s) to the open ring
 * (BindRingSlots), e.g. a region registered or a matrix uploaded after the open; handles bound
 * already are skipped. Errors: the server's (NOT_FOUND once the ring ended, RESOURCE_EXHAUSTED
 * past 4096 slots of either kind); nothing is bound then. The arrays may be NULL when their
 * count is 0. */
HGEMM_EXPORT void hgemm_ring_bind(hgemm_ring_t* ring, const char* const* regions,
                                  size_t region_count, const char* const* matrices,
                                  size_t matrix_count, int* code, char** errptr);
/* [revision 8] Waits until every GEMM of the ring submitted so far has completed, those that
 * returned DEADLINE_EXCEEDED included: after it the server writes none of their C any more.
 * UNAVAILABLE at once once the ring ended. */
HGEMM_EXPORT void hgemm_ring_drain(hgemm_ring_t* ring, int* code, char** errptr);
/* The handle of the ring's own region: registered while the ring lives, which
 * hgemm_list_regions() lists (label "ring") and the client's quota counts. Lives as long as
 * the ring. */
HGEMM_EXPORT const char* hgemm_ring_region(const hgemm_ring_t* ring);
/* Detaches the ring (the server lets go of it) and unregisters its memory. ring may be NULL.
 * REQUIRES: no hgemm_ring_gemm() of it is running. */
HGEMM_EXPORT void hgemm_ring_close(hgemm_ring_t* ring);

/* A region as ListRegions describes it (proto RegionInfo). Strings longer than their array are
 * cut off (always NUL-terminated). */
typedef struct hgemm_region_info_t {
  char region[64]; /* the handle */
  uint64_t byte_size;
  char label[136];
  double age_seconds;
  double idle_seconds; /* since a GEMM last used it */
  double ttl_seconds;  /* released when idle this long; 0: until unregistered */
  uint32_t in_use;     /* GEMMs using it now */
  unsigned char dma;   /* pinned for the server's GPUs */
  unsigned char cuda_ipc;
  uint32_t device_id; /* for cuda_ipc: the server's device */
} hgemm_region_info_t;

/* ListRegions: this client's regions on the server the call reaches (options may be NULL).
 * Returns NULL on failure. Free with hgemm_region_list_destroy(). Read-only: any thread. */
HGEMM_EXPORT hgemm_region_list_t* hgemm_list_regions(hgemm_client_t* client,
                                                     const hgemm_call_options_t* options, int* code,
                                                     char** errptr);
HGEMM_EXPORT void hgemm_region_list_destroy(hgemm_region_list_t* list);
HGEMM_EXPORT size_t hgemm_region_list_size(const hgemm_region_list_t* list);
/* The client's region bytes, and its quotas (bytes, regions). */
HGEMM_EXPORT uint64_t hgemm_region_list_client_bytes(const hgemm_region_list_t* list);
HGEMM_EXPORT uint64_t hgemm_region_list_quota_bytes(const hgemm_region_list_t* list);
HGEMM_EXPORT uint32_t hgemm_region_list_quota_regions(const hgemm_region_list_t* list);
/* Region i. REQUIRES: i < hgemm_region_list_size(list). */
HGEMM_EXPORT void hgemm_region_list_info(const hgemm_region_list_t* list, size_t i,
                                         hgemm_region_info_t* info);

/* GetServerInfo of the replica the call reaches (options may be NULL). Returns NULL on failure.
 * Free with hgemm_server_info_destroy(). */
HGEMM_EXPORT hgemm_server_info_t* hgemm_server_info(hgemm_client_t* client,
                                                    const hgemm_call_options_t* options, int* code,
                                                    char** errptr);
HGEMM_EXPORT void hgemm_server_info_destroy(hgemm_server_info_t* info);
/* Its fields. Strings live as long as `info`. */
HGEMM_EXPORT const char* hgemm_server_info_version(const hgemm_server_info_t* info);
HGEMM_EXPORT const char* hgemm_server_info_backend(const hgemm_server_info_t* info); /* cuda|cpu */
/* The replica's advertised address ("": a single server). */
HGEMM_EXPORT const char* hgemm_server_info_replica(const hgemm_server_info_t* info);
HGEMM_EXPORT int hgemm_server_info_device_count(const hgemm_server_info_t* info);
/* Device i's name ("NVIDIA H200") and memory. REQUIRES: 0 <= i < device_count. */
HGEMM_EXPORT const char* hgemm_server_info_device_name(const hgemm_server_info_t* info, int i);
HGEMM_EXPORT uint64_t hgemm_server_info_device_memory_bytes(const hgemm_server_info_t* info, int i);
/* Limits: the largest message the server accepts, and the elements of one matrix. */
HGEMM_EXPORT uint64_t hgemm_server_info_max_message_bytes(const hgemm_server_info_t* info);
HGEMM_EXPORT uint64_t hgemm_server_info_max_elements_per_matrix(const hgemm_server_info_t* info);

/* [revision 5] GetServerInfo and ListKernels as JSON: the proto3 JSON mapping of proto/
 * hgemm.proto's ServerInfo and ListKernelsResponse, field names as in the proto (snake_case),
 * fields at their default value left out, 64-bit integers as strings and enums by name (as
 * protobuf's JsonPrintOptions with preserve_proto_field_names). New proto fields appear as new
 * keys: a reader ignores keys it does not know. Of the replica the call reaches (the options'
 * replica, else balanced; options may be NULL). Returns the JSON (malloc()ed, NUL-terminated;
 * hgemm_free()), NULL on failure (the server's status). Retried as hgemm_server_info(). */
HGEMM_EXPORT char* hgemm_server_info_json(hgemm_client_t* client,
                                          const hgemm_call_options_t* options, int* code,
                                          char** errptr);
HGEMM_EXPORT char* hgemm_list_kernels_json(hgemm_client_t* client,
                                           const hgemm_call_options_t* options, int* code,
                                           char** errptr);

/* [revision 7] Calls that do not block: each hgemm_X_start() below takes hgemm_X()'s arguments
 * (the call options and GEMM options are copied), returns at once with a call handle, and
 * reports the outcome once, to one callback type:
 *
 *   done(user_data, result): result is the call's status and what it returned
 *   (hgemm_result_*() read it). It is valid during done only; what done takes from it
 *   (hgemm_result_take_*) is done's to free.
 *
 * Where done runs: on one of the client's completion threads (at most
 * HGEMM_COMPLETION_THREADS of them, made as needed, shared by every call of the client: never
 * a thread per call), never on the thread that called *_start, and never while the library
 * holds a lock. The call itself runs there too, blocking that thread (the core's blocking call,
 * with its retries, client/retry.h); calls beyond the threads' number wait their turn in order.
 * done must not block for long (it holds up that thread) and must not destroy the client.
 *
 * Exactly once: done runs exactly once for every handle *_start returned: with the call's
 * outcome; with HGEMM_CANCELLED when hgemm_call_cancel() came before the call started; or with
 * HGEMM_CANCELLED when the client is destroyed before it started. A call already running when
 * cancelled (or when the client is destroyed) runs to its end, bounded by its deadline, and done
 * gets its outcome; hgemm_stream_next_start()'s is the exception: cancelling it cancels the
 * stream (hgemm_stream_cancel()), so it ends soon. *_start returns NULL, and done never runs,
 * only when the call cannot be queued (out of memory: RESOURCE_EXHAUSTED in *code / *errptr).
 *
 * Ownership: buffers the call reads or writes (operands, `into`, a batch's C buffers, a
 * grouped GEMM's problems and their buffers) stay the caller's and must stay alive, unread,
 * until done has run. The call handle is freed with hgemm_call_destroy() (any time: the call
 * goes on and done still runs); hgemm_call_cancel() as for hgemm_gemm_async(). Client destroy:
 * hgemm_client_destroy() reports HGEMM_CANCELLED to the calls not started, waits for the
 * running ones' done, then frees the client. */
#define HGEMM_COMPLETION_THREADS 8
typedef void (*hgemm_done_fn)(void* user_data, hgemm_result_t* result);

/* The call's status: HGEMM_OK or the code its blocking form would have set; *message (may be
 * NULL) its text ("" on success), valid during done. */
HGEMM_EXPORT int hgemm_result_code(const hgemm_result_t* result, const char** message);
/* The number the blocking form returns: bytes freed (release), bytes written (download), 1 or 0
 * (stream next: answered, or the stream is over); 0 otherwise. */
HGEMM_EXPORT uint64_t hgemm_result_value(const hgemm_result_t* result);
/* Stream next: the gemm_id answered (when hgemm_result_value() is 1). */
HGEMM_EXPORT uint64_t hgemm_result_gemm_id(const hgemm_result_t* result);
/* The string the blocking form returns (upload: the handle; JSON calls: the JSON; a kept C's
 * handle of stream next), malloc()ed, now the caller's (hgemm_free()); NULL when there is none
 * or it was taken already. */
HGEMM_EXPORT char* hgemm_result_take_string(hgemm_result_t* result);
/* The object the blocking form returns, now the caller's (its *_destroy()); NULL when there is
 * none or it was taken already. */
HGEMM_EXPORT hgemm_matrix_list_t* hgemm_result_take_matrix_list(hgemm_result_t* result);
HGEMM_EXPORT hgemm_region_list_t* hgemm_result_take_region_list(hgemm_result_t* result);
HGEMM_EXPORT hgemm_region_t* hgemm_result_take_region(hgemm_result_t* result);
/* The info the blocking form fills: a GEMM's timing and execution (gemm, grouped, ring, stream
 * next), a matrix's description (upload, stream next's kept C). Zeroes when there is none. */
HGEMM_EXPORT void hgemm_result_gemm_info(const hgemm_result_t* result, hgemm_gemm_info_t* info);
HGEMM_EXPORT void hgemm_result_matrix_info(const hgemm_result_t* result, hgemm_matrix_info_t* info);

/* hgemm_gemm() (regions, parallel parts and its retries included); C in c when done gets
 * HGEMM_OK; info: hgemm_result_gemm_info(). The checks made before sending are made when the
 * call runs (their INVALID_ARGUMENT goes to done). */
HGEMM_EXPORT hgemm_call_t* hgemm_gemm_start(hgemm_client_t* client,
                                            const hgemm_gemm_options_t* options, uint32_t m,
                                            uint32_t n, uint32_t k, const void* a, size_t a_bytes,
                                            const void* b, size_t b_bytes, void* c,
                                            size_t c_capacity, hgemm_done_fn done, void* user_data,
                                            int* code, char** errptr);
/* hgemm_gemm_grouped(); problems (the array too) stay the caller's until done has run. */
HGEMM_EXPORT hgemm_call_t* hgemm_gemm_grouped_start(hgemm_client_t* client,
                                                    const hgemm_gemm_options_t* options,
                                                    const hgemm_group_problem_t* problems,
                                                    size_t count, hgemm_done_fn done,
                                                    void* user_data, int* code, char** errptr);
/* hgemm_gemm_many() (indices are copied); read each GEMM with hgemm_batch_result() once done
 * has run. REQUIRES: the batch is not used otherwise until then. */
HGEMM_EXPORT hgemm_call_t* hgemm_gemm_many_start(hgemm_client_t* client, hgemm_batch_t* batch,
                                                 const hgemm_call_options_t* options,
                                                 const size_t* indices, size_t count,
                                                 hgemm_done_fn done, void* user_data, int* code,
                                                 char** errptr);
/* hgemm_upload_typed() (label copied): hgemm_result_take_string() is the handle,
 * hgemm_result_matrix_info() the matrix. */
HGEMM_EXPORT hgemm_call_t* hgemm_upload_start(
    hgemm_client_t* client, const hgemm_call_options_t* options, uint32_t rows, uint32_t cols,
    int dtype, int device_id, const void* data, size_t data_bytes, uint32_t ttl_seconds,
    const char* label, hgemm_done_fn done, void* user_data, int* code, char** errptr);
/* hgemm_download(): hgemm_result_value() is the bytes written into `into`. */
HGEMM_EXPORT hgemm_call_t* hgemm_download_start(hgemm_client_t* client,
                                                const hgemm_call_options_t* options,
                                                const char* handle, uint64_t offset,
                                                uint64_t length, void* into, size_t capacity,
                                                hgemm_done_fn done, void* user_data, int* code,
                                                char** errptr);
/* hgemm_release(): hgemm_result_value() is the bytes freed. */
HGEMM_EXPORT hgemm_call_t* hgemm_release_start(hgemm_client_t* client,
                                               const hgemm_call_options_t* options,
                                               const char* handle, hgemm_done_fn done,
                                               void* user_data, int* code, char** errptr);
/* hgemm_list_matrices() / hgemm_list_regions(): hgemm_result_take_matrix_list() /
 * hgemm_result_take_region_list(). */
HGEMM_EXPORT hgemm_call_t* hgemm_list_matrices_start(hgemm_client_t* client,
                                                     const hgemm_call_options_t* options,
                                                     hgemm_done_fn done, void* user_data, int* code,
                                                     char** errptr);
HGEMM_EXPORT hgemm_call_t* hgemm_list_regions_start(hgemm_client_t* client,
                                                    const hgemm_call_options_t* options,
                                                    hgemm_done_fn done, void* user_data, int* code,
                                                    char** errptr);
/* hgemm_server_info_json() / hgemm_list_kernels_json(): hgemm_result_take_string(). */
HGEMM_EXPORT hgemm_call_t* hgemm_server_info_json_start(hgemm_client_t* client,
                                                        const hgemm_call_options_t* options,
                                                        hgemm_done_fn done, void* user_data,
                                                        int* code, char** errptr);
HGEMM_EXPORT hgemm_call_t* hgemm_list_kernels_json_start(hgemm_client_t* client,
                                                         const hgemm_call_options_t* options,
                                                         hgemm_done_fn done, void* user_data,
                                                         int* code, char** errptr);
/* hgemm_region_create() (label copied): hgemm_result_take_region(). */
HGEMM_EXPORT hgemm_call_t* hgemm_region_create_start(hgemm_client_t* client,
                                                     const hgemm_call_options_t* options,
                                                     size_t bytes, const char* label,
                                                     hgemm_done_fn done, void* user_data, int* code,
                                                     char** errptr);
/* hgemm_unregister_region(). */
HGEMM_EXPORT hgemm_call_t* hgemm_unregister_region_start(hgemm_client_t* client,
                                                         const hgemm_call_options_t* options,
                                                         const char* handle, hgemm_done_fn done,
                                                         void* user_data, int* code, char** errptr);
/* hgemm_ring_gemm() on the completion threads of the client the ring was opened with:
 * hgemm_result_gemm_info(). REQUIRES: the ring is not closed until done has run. */
HGEMM_EXPORT hgemm_call_t* hgemm_ring_gemm_start(hgemm_ring_t* ring,
                                                 const hgemm_gemm_options_t* options, uint32_t m,
                                                 uint32_t n, uint32_t k, hgemm_done_fn done,
                                                 void* user_data, int* code, char** errptr);
/* hgemm_stream_next() on `client`'s completion threads: hgemm_result_value() is its return
 * (1: an answer, 0: the stream is over), hgemm_result_gemm_id() the GEMM answered,
 * hgemm_result_code() its status (or the stream's end), hgemm_result_gemm_info(),
 * hgemm_result_take_string() a kept C's handle and hgemm_result_matrix_info() its matrix. It
 * holds a completion thread until an answer comes: start it while GEMMs are outstanding or the
 * stream is closed or cancelled. Cancelling it cancels the stream. REQUIRES: no other next of
 * the stream is running or started and not done; the stream is destroyed only after done. */
HGEMM_EXPORT hgemm_call_t* hgemm_stream_next_start(hgemm_client_t* client, hgemm_stream_t* stream,
                                                   hgemm_done_fn done, void* user_data, int* code,
                                                   char** errptr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HGEMM_CLIENT_C_HGEMM_H_ */
