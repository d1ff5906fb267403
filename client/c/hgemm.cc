// The C ABI of client/c/hgemm.h over the C++ client (client/gemm_client.h and the types beside
// it: GemmInto, GemmStreamSession, AsyncGemms, CompletionThreads, RetriedCall): each function
// checks its arguments, turns them into a request and CallOptions, forwards, and turns the
// grpc::Status into *code and *errptr. No exception leaves an extern "C" function.
#include "client/c/hgemm.h"

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/async_gemms.h"
#include "client/completion_threads.h"
#include "client/error_details.h"
#include "client/gemm_args.h"
#include "client/gemm_client.h"
#include "client/gemm_into.h"
#include "client/gemm_stream_session.h"
#include "client/retried_call.h"
#include "client/retry.h"
#include "client/ring_client.h"
#include "client/shared_region.h"

namespace {

// Each client its own TCP connection, as the Python fallback's channels (use_local_subchannel_pool)
// and hgemm_load's workers: gRPC would otherwise share one between every client of the process
// with equal settings, and clients made for concurrency would queue on it (H100 run: 16 native
// clients at 2048³ unary got 0.62x the grpcio fallback's req/s).
hgemm::ConnectOptions OwnConnection() {
  hgemm::ConnectOptions connect;
  connect.private_subchannels = true;
  return connect;
}

}  // namespace

struct hgemm_client_options_t {
  hgemm::ConnectOptions connect = OwnConnection();
  hgemm::CallOptions call;
  hgemm::RetryPolicy retry;
};

struct hgemm_client_t {
  hgemm::GemmClient client;
  hgemm::CallOptions defaults;  // timeout, chunk size, unary limit, client id, traceparent
  hgemm::RetryPolicy retry;     // of the blocking calls
  hgemm::AsyncGemms async;      // hgemm_client_destroy() waits for them
  hgemm::CompletionThreads completions{HGEMM_COMPLETION_THREADS};  // of the *_start calls
};

struct hgemm_gemm_options_t {
  hgemm::GemmArgs args;
  int mode = HGEMM_MODE_AUTO;
  int64_t timeout_ms = -1;  // < 0: the client's
};

struct hgemm_call_options_t {
  int64_t timeout_ms = -1;  // < 0: the client's
  std::string replica;
};

struct hgemm_matrix_list_t {
  hgemm::v1::ListMatricesResponse proto;
};

struct hgemm_server_info_t {
  hgemm::v1::ServerInfo proto;
};

struct hgemm_region_t {
  std::unique_ptr<hgemm::SharedRegion> memory;
  std::string handle;
};

struct hgemm_ring_t {
  hgemm_client_t* client;
  std::unique_ptr<hgemm::RingClient> ring;
};

struct hgemm_region_list_t {
  hgemm::v1::ListRegionsResponse proto;
};

struct hgemm_call_t {
  std::shared_ptr<grpc::ClientContext> context;  // an async GEMM's, shared with the call
  std::shared_ptr<hgemm::QueuedCall> started;    // or a *_start call's
};

// What a *_start call comes to (hgemm_result_*); what done does not take is freed with it.
struct hgemm_result_t {
  int code = HGEMM_OK;
  char* error = nullptr;  // the message on failure (malloc()ed)
  uint64_t value = 0;
  uint64_t gemm_id = 0;
  char* string = nullptr;
  hgemm_matrix_list_t* matrix_list = nullptr;
  hgemm_region_list_t* region_list = nullptr;
  hgemm_region_t* region = nullptr;
  hgemm_gemm_info_t gemm_info{};
  hgemm_matrix_info_t matrix_info{};

  hgemm_result_t() = default;
  hgemm_result_t(const hgemm_result_t&) = delete;
  hgemm_result_t& operator=(const hgemm_result_t&) = delete;
  ~hgemm_result_t() {
    std::free(error);
    std::free(string);
    delete matrix_list;
    delete region_list;
    delete region;
  }
};

struct hgemm_batch_t {
  struct Gemm {
    hgemm::v1::GemmRequest request;
    hgemm::CBuffer c;
    grpc::Status status{grpc::StatusCode::UNKNOWN, "not sent yet (hgemm_gemm_many)"};
    bool answered = false;
    hgemm::v1::GemmResponse answer;  // timing, execution, request_id (C is in `c`)
  };
  std::vector<Gemm> gemms;
};

struct hgemm_stream_t {
  std::unique_ptr<hgemm::GemmStreamSession> session;
};

namespace {

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

// The details of the last failure reported on this thread (hgemm_error_*).
struct LastError {
  std::string status;  // the serialized google.rpc.Status; empty: none
  hgemm::ErrorDetails details;
};
thread_local LastError last_error;

// A failure is being reported on this thread: its details become hgemm_error_*'s.
void KeepDetails(const grpc::Status& status) {
  last_error.status = status.error_details();
  last_error.details = hgemm::ErrorDetailsOf(status);
}

// *code and *errptr for `status` (leveldb's SaveError, with the code). True if it failed.
bool SaveStatus(const grpc::Status& status, int* code, char** errptr) {
  *code = status.error_code();
  if (status.ok()) return false;
  KeepDetails(status);
  std::free(*errptr);
  *errptr = CopyString(status.error_message());
  return true;
}

bool Fail(grpc::StatusCode code, const std::string& message, int* out_code, char** errptr) {
  return SaveStatus(grpc::Status(code, message), out_code, errptr);
}

// The exception a C++ call threw, as a status (none escapes into C).
void SaveException(int* code, char** errptr) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    Fail(grpc::StatusCode::RESOURCE_EXHAUSTED, "out of memory in libhgemm_client", code, errptr);
  } catch (const std::exception& e) {
    Fail(grpc::StatusCode::INTERNAL, e.what(), code, errptr);
  } catch (...) {
    Fail(grpc::StatusCode::INTERNAL, "unknown exception in libhgemm_client", code, errptr);
  }
}

// The client's CallOptions with a call's timeout (< 0: the client's) and replica.
hgemm::CallOptions CallOptionsOf(const hgemm_client_t* client, int64_t timeout_ms,
                                 const std::string& replica) {
  hgemm::CallOptions options = client->defaults;
  if (timeout_ms >= 0) options.timeout = std::chrono::milliseconds(timeout_ms);
  options.replica = replica;
  return options;
}

hgemm::CallOptions CallOptionsOf(const hgemm_client_t* client, const hgemm_call_options_t* call) {
  return call == nullptr ? CallOptionsOf(client, -1, "")
                         : CallOptionsOf(client, call->timeout_ms, call->replica);
}

// `s` into dst[N], cut off to fit.
template <size_t N>
void CopyInto(char (&dst)[N], const std::string& s) {
  const size_t n = std::min(s.size(), N - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// The check of the GEMM whose info was filled last on this thread (hgemm_gemm_verify).
struct LastVerify {
  double ms = 0;
  uint32_t repetitions = 0;
  int suspect_device_id = -1;
};
thread_local LastVerify last_verify;

void FillInfo(const hgemm::v1::GemmResponse& response, bool streamed, hgemm_gemm_info_t* info) {
  last_verify = {
      response.timing().verify_ms(), response.execution().verified_repetitions(),
      response.execution().has_suspect_device_id() ? response.execution().suspect_device_id() : -1};
  const hgemm::v1::Timing& t = response.timing();
  const hgemm::v1::Execution& e = response.execution();
  info->queue_wait_ms = t.queue_wait_ms();
  info->host_to_device_ms = t.host_to_device_ms();
  info->kernel_ms = t.kernel_ms();
  info->device_to_host_ms = t.device_to_host_ms();
  info->server_total_ms = t.server_total_ms();
  info->tflops = t.tflops();
  CopyInto(info->kernel, e.kernel());
  info->accumulation = e.accumulation();
  CopyInto(info->backend, e.backend());
  info->device_id = e.device_id();
  CopyInto(info->device_name, e.device_name());
  info->stream_id = e.stream_id();
  CopyInto(info->request_id, response.request_id());
  info->streamed = streamed ? 1 : 0;
}

hgemm_matrix_info_t MatrixInfoOf(const hgemm::v1::MatrixInfo& matrix) {
  return hgemm_matrix_info_t{matrix.rows(), matrix.cols(), matrix.bytes(), matrix.device_id(),
                             matrix.ttl_seconds()};
}

// A call's retries by the client's policy (hgemm::RetriedCall): attempt(CallOptions of the try).
template <typename Attempt>
grpc::Status Retried(const hgemm_client_t* client, const hgemm::CallOptions& call, bool idempotent,
                     Attempt&& attempt) {
  return hgemm::RetriedCall(client->retry, call, idempotent, attempt);
}

hgemm::GemmInto::Mode ModeOf(const hgemm_gemm_options_t& options) {
  return options.mode == HGEMM_MODE_AUTO     ? hgemm::GemmInto::Mode::kAuto
         : options.mode == HGEMM_MODE_STREAM ? hgemm::GemmInto::Mode::kStream
                                             : hgemm::GemmInto::Mode::kUnary;
}

// `message` as the header's JSON (hgemm_server_info_json), malloc()ed; INTERNAL if protobuf
// cannot print it.
char* JsonOf(const google::protobuf::Message& message, int* code, char** errptr) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto printed = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!printed.ok()) {
    Fail(grpc::StatusCode::INTERNAL, "printing JSON: " + printed.ToString(), code, errptr);
    return nullptr;
  }
  return CopyString(json);
}

}  // namespace

extern "C" {

int hgemm_abi_version(void) { return HGEMM_ABI_VERSION; }
int hgemm_abi_revision(void) { return HGEMM_ABI_REVISION; }

void hgemm_gemm_verify(double* verify_ms, uint32_t* repetitions, int* suspect_device_id) {
  if (verify_ms != nullptr) *verify_ms = last_verify.ms;
  if (repetitions != nullptr) *repetitions = last_verify.repetitions;
  if (suspect_device_id != nullptr) *suspect_device_id = last_verify.suspect_device_id;
}

const char* hgemm_status_name(int code) { return hgemm::StatusCodeName(code); }

void hgemm_free(void* ptr) { std::free(ptr); }

const char* hgemm_error_reason(void) { return last_error.details.reason.c_str(); }
size_t hgemm_error_field_violation_count(void) {
  return last_error.details.field_violations.size();
}
const char* hgemm_error_field_violation(size_t i, const char** description) {
  const hgemm::FieldViolation& v = last_error.details.field_violations[i];
  if (description != nullptr) *description = v.description.c_str();
  return v.field.c_str();
}
size_t hgemm_error_quota_violation_count(void) {
  return last_error.details.quota_violations.size();
}
const char* hgemm_error_quota_violation(size_t i, const char** description) {
  const hgemm::QuotaViolation& v = last_error.details.quota_violations[i];
  if (description != nullptr) *description = v.description.c_str();
  return v.subject.c_str();
}
int64_t hgemm_error_retry_delay_ms(void) {
  const auto& delay = last_error.details.retry_delay;
  return delay ? int64_t(delay->count()) : -1;
}
const void* hgemm_error_status(size_t* bytes) {
  *bytes = last_error.status.size();
  return last_error.status.data();
}

// Client options.
hgemm_client_options_t* hgemm_client_options_create(void) {
  return new (std::nothrow) hgemm_client_options_t;
}
void hgemm_client_options_destroy(hgemm_client_options_t* options) { delete options; }
void hgemm_client_options_set_tls(hgemm_client_options_t* options, unsigned char on) {
  options->connect.tls = on != 0;
}
void hgemm_client_options_set_tls_ca(hgemm_client_options_t* options, const char* path) {
  options->connect.tls_ca = path;
}
void hgemm_client_options_set_tls_cert(hgemm_client_options_t* options, const char* path) {
  options->connect.tls_cert = path;
}
void hgemm_client_options_set_tls_key(hgemm_client_options_t* options, const char* path) {
  options->connect.tls_key = path;
}
void hgemm_client_options_set_tls_server_name(hgemm_client_options_t* options, const char* name) {
  options->connect.tls_server_name = name;
}
void hgemm_client_options_set_token(hgemm_client_options_t* options, const char* token) {
  options->connect.token = token;
}
void hgemm_client_options_set_client_id(hgemm_client_options_t* options, const char* client_id) {
  options->call.client_id = client_id;
}
void hgemm_client_options_set_traceparent(hgemm_client_options_t* options,
                                          const char* traceparent) {
  options->call.traceparent = traceparent;
}
void hgemm_client_options_set_timeout_ms(hgemm_client_options_t* options, int64_t timeout_ms) {
  options->call.timeout = std::chrono::milliseconds(timeout_ms);
}
void hgemm_client_options_set_chunk_bytes(hgemm_client_options_t* options, int64_t chunk_bytes) {
  options->call.chunk_bytes = chunk_bytes;
}
void hgemm_client_options_set_unary_limit_bytes(hgemm_client_options_t* options,
                                                int64_t unary_limit_bytes) {
  options->call.unary_limit_bytes = unary_limit_bytes;
}

void hgemm_client_options_set_retry_policy(hgemm_client_options_t* options, int attempts,
                                           int64_t initial_backoff_ms, int64_t max_backoff_ms,
                                           double backoff_multiplier) {
  options->retry.attempts = attempts;
  options->retry.initial_backoff = std::chrono::milliseconds(initial_backoff_ms);
  options->retry.max_backoff = std::chrono::milliseconds(max_backoff_ms);
  options->retry.backoff_multiplier = backoff_multiplier;
}

// The client.
hgemm_client_t* hgemm_client_create(const char* target, const hgemm_client_options_t* options,
                                    int* code, char** errptr) {
  const hgemm_client_options_t defaults;
  if (options == nullptr) options = &defaults;
  if (options->call.chunk_bytes < 1) {
    Fail(grpc::StatusCode::INVALID_ARGUMENT, "chunk_bytes must be at least 1", code, errptr);
    return nullptr;
  }
  if (SaveStatus(options->retry.Check(), code, errptr)) return nullptr;
  try {
    auto* client = new hgemm_client_t{hgemm::GemmClient(target, options->connect), options->call,
                                      options->retry};
    *code = HGEMM_OK;
    return client;
  } catch (const std::runtime_error& e) {  // Connect(): a TLS file, or a cert without its key
    Fail(grpc::StatusCode::INVALID_ARGUMENT, e.what(), code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

void hgemm_client_destroy(hgemm_client_t* client) {
  client->completions.Stop();
  // Until every asynchronous GEMM's completion is gone, gRPC may still run it on its threads.
  client->async.WaitIdle();
  delete client;
}

int64_t hgemm_client_parallel_min_bytes(const hgemm_client_t* client) {
  return client->defaults.parallel_min_bytes;
}

// GEMM options.
hgemm_gemm_options_t* hgemm_gemm_options_create(void) {
  return new (std::nothrow) hgemm_gemm_options_t;
}
void hgemm_gemm_options_destroy(hgemm_gemm_options_t* options) { delete options; }
void hgemm_gemm_options_set_kernel(hgemm_gemm_options_t* options, const char* kernel) {
  options->args.kernel = kernel;
}
void hgemm_gemm_options_set_accumulation(hgemm_gemm_options_t* options, int accumulation) {
  options->args.accumulation = static_cast<hgemm::v1::Accumulation>(accumulation);
}
void hgemm_gemm_options_set_request_id(hgemm_gemm_options_t* options, const char* request_id) {
  options->args.request_id = request_id;
}
void hgemm_gemm_options_set_mode(hgemm_gemm_options_t* options, int mode) { options->mode = mode; }
void hgemm_gemm_options_set_verify(hgemm_gemm_options_t* options, unsigned char on,
                                   uint32_t repetitions) {
  options->args.verify = on != 0;
  options->args.verify_repetitions = repetitions;
}
void hgemm_gemm_options_set_a_handle(hgemm_gemm_options_t* options, const char* handle) {
  options->args.a_handle = handle;
}
void hgemm_gemm_options_set_b_handle(hgemm_gemm_options_t* options, const char* handle) {
  options->args.b_handle = handle;
}
void hgemm_gemm_options_set_timeout_ms(hgemm_gemm_options_t* options, int64_t timeout_ms) {
  options->timeout_ms = timeout_ms;
}
void hgemm_gemm_options_set_transpose_a(hgemm_gemm_options_t* options, unsigned char on) {
  options->args.transpose_a = on != 0;
}
void hgemm_gemm_options_set_transpose_b(hgemm_gemm_options_t* options, unsigned char on) {
  options->args.transpose_b = on != 0;
}
void hgemm_gemm_options_set_dtype(hgemm_gemm_options_t* options, int dtype) {
  options->args.dtype = static_cast<hgemm::v1::DataType>(dtype);  // HGEMM_DTYPE_* are its values
}
void hgemm_gemm_options_set_c_dtype(hgemm_gemm_options_t* options, int c_dtype) {
  options->args.c_dtype = static_cast<hgemm::v1::DataType>(c_dtype);
}

void hgemm_gemm_options_set_alpha(hgemm_gemm_options_t* options, float alpha) {
  options->args.alpha = alpha;
}
void hgemm_gemm_options_set_beta(hgemm_gemm_options_t* options, float beta) {
  options->args.beta = beta;
}
void hgemm_gemm_options_set_c_in(hgemm_gemm_options_t* options, const void* c_in,
                                 size_t c_in_bytes) {
  options->args.c_in = c_in;
  options->args.c_in_bytes = c_in_bytes;
}
void hgemm_gemm_options_set_c_in_handle(hgemm_gemm_options_t* options, const char* handle) {
  options->args.c_in_handle = handle;
}
namespace {
void SetRegion(hgemm::v1::RegionRef* ref, const char* region, uint64_t offset) {
  ref->set_region(region);
  ref->set_offset(offset);
}
}  // namespace
void hgemm_gemm_options_set_a_region(hgemm_gemm_options_t* options, const char* region,
                                     uint64_t offset) {
  SetRegion(&options->args.a_region, region, offset);
}
void hgemm_gemm_options_set_b_region(hgemm_gemm_options_t* options, const char* region,
                                     uint64_t offset) {
  SetRegion(&options->args.b_region, region, offset);
}
void hgemm_gemm_options_set_c_in_region(hgemm_gemm_options_t* options, const char* region,
                                        uint64_t offset) {
  SetRegion(&options->args.c_in_region, region, offset);
}
void hgemm_gemm_options_set_c_region(hgemm_gemm_options_t* options, const char* region,
                                     uint64_t offset) {
  SetRegion(&options->args.c_region, region, offset);
}
void hgemm_gemm_options_set_batch(hgemm_gemm_options_t* options, uint32_t batch) {
  options->args.batch = batch;
}

// Call options.
hgemm_call_options_t* hgemm_call_options_create(void) {
  return new (std::nothrow) hgemm_call_options_t;
}
void hgemm_call_options_destroy(hgemm_call_options_t* options) { delete options; }
void hgemm_call_options_set_timeout_ms(hgemm_call_options_t* options, int64_t timeout_ms) {
  options->timeout_ms = timeout_ms;
}
void hgemm_call_options_set_replica(hgemm_call_options_t* options, const char* replica) {
  options->replica = replica;
}

// Calls.
void hgemm_gemm(hgemm_client_t* client, const hgemm_gemm_options_t* options, uint32_t m, uint32_t n,
                uint32_t k, const void* a, size_t a_bytes, const void* b, size_t b_bytes, void* c,
                size_t c_capacity, hgemm_gemm_info_t* info, int* code, char** errptr) {
  try {
    const hgemm_gemm_options_t defaults;
    if (options == nullptr) options = &defaults;
    if (SaveStatus(options->args.Check(m, n, k, {a, a_bytes, b, b_bytes}, c_capacity,
                                       hgemm::GemmArgs::Regions::kTaken),
                   code, errptr)) {
      return;
    }
    hgemm::v1::GemmRequest request;
    hgemm::OperandBytes detached;
    options->args.Request(m, n, k, {a, a_bytes, b, b_bytes}, &request, &detached);
    const hgemm::CallOptions call = CallOptionsOf(client, options->timeout_ms, "");
    const hgemm::GemmInto gemm(client->client, std::move(request), detached,
                               {static_cast<char*>(c), c_capacity}, ModeOf(*options), call);
    hgemm::v1::GemmResponse response;
    if (SaveStatus(Retried(client, call, gemm.idempotent(),
                           [&](const hgemm::CallOptions& try_call) {
                             return gemm.Try(try_call, &response);
                           }),
                   code, errptr)) {
      return;
    }
    if (info != nullptr) FillInfo(response, gemm.streamed(), info);
  } catch (...) {
    SaveException(code, errptr);
  }
}

void hgemm_gemm_grouped(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                        const hgemm_group_problem_t* problems, size_t count,
                        hgemm_gemm_info_t* info, int* code, char** errptr) {
  try {
    const hgemm_gemm_options_t defaults;
    if (options == nullptr) options = &defaults;
    if (SaveStatus(options->mode == HGEMM_MODE_STREAM ? hgemm::GemmArgs::kNotAGroupForm
                                                      : options->args.CheckGroupForm(),
                   code, errptr)) {
      return;
    }
    // The form: types, layout, scales and options (no operands; Check checks the types).
    hgemm::GemmArgs problem_args = options->args;
    std::vector<hgemm::GroupedOperands> operands(count);
    for (size_t i = 0; i < count; ++i) {
      const hgemm_group_problem_t& p = problems[i];
      problem_args.c_in = p.c_in;
      problem_args.c_in_bytes = p.c_in_bytes;
      const grpc::Status checked = problem_args.Check(
          p.m, p.n, p.k, {p.a, p.a_bytes, p.b, p.b_bytes}, p.c == nullptr ? 0 : p.c_capacity);
      if (!checked.ok()) {
        Fail(checked.error_code(), fmt::format("problems[{}].{}", i, checked.error_message()), code,
             errptr);
        return;
      }
      operands[i] = {p.m,
                     p.n,
                     p.k,
                     {static_cast<const char*>(p.a), p.a_bytes},
                     {static_cast<const char*>(p.b), p.b_bytes},
                     {static_cast<const char*>(p.c_in), p.c_in == nullptr ? 0 : p.c_in_bytes}};
    }
    hgemm::v1::GemmRequest form;
    options->args.Request(0, 0, 0, {}, &form);
    std::vector<std::string> c;
    hgemm::v1::GemmResponse response;
    if (SaveStatus(
            Retried(client, CallOptionsOf(client, options->timeout_ms, ""), /*idempotent=*/true,
                    [&](const hgemm::CallOptions& call) {
                      return client->client.GemmGrouped(form, operands, &c, &response, call);
                    }),
            code, errptr)) {
      return;
    }
    // GemmGrouped checked each C's size against its problem, and Check each capacity.
    for (size_t i = 0; i < count; ++i) std::memcpy(problems[i].c, c[i].data(), c[i].size());
    if (info != nullptr) FillInfo(response, false, info);
  } catch (...) {
    SaveException(code, errptr);
  }
}

// Asynchronous GEMMs.
namespace {

// hgemm_gemm_async() and hgemm_gemm_keep_c_async(): keep_c keeps C on the server for
// c_ttl_seconds (c NULL and 0). `tell` turns the outcome, on a gRPC thread, into
// hgemm_gemm_done_fn's or, for a kept C, hgemm_keep_c_done_fn's arguments.
hgemm_call_t* StartGemm(hgemm_client_t* client, const hgemm_gemm_options_t* options, uint32_t m,
                        uint32_t n, uint32_t k, const void* a, size_t a_bytes, const void* b,
                        size_t b_bytes, void* c, size_t c_capacity, bool keep_c,
                        uint32_t c_ttl_seconds, hgemm::AsyncGemms::Done tell, int* code,
                        char** errptr) {
  try {
    const hgemm_gemm_options_t defaults;
    if (options == nullptr) options = &defaults;
    if (SaveStatus(options->args.Check(m, n, k, {a, a_bytes, b, b_bytes},
                                       keep_c ? hgemm::GemmArgs::kCKept : c_capacity),
                   code, errptr)) {
      return nullptr;
    }
    hgemm::v1::GemmRequest request;
    hgemm::OperandBytes detached;  // sent from the caller's memory (GemmAsync)
    options->args.Request(m, n, k, {a, a_bytes, b, b_bytes}, &request, &detached);
    request.set_keep_c_resident(keep_c);
    request.set_c_ttl_seconds(c_ttl_seconds);
    const hgemm::CallOptions call = CallOptionsOf(client, options->timeout_ms, "");
    auto handle = std::make_unique<hgemm_call_t>();
    handle->context = std::make_shared<grpc::ClientContext>();
    client->async.Start(client->client, std::move(request), detached,
                        {static_cast<char*>(c), c_capacity}, ModeOf(*options), call,
                        handle->context, std::move(tell));
    *code = HGEMM_OK;
    return handle.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

}  // namespace

hgemm_call_t* hgemm_gemm_async(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                               uint32_t m, uint32_t n, uint32_t k, const void* a, size_t a_bytes,
                               const void* b, size_t b_bytes, void* c, size_t c_capacity,
                               hgemm_gemm_done_fn done, void* user_data, int* code, char** errptr) {
  auto tell = [done, user_data](const grpc::Status& status, const hgemm::v1::GemmResponse& response,
                                bool streamed) {
    if (!status.ok()) {
      KeepDetails(status);
      done(user_data, status.error_code(), status.error_message().c_str(), nullptr);
      return;
    }
    hgemm_gemm_info_t info;
    FillInfo(response, streamed, &info);
    done(user_data, HGEMM_OK, "", &info);
  };
  return StartGemm(client, options, m, n, k, a, a_bytes, b, b_bytes, c, c_capacity,
                   /*keep_c=*/false, 0, std::move(tell), code, errptr);
}

hgemm_call_t* hgemm_gemm_keep_c_async(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                                      uint32_t m, uint32_t n, uint32_t k, const void* a,
                                      size_t a_bytes, const void* b, size_t b_bytes,
                                      uint32_t c_ttl_seconds, hgemm_keep_c_done_fn done,
                                      void* user_data, int* code, char** errptr) {
  auto tell = [done, user_data](const grpc::Status& status, const hgemm::v1::GemmResponse& response,
                                bool streamed) {
    if (!status.ok()) {
      KeepDetails(status);
      done(user_data, status.error_code(), status.error_message().c_str(), nullptr, nullptr,
           nullptr);
      return;
    }
    hgemm_gemm_info_t info;
    FillInfo(response, streamed, &info);
    const hgemm_matrix_info_t c_info = MatrixInfoOf(response.c_matrix());
    done(user_data, HGEMM_OK, "", &info, response.c_matrix().handle().c_str(), &c_info);
  };
  return StartGemm(client, options, m, n, k, a, a_bytes, b, b_bytes, nullptr, 0, /*keep_c=*/true,
                   c_ttl_seconds, std::move(tell), code, errptr);
}

void hgemm_call_cancel(hgemm_call_t* call) {
  if (call->context != nullptr) call->context->TryCancel();
  if (call->started != nullptr) call->started->Cancel();
}
void hgemm_call_destroy(hgemm_call_t* call) { delete call; }

// Batches.
hgemm_batch_t* hgemm_batch_create(void) { return new (std::nothrow) hgemm_batch_t; }
void hgemm_batch_destroy(hgemm_batch_t* batch) { delete batch; }
size_t hgemm_batch_size(const hgemm_batch_t* batch) { return batch->gemms.size(); }

namespace {

// hgemm_batch_add's, with C kept on the server for c_ttl_seconds when keep_c.
size_t AddToBatch(hgemm_batch_t* batch, const hgemm_gemm_options_t* options, uint32_t m, uint32_t n,
                  uint32_t k, const void* a, size_t a_bytes, const void* b, size_t b_bytes, void* c,
                  size_t c_capacity, bool keep_c, uint32_t c_ttl_seconds, int* code,
                  char** errptr) {
  try {
    const hgemm_gemm_options_t defaults;
    if (options == nullptr) options = &defaults;
    if (SaveStatus(options->args.Check(m, n, k, {a, a_bytes, b, b_bytes},
                                       keep_c ? hgemm::GemmArgs::kCKept : c_capacity),
                   code, errptr)) {
      return SIZE_MAX;
    }
    hgemm_batch_t::Gemm gemm;
    gemm.c = {static_cast<char*>(c), c_capacity};
    options->args.Request(m, n, k, {a, a_bytes, b, b_bytes}, &gemm.request);
    gemm.request.set_keep_c_resident(keep_c);
    gemm.request.set_c_ttl_seconds(c_ttl_seconds);
    batch->gemms.push_back(std::move(gemm));
    return batch->gemms.size() - 1;
  } catch (...) {
    SaveException(code, errptr);
  }
  return SIZE_MAX;
}

}  // namespace

size_t hgemm_batch_add(hgemm_batch_t* batch, const hgemm_gemm_options_t* options, uint32_t m,
                       uint32_t n, uint32_t k, const void* a, size_t a_bytes, const void* b,
                       size_t b_bytes, void* c, size_t c_capacity, int* code, char** errptr) {
  return AddToBatch(batch, options, m, n, k, a, a_bytes, b, b_bytes, c, c_capacity, false, 0, code,
                    errptr);
}

size_t hgemm_batch_add_keep_c(hgemm_batch_t* batch, const hgemm_gemm_options_t* options, uint32_t m,
                              uint32_t n, uint32_t k, const void* a, size_t a_bytes, const void* b,
                              size_t b_bytes, uint32_t c_ttl_seconds, int* code, char** errptr) {
  return AddToBatch(batch, options, m, n, k, a, a_bytes, b, b_bytes, nullptr, 0, true,
                    c_ttl_seconds, code, errptr);
}

char* hgemm_batch_c_handle(const hgemm_batch_t* batch, size_t i, hgemm_matrix_info_t* c_info) {
  const hgemm_batch_t::Gemm& gemm = batch->gemms[i];
  if (!gemm.answered || !gemm.status.ok() || !gemm.answer.has_c_matrix()) return nullptr;
  if (c_info != nullptr) *c_info = MatrixInfoOf(gemm.answer.c_matrix());
  return CopyString(gemm.answer.c_matrix().handle());
}

void hgemm_gemm_many(hgemm_client_t* client, hgemm_batch_t* batch,
                     const hgemm_call_options_t* options, const size_t* indices, size_t count,
                     int* code, char** errptr) {
  try {
    std::vector<size_t> sent;
    for (size_t j = 0; j < (indices == nullptr ? batch->gemms.size() : count); ++j) {
      sent.push_back(indices == nullptr ? j : indices[j]);
    }
    std::vector<const hgemm::v1::GemmRequest*> requests;
    std::vector<hgemm::CBuffer> c_into;
    for (size_t i : sent) {
      requests.push_back(&batch->gemms[i].request);
      c_into.push_back(batch->gemms[i].c);
    }
    std::vector<hgemm::StreamedGemm> results;
    grpc::Status status;
    if (!requests.empty()) {
      status =
          client->client.GemmStream(requests, &results, CallOptionsOf(client, options), &c_into);
    }
    for (size_t j = 0; j < sent.size(); ++j) {
      hgemm_batch_t::Gemm& gemm = batch->gemms[sent[j]];
      hgemm::StreamedGemm& result = results[j];
      gemm.answered = result.answered;
      gemm.status = result.answered ? result.status
                    : !status.ok()  ? status
                                    : grpc::Status(grpc::StatusCode::UNKNOWN,
                                                   "the stream ended without an answer");
      gemm.answer = std::move(result.response);
    }
    SaveStatus(status, code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
}

unsigned char hgemm_batch_result(const hgemm_batch_t* batch, size_t i, hgemm_gemm_info_t* info,
                                 int* code, char** errptr) {
  const hgemm_batch_t::Gemm& gemm = batch->gemms[i];
  if (!SaveStatus(gemm.status, code, errptr) && info != nullptr) {
    FillInfo(gemm.answer, true, info);
  }
  return gemm.answered ? 1 : 0;
}

char* hgemm_upload(hgemm_client_t* client, const hgemm_call_options_t* options, uint32_t rows,
                   uint32_t cols, const void* data, size_t data_bytes, uint32_t ttl_seconds,
                   const char* label, hgemm_matrix_info_t* info, int* code, char** errptr) {
  return hgemm_upload_typed(client, options, rows, cols, HGEMM_DTYPE_FP16, -1, data, data_bytes,
                            ttl_seconds, label, info, code, errptr);
}

char* hgemm_upload_typed(hgemm_client_t* client, const hgemm_call_options_t* options, uint32_t rows,
                         uint32_t cols, int dtype, int device_id, const void* data,
                         size_t data_bytes, uint32_t ttl_seconds, const char* label,
                         hgemm_matrix_info_t* info, int* code, char** errptr) {
  try {
    if (dtype < HGEMM_DTYPE_DEFAULT || dtype > HGEMM_DTYPE_BF16) {
      Fail(grpc::StatusCode::INVALID_ARGUMENT,
           fmt::format("dtype {} is not HGEMM_DTYPE_DEFAULT, _FP16 or _BF16 (an uploaded matrix)",
                       dtype),
           code, errptr);
      return nullptr;
    }
    const char* type = dtype == HGEMM_DTYPE_BF16 ? "bf16" : "fp16";
    if (data_bytes != 2 * static_cast<unsigned __int128>(rows) * cols ||
        (data == nullptr && data_bytes != 0)) {
      Fail(grpc::StatusCode::INVALID_ARGUMENT,
           fmt::format("data_bytes is {}; a {}x{} {} matrix is {} bytes", data_bytes, rows, cols,
                       type, 2 * uint64_t{rows} * cols),
           code, errptr);
      return nullptr;
    }
    hgemm::v1::MatrixInfo matrix;
    const std::string_view bytes(static_cast<const char*>(data), data_bytes);
    // Not idempotent: a second upload would leave two matrices.
    if (SaveStatus(Retried(client, CallOptionsOf(client, options), false,
                           [&](const hgemm::CallOptions& call) {
                             return client->client.UploadMatrix(
                                 rows, cols, bytes, &matrix, ttl_seconds, label, call,
                                 static_cast<hgemm::v1::DataType>(dtype), device_id);
                           }),
                   code, errptr)) {
      return nullptr;
    }
    if (info != nullptr) *info = MatrixInfoOf(matrix);
    return CopyString(matrix.handle());
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

char* hgemm_gemm_keep_c(hgemm_client_t* client, const hgemm_gemm_options_t* options, uint32_t m,
                        uint32_t n, uint32_t k, const void* a, size_t a_bytes, const void* b,
                        size_t b_bytes, uint32_t c_ttl_seconds, hgemm_gemm_info_t* info,
                        hgemm_matrix_info_t* c_info, int* code, char** errptr) {
  try {
    const hgemm_gemm_options_t defaults;
    if (options == nullptr) options = &defaults;
    if (SaveStatus(options->args.Check(m, n, k, {a, a_bytes, b, b_bytes}, hgemm::GemmArgs::kCKept),
                   code, errptr)) {
      return nullptr;
    }
    hgemm::v1::GemmRequest request;
    hgemm::OperandBytes detached;
    options->args.Request(m, n, k, {a, a_bytes, b, b_bytes}, &request, &detached);
    request.set_keep_c_resident(true);
    request.set_c_ttl_seconds(c_ttl_seconds);
    const hgemm::CallOptions call = CallOptionsOf(client, options->timeout_ms, "");
    const hgemm::GemmInto gemm(client->client, std::move(request), detached, {}, ModeOf(*options),
                               call);
    hgemm::v1::GemmResponse response;
    // Not idempotent: a second run would keep a second C.
    if (SaveStatus(Retried(client, call, false,
                           [&](const hgemm::CallOptions& try_call) {
                             return gemm.Try(try_call, &response);
                           }),
                   code, errptr)) {
      return nullptr;
    }
    if (response.c_matrix().handle().empty()) {
      Fail(grpc::StatusCode::INTERNAL, "the server kept no C (keep_c_resident ignored?)", code,
           errptr);
      return nullptr;
    }
    if (info != nullptr) FillInfo(response, gemm.streamed(), info);
    if (c_info != nullptr) *c_info = MatrixInfoOf(response.c_matrix());
    return CopyString(response.c_matrix().handle());
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

uint64_t hgemm_download(hgemm_client_t* client, const hgemm_call_options_t* options,
                        const char* handle, uint64_t offset, uint64_t length, void* into,
                        size_t capacity, int* code, char** errptr) {
  try {
    if (length > capacity) {
      Fail(grpc::StatusCode::INVALID_ARGUMENT,
           fmt::format("capacity is {} bytes, short of the {} bytes asked for (nothing was sent)",
                       capacity, length),
           code, errptr);
      return 0;
    }
    uint64_t received = 0;
    if (SaveStatus(Retried(client, CallOptionsOf(client, options), true,
                           [&](const hgemm::CallOptions& call) {
                             return client->client.DownloadInto(
                                 handle, offset, length, {static_cast<char*>(into), capacity},
                                 &received, call);
                           }),
                   code, errptr)) {
      return 0;
    }
    return received;
  } catch (...) {
    SaveException(code, errptr);
  }
  return 0;
}

hgemm_matrix_list_t* hgemm_list_matrices(hgemm_client_t* client,
                                         const hgemm_call_options_t* options, int* code,
                                         char** errptr) {
  try {
    auto list = std::make_unique<hgemm_matrix_list_t>();
    if (SaveStatus(Retried(client, CallOptionsOf(client, options), true,
                           [&](const hgemm::CallOptions& call) {
                             return client->client.ListMatrices(&list->proto, call);
                           }),
                   code, errptr)) {
      return nullptr;
    }
    return list.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

void hgemm_matrix_list_destroy(hgemm_matrix_list_t* list) { delete list; }
size_t hgemm_matrix_list_size(const hgemm_matrix_list_t* list) {
  return list->proto.matrices_size();
}
uint64_t hgemm_matrix_list_client_bytes(const hgemm_matrix_list_t* list) {
  return list->proto.client_bytes();
}
uint64_t hgemm_matrix_list_quota_bytes(const hgemm_matrix_list_t* list) {
  return list->proto.quota_bytes();
}
void hgemm_matrix_list_info(const hgemm_matrix_list_t* list, size_t i, hgemm_matrix_info_t* info) {
  *info = MatrixInfoOf(list->proto.matrices(i));
}
const char* hgemm_matrix_list_handle(const hgemm_matrix_list_t* list, size_t i) {
  return list->proto.matrices(i).handle().c_str();
}
const char* hgemm_matrix_list_label(const hgemm_matrix_list_t* list, size_t i) {
  return list->proto.matrices(i).label().c_str();
}
const char* hgemm_matrix_list_replica(const hgemm_matrix_list_t* list, size_t i) {
  return list->proto.matrices(i).replica().c_str();
}
int hgemm_matrix_list_dtype(const hgemm_matrix_list_t* list, size_t i) {
  return list->proto.matrices(i).dtype();
}
double hgemm_matrix_list_age_seconds(const hgemm_matrix_list_t* list, size_t i) {
  return list->proto.matrices(i).age_seconds();
}
double hgemm_matrix_list_idle_seconds(const hgemm_matrix_list_t* list, size_t i) {
  return list->proto.matrices(i).idle_seconds();
}

// Persistent streams.
hgemm_stream_t* hgemm_stream_open(hgemm_client_t* client, const hgemm_call_options_t* options,
                                  int* code, char** errptr) {
  try {
    hgemm::CallOptions call = CallOptionsOf(client, options);
    call.timeout = std::chrono::milliseconds(
        options == nullptr ? 0 : std::max<int64_t>(options->timeout_ms, 0));
    auto stream = std::make_unique<hgemm_stream_t>();
    stream->session = std::make_unique<hgemm::GemmStreamSession>(client->client, call);
    *code = HGEMM_OK;
    return stream.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

namespace {

// hgemm_stream_submit (borrow: hgemm_stream_submit_borrowed, A and B not copied).
void SubmitToStream(hgemm_stream_t* stream, uint64_t gemm_id, const hgemm_gemm_options_t* options,
                    uint32_t m, uint32_t n, uint32_t k, const void* a, size_t a_bytes,
                    const void* b, size_t b_bytes, void* c, size_t c_capacity, unsigned char keep_c,
                    uint32_t c_ttl_seconds, bool borrow, int* code, char** errptr) {
  try {
    const hgemm_gemm_options_t defaults;
    if (options == nullptr) options = &defaults;
    if (keep_c && (c != nullptr || c_capacity != 0)) {
      Fail(grpc::StatusCode::INVALID_ARGUMENT, "c: pass NULL and 0 bytes for a C kept (keep_c)",
           code, errptr);
      return;
    }
    if (SaveStatus(options->args.Check(m, n, k, {a, a_bytes, b, b_bytes},
                                       keep_c ? hgemm::GemmArgs::kCKept : c_capacity),
                   code, errptr)) {
      return;
    }
    hgemm::v1::GemmRequest request;
    hgemm::OperandBytes borrowed;
    options->args.Request(m, n, k, {a, a_bytes, b, b_bytes}, &request,
                          borrow ? &borrowed : nullptr);
    request.set_keep_c_resident(keep_c != 0);
    request.set_c_ttl_seconds(c_ttl_seconds);
    SaveStatus(stream->session->Submit(gemm_id, std::move(request), borrowed,
                                       {static_cast<char*>(c), keep_c ? 0 : c_capacity}),
               code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
}

}  // namespace

void hgemm_stream_submit(hgemm_stream_t* stream, uint64_t gemm_id,
                         const hgemm_gemm_options_t* options, uint32_t m, uint32_t n, uint32_t k,
                         const void* a, size_t a_bytes, const void* b, size_t b_bytes, void* c,
                         size_t c_capacity, unsigned char keep_c, uint32_t c_ttl_seconds, int* code,
                         char** errptr) {
  SubmitToStream(stream, gemm_id, options, m, n, k, a, a_bytes, b, b_bytes, c, c_capacity, keep_c,
                 c_ttl_seconds, /*borrow=*/false, code, errptr);
}

void hgemm_stream_submit_borrowed(hgemm_stream_t* stream, uint64_t gemm_id,
                                  const hgemm_gemm_options_t* options, uint32_t m, uint32_t n,
                                  uint32_t k, const void* a, size_t a_bytes, const void* b,
                                  size_t b_bytes, void* c, size_t c_capacity, unsigned char keep_c,
                                  uint32_t c_ttl_seconds, int* code, char** errptr) {
  SubmitToStream(stream, gemm_id, options, m, n, k, a, a_bytes, b, b_bytes, c, c_capacity, keep_c,
                 c_ttl_seconds, /*borrow=*/true, code, errptr);
}

int hgemm_stream_next(hgemm_stream_t* stream, uint64_t* gemm_id, hgemm_gemm_info_t* info,
                      char** c_handle, hgemm_matrix_info_t* c_info, int* code, char** errptr) {
  try {
    if (c_handle != nullptr) *c_handle = nullptr;
    hgemm::v1::GemmDone done;
    grpc::Status end;
    if (!stream->session->Next(gemm_id, &done, &end)) {
      SaveStatus(end, code, errptr);
      return 0;
    }
    if (SaveStatus(hgemm::StatusOf(done), code, errptr)) return 1;
    if (info != nullptr) {
      hgemm::v1::GemmResponse response;
      *response.mutable_timing() = done.timing();
      *response.mutable_execution() = done.execution();
      response.set_request_id(done.request_id());
      FillInfo(response, true, info);
    }
    if (done.has_c_matrix()) {
      if (c_info != nullptr) *c_info = MatrixInfoOf(done.c_matrix());
      if (c_handle != nullptr) *c_handle = CopyString(done.c_matrix().handle());
    }
    return 1;
  } catch (...) {
    SaveException(code, errptr);
  }
  return 0;
}

void hgemm_stream_close(hgemm_stream_t* stream) { stream->session->Close(); }

void hgemm_stream_cancel(hgemm_stream_t* stream) { stream->session->Cancel(); }

void hgemm_stream_destroy(hgemm_stream_t* stream) { delete stream; }

uint64_t hgemm_release(hgemm_client_t* client, const hgemm_call_options_t* options,
                       const char* handle, int* code, char** errptr) {
  try {
    uint64_t freed = 0;
    // Not idempotent: a second release of a freed matrix says NOT_FOUND.
    if (SaveStatus(Retried(client, CallOptionsOf(client, options), false,
                           [&](const hgemm::CallOptions& call) {
                             return client->client.ReleaseMatrix(handle, call, &freed);
                           }),
                   code, errptr)) {
      return 0;
    }
    return freed;
  } catch (...) {
    SaveException(code, errptr);
  }
  return 0;
}

hgemm_region_t* hgemm_region_create(hgemm_client_t* client, const hgemm_call_options_t* options,
                                    size_t bytes, const char* label, int* code, char** errptr) {
  try {
    if (bytes == 0) {
      Fail(grpc::StatusCode::INVALID_ARGUMENT, "bytes: a region holds at least 1 byte", code,
           errptr);
      return nullptr;
    }
    auto region = std::make_unique<hgemm_region_t>();
    std::string error;
    region->memory = hgemm::SharedRegion::Create(static_cast<int64_t>(bytes), &error);
    if (region->memory == nullptr) {
      Fail(grpc::StatusCode::INTERNAL, error, code, errptr);
      return nullptr;
    }
    hgemm::v1::RegionInfo info;
    // Not retried: a first try that registered would leave a second region behind.
    if (SaveStatus(client->client.RegisterRegion(region->memory->path(), region->memory->bytes(),
                                                 label, &info, CallOptionsOf(client, options)),
                   code, errptr)) {
      return nullptr;
    }
    region->handle = info.region();
    return region.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

const char* hgemm_region_handle(const hgemm_region_t* region) { return region->handle.c_str(); }
void* hgemm_region_data(const hgemm_region_t* region) { return region->memory->data(); }
size_t hgemm_region_bytes(const hgemm_region_t* region) {
  return static_cast<size_t>(region->memory->bytes());
}
void hgemm_region_destroy(hgemm_region_t* region) { delete region; }

void hgemm_unregister_region(hgemm_client_t* client, const hgemm_call_options_t* options,
                             const char* handle, int* code, char** errptr) {
  try {
    SaveStatus(Retried(client, CallOptionsOf(client, options), /*idempotent=*/true,
                       [&](const hgemm::CallOptions& call) {
                         return client->client.UnregisterRegion(handle, call);
                       }),
               code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
}

hgemm_ring_t* hgemm_ring_open(hgemm_client_t* client, const hgemm_call_options_t* options,
                              const char* const* regions, size_t region_count,
                              const char* const* matrices, size_t matrix_count, uint32_t entries,
                              int* code, char** errptr) {
  try {
    if (entries == 0) entries = 64;
    if (entries > hgemm::kRingMaxEntries || (entries & (entries - 1)) != 0) {
      Fail(grpc::StatusCode::INVALID_ARGUMENT,
           fmt::format("entries is {}; a ring takes a power of two up to {}", entries,
                       hgemm::kRingMaxEntries),
           code, errptr);
      return nullptr;
    }
    hgemm::RingClientOptions ring_options;
    ring_options.sq_entries = ring_options.cq_entries = entries;
    ring_options.call = CallOptionsOf(client, options);
    grpc::Status status;
    auto ring = std::make_unique<hgemm_ring_t>();
    ring->client = client;
    ring->ring = hgemm::RingClient::Attach(
        client->client, std::vector<std::string>(regions, regions + region_count),
        std::vector<std::string>(matrices, matrices + matrix_count), ring_options, &status);
    if (SaveStatus(status, code, errptr)) return nullptr;
    return ring.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

namespace {

// hgemm_ring_gemm and hgemm_ring_gemm_keep_c: *kept gets the kept C's handle with keep_c.
void RingGemm(hgemm_ring_t* ring, const hgemm_gemm_options_t* options, uint32_t m, uint32_t n,
              uint32_t k, bool keep_c, hgemm_gemm_info_t* info, std::string* kept, int* code,
              char** errptr) {
  const hgemm_gemm_options_t defaults;
  if (options == nullptr) options = &defaults;
  if (SaveStatus(options->args.CheckRingEntry(m, n, k, keep_c), code, errptr)) return;
  hgemm::v1::GemmRequest request;
  options->args.Request(m, n, k, {}, &request);
  request.set_keep_c_resident(keep_c);
  const hgemm::CallOptions call = CallOptionsOf(ring->client, options->timeout_ms, "");
  hgemm::RingSubmission entry;
  if (SaveStatus(ring->ring->ToSubmission(request, "", call.timeout, &entry), code, errptr)) {
    return;
  }
  hgemm::RingCompletion completion{};
  if (SaveStatus(ring->ring->Gemm(entry, &completion), code, errptr)) return;
  if (info != nullptr) {
    *info = hgemm_gemm_info_t{};
    info->queue_wait_ms = completion.queue_wait_ms;
    info->kernel_ms = completion.kernel_ms;
    info->server_total_ms = completion.server_total_ms;
    info->tflops = completion.tflops;
  }
  if (keep_c) *kept = hgemm::RingClient::KeptHandle(completion);
}

}  // namespace

void hgemm_ring_gemm(hgemm_ring_t* ring, const hgemm_gemm_options_t* options, uint32_t m,
                     uint32_t n, uint32_t k, hgemm_gemm_info_t* info, int* code, char** errptr) {
  try {
    RingGemm(ring, options, m, n, k, /*keep_c=*/false, info, nullptr, code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
}

char* hgemm_ring_gemm_keep_c(hgemm_ring_t* ring, const hgemm_gemm_options_t* options, uint32_t m,
                             uint32_t n, uint32_t k, hgemm_gemm_info_t* info, int* code,
                             char** errptr) {
  try {
    std::string kept;
    RingGemm(ring, options, m, n, k, /*keep_c=*/true, info, &kept, code, errptr);
    return kept.empty() ? nullptr : CopyString(kept);
  } catch (...) {
    SaveException(code, errptr);
    return nullptr;
  }
}

void hgemm_ring_bind(hgemm_ring_t* ring, const char* const* regions, size_t region_count,
                     const char* const* matrices, size_t matrix_count, int* code, char** errptr) {
  try {
    SaveStatus(ring->ring->Bind(std::vector<std::string>(regions, regions + region_count),
                                std::vector<std::string>(matrices, matrices + matrix_count)),
               code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
}

void hgemm_ring_drain(hgemm_ring_t* ring, int* code, char** errptr) {
  try {
    SaveStatus(ring->ring->Drain(), code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
}

const char* hgemm_ring_region(const hgemm_ring_t* ring) { return ring->ring->region().c_str(); }
void hgemm_ring_close(hgemm_ring_t* ring) { delete ring; }

hgemm_region_list_t* hgemm_list_regions(hgemm_client_t* client, const hgemm_call_options_t* options,
                                        int* code, char** errptr) {
  try {
    auto list = std::make_unique<hgemm_region_list_t>();
    if (SaveStatus(Retried(client, CallOptionsOf(client, options), /*idempotent=*/true,
                           [&](const hgemm::CallOptions& call) {
                             return client->client.ListRegions(&list->proto, call);
                           }),
                   code, errptr)) {
      return nullptr;
    }
    return list.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

void hgemm_region_list_destroy(hgemm_region_list_t* list) { delete list; }
size_t hgemm_region_list_size(const hgemm_region_list_t* list) {
  return static_cast<size_t>(list->proto.regions_size());
}
uint64_t hgemm_region_list_client_bytes(const hgemm_region_list_t* list) {
  return list->proto.client_bytes();
}
uint64_t hgemm_region_list_quota_bytes(const hgemm_region_list_t* list) {
  return list->proto.quota_bytes();
}
uint32_t hgemm_region_list_quota_regions(const hgemm_region_list_t* list) {
  return list->proto.quota_regions();
}
void hgemm_region_list_info(const hgemm_region_list_t* list, size_t i, hgemm_region_info_t* info) {
  const hgemm::v1::RegionInfo& r = list->proto.regions(static_cast<int>(i));
  *info = hgemm_region_info_t{};
  CopyInto(info->region, r.region());
  info->byte_size = r.byte_size();
  CopyInto(info->label, r.label());
  info->age_seconds = r.age_seconds();
  info->idle_seconds = r.idle_seconds();
  info->ttl_seconds = r.ttl_seconds();
  info->in_use = r.in_use();
  info->dma = r.dma() ? 1 : 0;
  info->cuda_ipc = r.cuda_ipc() ? 1 : 0;
  info->device_id = r.device_id();
}

hgemm_server_info_t* hgemm_server_info(hgemm_client_t* client, const hgemm_call_options_t* options,
                                       int* code, char** errptr) {
  try {
    auto info = std::make_unique<hgemm_server_info_t>();
    if (SaveStatus(Retried(client, CallOptionsOf(client, options), true,
                           [&](const hgemm::CallOptions& call) {
                             return client->client.GetServerInfo(&info->proto, call);
                           }),
                   code, errptr)) {
      return nullptr;
    }
    return info.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

void hgemm_server_info_destroy(hgemm_server_info_t* info) { delete info; }
const char* hgemm_server_info_version(const hgemm_server_info_t* info) {
  return info->proto.version().c_str();
}
const char* hgemm_server_info_backend(const hgemm_server_info_t* info) {
  return info->proto.backend().c_str();
}
const char* hgemm_server_info_replica(const hgemm_server_info_t* info) {
  return info->proto.replica().c_str();
}
int hgemm_server_info_device_count(const hgemm_server_info_t* info) {
  return info->proto.devices_size();
}
const char* hgemm_server_info_device_name(const hgemm_server_info_t* info, int i) {
  return info->proto.devices(i).name().c_str();
}
uint64_t hgemm_server_info_device_memory_bytes(const hgemm_server_info_t* info, int i) {
  return info->proto.devices(i).memory_bytes();
}
uint64_t hgemm_server_info_max_message_bytes(const hgemm_server_info_t* info) {
  return info->proto.limits().max_message_bytes();
}
uint64_t hgemm_server_info_max_elements_per_matrix(const hgemm_server_info_t* info) {
  return info->proto.limits().max_elements_per_matrix();
}

}  // extern "C"

namespace {

// One retried RPC whose answer goes back as proto3 JSON: `rpc(&answer, call)`.
template <typename Answer, typename Rpc>
char* JsonOfCall(hgemm_client_t* client, const hgemm_call_options_t* options, int* code,
                 char** errptr, Rpc rpc) {
  try {
    Answer answer;
    if (SaveStatus(Retried(client, CallOptionsOf(client, options), true,
                           [&](const hgemm::CallOptions& call) { return rpc(&answer, call); }),
                   code, errptr)) {
      return nullptr;
    }
    return JsonOf(answer, code, errptr);
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

}  // namespace

char* hgemm_server_info_json(hgemm_client_t* client, const hgemm_call_options_t* options, int* code,
                             char** errptr) {
  return JsonOfCall<hgemm::v1::ServerInfo>(client, options, code, errptr,
                                           [client](auto* info, const hgemm::CallOptions& call) {
                                             return client->client.GetServerInfo(info, call);
                                           });
}

char* hgemm_list_kernels_json(hgemm_client_t* client, const hgemm_call_options_t* options,
                              int* code, char** errptr) {
  return JsonOfCall<hgemm::v1::ListKernelsResponse>(
      client, options, code, errptr, [client](auto* kernels, const hgemm::CallOptions& call) {
        return client->client.ListKernels(kernels, call);
      });
}

// Calls that do not block (revision 7).
namespace {

// Queues make_run() (the call's work, filling its result) on the client's completion threads
// and returns its handle; NULL (done never runs) with *code / *errptr when it cannot be queued.
template <typename MakeRun>
hgemm_call_t* StartCall(hgemm_client_t* client, hgemm_done_fn done, void* user_data, int* code,
                        char** errptr, MakeRun make_run,
                        std::function<void()> interrupt = nullptr) {
  try {
    // Freed with the call's functions, once done has returned.
    auto result = std::make_shared<hgemm_result_t>();
    auto run = [result, work = make_run()] {
      try {
        work(result.get());
      } catch (...) {
        SaveException(&result->code, &result->error);
      }
    };
    auto report = [result, done, user_data](const grpc::Status& skipped) {
      if (!skipped.ok()) SaveStatus(skipped, &result->code, &result->error);
      done(user_data, result.get());
    };
    auto call = std::make_shared<hgemm::QueuedCall>(std::move(run), std::move(report),
                                                    std::move(interrupt));
    auto handle = std::make_unique<hgemm_call_t>();
    handle->started = call;
    client->completions.Add(std::move(call));
    *code = HGEMM_OK;
    return handle.release();
  } catch (...) {
    SaveException(code, errptr);
  }
  return nullptr;
}

// Options copied for a call that runs later (NULL stays NULL).
template <typename Options>
std::optional<Options> CopyOf(const Options* options) {
  return options == nullptr ? std::nullopt : std::optional<Options>(*options);
}
template <typename Options>
const Options* PointerTo(const std::optional<Options>& options) {
  return options ? &*options : nullptr;
}

}  // namespace

extern "C" {

int hgemm_result_code(const hgemm_result_t* result, const char** message) {
  if (message != nullptr) *message = result->error == nullptr ? "" : result->error;
  return result->code;
}
uint64_t hgemm_result_value(const hgemm_result_t* result) { return result->value; }
uint64_t hgemm_result_gemm_id(const hgemm_result_t* result) { return result->gemm_id; }
char* hgemm_result_take_string(hgemm_result_t* result) {
  return std::exchange(result->string, nullptr);
}
hgemm_matrix_list_t* hgemm_result_take_matrix_list(hgemm_result_t* result) {
  return std::exchange(result->matrix_list, nullptr);
}
hgemm_region_list_t* hgemm_result_take_region_list(hgemm_result_t* result) {
  return std::exchange(result->region_list, nullptr);
}
hgemm_region_t* hgemm_result_take_region(hgemm_result_t* result) {
  return std::exchange(result->region, nullptr);
}
void hgemm_result_gemm_info(const hgemm_result_t* result, hgemm_gemm_info_t* info) {
  *info = result->gemm_info;
}
void hgemm_result_matrix_info(const hgemm_result_t* result, hgemm_matrix_info_t* info) {
  *info = result->matrix_info;
}

hgemm_call_t* hgemm_gemm_start(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                               uint32_t m, uint32_t n, uint32_t k, const void* a, size_t a_bytes,
                               const void* b, size_t b_bytes, void* c, size_t c_capacity,
                               hgemm_done_fn done, void* user_data, int* code, char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      hgemm_gemm(client, PointerTo(options), m, n, k, a, a_bytes, b, b_bytes, c, c_capacity,
                 &r->gemm_info, &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_gemm_grouped_start(hgemm_client_t* client, const hgemm_gemm_options_t* options,
                                       const hgemm_group_problem_t* problems, size_t count,
                                       hgemm_done_fn done, void* user_data, int* code,
                                       char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      hgemm_gemm_grouped(client, PointerTo(options), problems, count, &r->gemm_info, &r->code,
                         &r->error);
    };
  });
}

hgemm_call_t* hgemm_gemm_many_start(hgemm_client_t* client, hgemm_batch_t* batch,
                                    const hgemm_call_options_t* options, const size_t* indices,
                                    size_t count, hgemm_done_fn done, void* user_data, int* code,
                                    char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    std::optional<std::vector<size_t>> sent;
    if (indices != nullptr) sent.emplace(indices, indices + count);
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      hgemm_gemm_many(client, batch, PointerTo(options), sent ? sent->data() : nullptr, count,
                      &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_upload_start(hgemm_client_t* client, const hgemm_call_options_t* options,
                                 uint32_t rows, uint32_t cols, int dtype, int device_id,
                                 const void* data, size_t data_bytes, uint32_t ttl_seconds,
                                 const char* label, hgemm_done_fn done, void* user_data, int* code,
                                 char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options), label = std::string(label)](hgemm_result_t* r) {
      r->string = hgemm_upload_typed(client, PointerTo(options), rows, cols, dtype, device_id, data,
                                     data_bytes, ttl_seconds, label.c_str(), &r->matrix_info,
                                     &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_download_start(hgemm_client_t* client, const hgemm_call_options_t* options,
                                   const char* handle, uint64_t offset, uint64_t length, void* into,
                                   size_t capacity, hgemm_done_fn done, void* user_data, int* code,
                                   char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options), handle = std::string(handle)](hgemm_result_t* r) {
      r->value = hgemm_download(client, PointerTo(options), handle.c_str(), offset, length, into,
                                capacity, &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_release_start(hgemm_client_t* client, const hgemm_call_options_t* options,
                                  const char* handle, hgemm_done_fn done, void* user_data,
                                  int* code, char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options), handle = std::string(handle)](hgemm_result_t* r) {
      r->value = hgemm_release(client, PointerTo(options), handle.c_str(), &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_list_matrices_start(hgemm_client_t* client, const hgemm_call_options_t* options,
                                        hgemm_done_fn done, void* user_data, int* code,
                                        char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      r->matrix_list = hgemm_list_matrices(client, PointerTo(options), &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_list_regions_start(hgemm_client_t* client, const hgemm_call_options_t* options,
                                       hgemm_done_fn done, void* user_data, int* code,
                                       char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      r->region_list = hgemm_list_regions(client, PointerTo(options), &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_server_info_json_start(hgemm_client_t* client,
                                           const hgemm_call_options_t* options, hgemm_done_fn done,
                                           void* user_data, int* code, char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      r->string = hgemm_server_info_json(client, PointerTo(options), &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_list_kernels_json_start(hgemm_client_t* client,
                                            const hgemm_call_options_t* options, hgemm_done_fn done,
                                            void* user_data, int* code, char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      r->string = hgemm_list_kernels_json(client, PointerTo(options), &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_region_create_start(hgemm_client_t* client, const hgemm_call_options_t* options,
                                        size_t bytes, const char* label, hgemm_done_fn done,
                                        void* user_data, int* code, char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options), label = std::string(label)](hgemm_result_t* r) {
      r->region = hgemm_region_create(client, PointerTo(options), bytes, label.c_str(), &r->code,
                                      &r->error);
    };
  });
}

hgemm_call_t* hgemm_unregister_region_start(hgemm_client_t* client,
                                            const hgemm_call_options_t* options, const char* handle,
                                            hgemm_done_fn done, void* user_data, int* code,
                                            char** errptr) {
  return StartCall(client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options), handle = std::string(handle)](hgemm_result_t* r) {
      hgemm_unregister_region(client, PointerTo(options), handle.c_str(), &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_ring_gemm_start(hgemm_ring_t* ring, const hgemm_gemm_options_t* options,
                                    uint32_t m, uint32_t n, uint32_t k, hgemm_done_fn done,
                                    void* user_data, int* code, char** errptr) {
  return StartCall(ring->client, done, user_data, code, errptr, [&] {
    return [=, options = CopyOf(options)](hgemm_result_t* r) {
      hgemm_ring_gemm(ring, PointerTo(options), m, n, k, &r->gemm_info, &r->code, &r->error);
    };
  });
}

hgemm_call_t* hgemm_stream_next_start(hgemm_client_t* client, hgemm_stream_t* stream,
                                      hgemm_done_fn done, void* user_data, int* code,
                                      char** errptr) {
  return StartCall(
      client, done, user_data, code, errptr,
      [&] {
        return [=](hgemm_result_t* r) {
          r->value = hgemm_stream_next(stream, &r->gemm_id, &r->gemm_info, &r->string,
                                       &r->matrix_info, &r->code, &r->error);
        };
      },
      [stream] { hgemm_stream_cancel(stream); });
}

}  // extern "C"
