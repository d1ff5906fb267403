// GemmClient's core (client/gemm_client.h): Connect, the routes to the target and the replicas,
// the unary calls (Gemm, GemmInPlace, GemmGrouped, GemmAsync) and Run's choice among unary,
// streamed and parallel parts. Streams are in gemm_stream.cc, parallel parts and the bulk channel
// in gemm_parts.cc, resident matrices and regions in gemm_resident.cc.
#include "client/gemm_client.h"

#include <fmt/format.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <utility>

#include "client/error_details.h"
#include "client/gemm_client_internal.h"
#include "proto/handle.h"

namespace hgemm {
namespace {

// GemmInPlace's messages: a GemmRequest whose a and b fields are appended as slices of the
// caller's memory, and a GemmResponse whose c field is read straight into the caller's buffer.
// Protobuf's wire format allows fields in any order, so the bytes are Gemm's.
struct InPlaceRequest {
  const v1::GemmRequest* rest;
  OperandBytes operands;
};
struct InPlaceResponse {
  v1::GemmResponse* rest;
  CBuffer c_into;
  size_t c_expected = 0;
  bool c_seen = false;
  // Why the response could not be taken. Kept here: a failed Deserialize reaches the caller
  // as UNIMPLEMENTED "No message returned for unary request".
  grpc::Status error;
};

constexpr int kGemmRequestA = v1::GemmRequest::kAFieldNumber;
constexpr int kGemmRequestB = v1::GemmRequest::kBFieldNumber;
constexpr int kGemmResponseC = v1::GemmResponse::kCFieldNumber;

}  // namespace
}  // namespace hgemm

namespace grpc {

template <>
class SerializationTraits<hgemm::InPlaceRequest, void> {
 public:
  static Status Serialize(const hgemm::InPlaceRequest& message, ByteBuffer* buffer,
                          bool* own_buffer) {
    using google::protobuf::internal::WireFormatLite;
    std::vector<Slice> slices;
    slices.emplace_back(message.rest->SerializeAsString());
    auto append = [&](int field, const void* data, size_t bytes) {
      if (data == nullptr) return;
      uint8_t key[16];
      uint8_t* end = google::protobuf::io::CodedOutputStream::WriteTagToArray(
          WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), key);
      end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(bytes, end);
      slices.emplace_back(key, size_t(end - key));
      if (bytes > 0) slices.emplace_back(data, bytes, Slice::STATIC_SLICE);  // no copy
    };
    append(hgemm::kGemmRequestA, message.operands.a, message.operands.a_bytes);
    append(hgemm::kGemmRequestB, message.operands.b, message.operands.b_bytes);
    ByteBuffer composed(slices.data(), slices.size());
    buffer->Swap(&composed);
    *own_buffer = true;
    return Status::OK;
  }
};

template <>
class SerializationTraits<hgemm::InPlaceResponse, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer, hgemm::InPlaceResponse* message) {
    using google::protobuf::internal::WireFormatLite;
    Status status = Status::OK;
    {
      ProtoBufferReader reader(buffer);
      google::protobuf::io::CodedInputStream input(&reader);
      input.SetTotalBytesLimit(INT_MAX);
      std::string rest;
      {
        google::protobuf::io::StringOutputStream rest_stream(&rest);
        google::protobuf::io::CodedOutputStream rest_out(&rest_stream);
        while (const uint32_t tag = input.ReadTag()) {
          if (tag == WireFormatLite::MakeTag(hgemm::kGemmResponseC,
                                             WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
            uint64_t bytes = 0;
            if (!input.ReadVarint64(&bytes)) break;
            if (bytes != message->c_expected || bytes > message->c_into.capacity) {
              status = Status(StatusCode::INTERNAL,
                              fmt::format("the server sent {} bytes of C; {} were expected and "
                                          "the buffer holds {}",
                                          bytes, message->c_expected, message->c_into.capacity));
              break;
            }
            if (!input.ReadRaw(message->c_into.data, int(bytes))) break;
            message->c_seen = true;
          } else if (!WireFormatLite::SkipField(&input, tag, &rest_out)) {
            break;
          }
        }
      }
      if (status.ok() &&
          (!input.ConsumedEntireMessage() || !message->rest->ParseFromString(rest))) {
        status = Status(StatusCode::INTERNAL, "the Gemm response did not parse");
      } else if (status.ok() && !message->c_seen && message->c_expected > 0) {
        status = Status(
            StatusCode::INTERNAL,
            fmt::format("the server sent no C; {} bytes were expected", message->c_expected));
      }
    }
    buffer->Clear();
    message->error = status;
    return Status::OK;
  }
};

}  // namespace grpc

namespace hgemm {

using client_internal::ApplyDeadline;
using client_internal::ExplainUnreachable;

namespace {

// GemmService.Gemm as the generated stub names it, for calls with GemmInPlace's messages.
const grpc::internal::RpcMethod& GemmMethod() {
  static const client_internal::ServiceMethod method("Gemm", grpc::internal::RpcMethod::NORMAL_RPC);
  return method.get();
}

// Bytes of C a Gemm answer carries, which GemmInPlace's response expects: none when C stays on
// the server or goes to a region.
size_t ReturnedCBytes(const v1::GemmRequest& request) {
  if (request.keep_c_resident() || request.has_c_region()) return 0;
  return size_t(GemmClient::ResultBytes(request));
}

// "" for an empty path, else the file's contents.
std::string ReadPem(const char* option, const std::string& path) {
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream pem;
  if (in) pem << in.rdbuf();
  if (!in || in.bad()) {
    throw std::runtime_error(
        fmt::format("{} {}: cannot read: {}", option, path, std::strerror(errno)));
  }
  return std::move(pem).str();
}

// Adds the authorization metadata to every call of the channel.
class BearerToken final : public grpc::experimental::Interceptor {
 public:
  explicit BearerToken(const std::string& value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", value_);
    }
    methods->Proceed();
  }

 private:
  const std::string& value_;  // the factory's, which the channel keeps
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(std::string value) : value_(std::move(value)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerToken(value_);
  }

 private:
  const std::string value_;
};

}  // namespace

namespace client_internal {

void ApplyDeadline(const CallOptions& options, grpc::ClientContext* context) {
  if (options.timeout.count() > 0) {
    context->set_deadline(std::chrono::system_clock::now() + options.timeout);
  }
  if (!options.client_id.empty()) context->AddMetadata("x-client-id", options.client_id);
  if (!options.traceparent.empty()) context->AddMetadata("traceparent", options.traceparent);
}

grpc::Status ExplainUnreachable(grpc::Status status, const std::string& replica,
                                grpc::Channel* channel) {
  if (replica.empty() || status.error_code() != grpc::StatusCode::UNAVAILABLE ||
      !ErrorDetailsOf(status).domain.empty() ||
      channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
    return status;  // a replica that answered (e.g. its queue is full) speaks for itself
  }
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      fmt::format("replica {} cannot be reached ({}): if it is gone, the resident matrices it "
                  "held went with it; upload them again",
                  replica, status.error_message()));
}

}  // namespace client_internal

std::shared_ptr<grpc::Channel> Connect(const std::string& target, const ConnectOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (options.private_subchannels) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  ApplyGrpcArgs(options.grpc_args, &args);
  // Calls spread over every address of the target (the replicas), not the first alone.
  args.SetLoadBalancingPolicyName("round_robin");
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  // The server's unix: listeners are plaintext (the kernel names the peer there); TLS is for
  // TCP. Tokens go either way.
  if (options.UsesTls() && target.rfind("unix:", 0) != 0) {
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      throw std::runtime_error(
          "tls_cert and tls_key go together (the client's certificate and key)");
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadPem("tls_ca", options.tls_ca);
    ssl.pem_cert_chain = ReadPem("tls_cert", options.tls_cert);
    ssl.pem_private_key = ReadPem("tls_key", options.tls_key);
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenFactory>("Bearer " + options.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

GemmClient::GemmClient(const std::string& target, const ConnectOptions& options)
    : routes_(std::make_shared<Routes>(Connect(target, options), options, target)) {}

GemmClient::GemmClient(std::shared_ptr<grpc::Channel> channel, const ConnectOptions& options)
    : routes_(std::make_shared<Routes>(std::move(channel), options, "")) {}

std::string GemmClient::ReplicaOf(const std::string& handle) {
  return std::string(HandleReplica(handle));
}

grpc::Status GemmClient::ReplicaOf(const v1::GemmRequest& request, std::string* replica) {
  const std::string a = ReplicaOf(request.a_handle()), b = ReplicaOf(request.b_handle());
  if (!a.empty() && !b.empty() && a != b) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        fmt::format("a_handle {} lives on replica {} and b_handle {} on replica {}: one GEMM "
                    "runs on one replica; upload B where A lives (CallOptions::replica)",
                    request.a_handle(), a, request.b_handle(), b));
  }
  *replica = a.empty() ? b : a;
  return grpc::Status::OK;
}

std::shared_ptr<grpc::Channel> GemmClient::ChannelTo(const std::string& replica) const {
  return RouteTo(replica).channel;
}

GemmClient::Route GemmClient::RouteTo(const std::string& replica) const {
  if (replica.empty()) return routes_->target;
  std::lock_guard<std::mutex> lock(routes_->mu);
  auto [it, added] = routes_->replicas.try_emplace(replica);
  if (added) {
    it->second.replica = replica;
    it->second.channel = Connect(replica, routes_->connect);
    it->second.stub = v1::GemmService::NewStub(it->second.channel);
  }
  return it->second;
}

GemmClient::Route GemmClient::RouteFor(const std::string& handle,
                                       const CallOptions& options) const {
  const std::string replica = ReplicaOf(handle);
  return RouteTo(replica.empty() ? options.replica : replica);
}

grpc::Status GemmClient::RouteOf(const v1::GemmRequest& request, const CallOptions& options,
                                 Route* route) const {
  std::string replica;
  if (grpc::Status s = ReplicaOf(request, &replica); !s.ok()) return s;
  *route = RouteTo(replica.empty() ? options.replica : replica);
  return grpc::Status::OK;
}

grpc::Status GemmClient::Gemm(const v1::GemmRequest& request, v1::GemmResponse* response,
                              const CallOptions& options) const {
  Route route;
  if (grpc::Status s = RouteOf(request, options, &route); !s.ok()) return s;
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  return ExplainUnreachable(route.stub->Gemm(&context, request, response), route.replica,
                            route.channel.get());
}

grpc::Status GemmClient::GemmInPlace(const v1::GemmRequest& request, OperandBytes operands,
                                     CBuffer c_into, v1::GemmResponse* response,
                                     const CallOptions& options) const {
  Route route;
  if (grpc::Status s = RouteOf(request, options, &route); !s.ok()) return s;
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  InPlaceResponse in_place{response, c_into, ReturnedCBytes(request)};
  const grpc::Status status = grpc::internal::BlockingUnaryCall(
      route.channel.get(), GemmMethod(), &context, InPlaceRequest{&request, operands}, &in_place);
  if (status.ok()) return in_place.error;
  return ExplainUnreachable(status, route.replica, route.channel.get());
}

void GemmClient::GemmAsync(v1::GemmRequest request, OperandBytes operands, bool streamed,
                           CBuffer c_into, const CallOptions& options,
                           std::shared_ptr<grpc::ClientContext> context, GemmDone done) const {
  std::string replica;
  if (grpc::Status s = ReplicaOf(request, &replica); !s.ok()) {
    done(s, v1::GemmResponse());
    return;
  }
  const Route route = RouteTo(replica.empty() ? options.replica : replica);
  ApplyDeadline(options, context.get());
  if (streamed) {  // the chunks are cut from the request's operands
    if (operands.a != nullptr) request.set_a(operands.a, operands.a_bytes);
    if (operands.b != nullptr) request.set_b(operands.b, operands.b_bytes);
    client_internal::StartStreamedGemm(std::move(request), c_into, options.chunk_bytes, context,
                                       route.replica, route.channel.get(), std::move(done));
    return;
  }
  // What the call uses lives with the callback, which gRPC keeps until it has run; `done` is
  // destroyed last (as in gemm_stream.cc's AsyncStreamedGemm). The channel is the client's (no
  // reference here). A and B leave from the caller's memory and C lands in c_into, as in
  // GemmInPlace.
  struct Unary {
    GemmDone done;
    std::shared_ptr<grpc::ClientContext> context;
    v1::GemmRequest request;
    v1::GemmResponse response;
    InPlaceRequest in_place_request;
    InPlaceResponse in_place_response;
  };
  auto unary = std::make_shared<Unary>(
      Unary{std::move(done), std::move(context), std::move(request), v1::GemmResponse()});
  unary->in_place_request = {&unary->request, operands};
  unary->in_place_response = {&unary->response, c_into, ReturnedCBytes(unary->request)};
  grpc::internal::CallbackUnaryCall(
      route.channel.get(), GemmMethod(), unary->context.get(), &unary->in_place_request,
      &unary->in_place_response,
      [unary, replica = route.replica, channel = route.channel.get()](grpc::Status status) {
        if (status.ok()) status = unary->in_place_response.error;
        unary->done(ExplainUnreachable(status, replica, channel), std::move(unary->response));
      });
}

bool GemmClient::ShouldStream(const v1::GemmRequest& request, const CallOptions& options,
                              const OperandBytes& detached) {
  if (request.group_size() > 0) return false;  // GemmStream takes no groups
  // A C kept on the server does not travel back.
  const int64_t c_bytes = request.keep_c_resident() ? 0 : ResultBytes(request);
  return int64_t(request.a().size() + request.b().size() + request.c_in().size() +
                 detached.a_bytes + detached.b_bytes) > options.unary_limit_bytes ||
         c_bytes > options.unary_limit_bytes;
}

grpc::Status GemmClient::Run(const v1::GemmRequest& request, v1::GemmResponse* response,
                             const CallOptions& options) const {
  struct Counted {
    explicit Counted(std::atomic<int>& count) : count(count), now(++count) {}
    ~Counted() { --count; }
    std::atomic<int>& count;
    const int now;
  } in_flight(routes_->gemms_in_flight);
  CallOptions shared = options;
  shared.parallel_parts = PartsFor(options.parallel_parts, in_flight.now);
  if (ShouldSendParts(request, shared)) {
    grpc::Status s = RunParts(request, response, shared);
    // A server from before parallel parts: the old way.
    if (s.error_code() != grpc::StatusCode::UNIMPLEMENTED) return s;
  }
  if (!ShouldStream(request, options)) return Gemm(request, response, options);
  std::vector<StreamedGemm> results;
  grpc::Status status = GemmStream({&request}, &results, options);
  if (!status.ok()) return status;
  *response = std::move(results[0].response);
  return results[0].status;
}

int64_t GemmClient::ResultBytes(const v1::GemmRequest& request) {
  const int64_t element_bytes = request.c_dtype() == v1::DATA_TYPE_FP32 ? 4 : 2;
  if (request.group_size() == 0) {
    return element_bytes * int64_t(request.m()) * request.n() *
           std::max<int64_t>(request.batch(), 1);
  }
  int64_t bytes = 0;
  for (const v1::GroupedProblem& p : request.group()) {
    bytes += element_bytes * int64_t(p.m()) * p.n();
  }
  return bytes;
}

grpc::Status GemmClient::GemmGrouped(const v1::GemmRequest& form,
                                     const std::vector<GroupedOperands>& problems,
                                     std::vector<std::string>* c, v1::GemmResponse* response,
                                     const CallOptions& options) const {
  if (problems.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "problems: a grouped GEMM needs at least one problem");
  }
  v1::GemmRequest request;
  request.set_transpose_a(form.transpose_a());
  request.set_transpose_b(form.transpose_b());
  request.set_dtype(form.dtype());
  request.set_c_dtype(form.c_dtype());
  if (form.has_alpha()) request.set_alpha(form.alpha());
  request.set_beta(form.beta());
  *request.mutable_options() = form.options();
  const uint64_t c_element_bytes = form.c_dtype() == v1::DATA_TYPE_FP32 ? 4 : 2;
  for (size_t i = 0; i < problems.size(); ++i) {
    const GroupedOperands& p = problems[i];
    // uint64 products of uint32 dimensions: exact.
    for (auto [name, have, want] :
         {std::tuple{"a", p.a.size(), 2 * uint64_t(p.m) * p.k},
          std::tuple{"b", p.b.size(), 2 * uint64_t(p.k) * p.n},
          std::tuple{"c_in", p.c_in.size(), c_element_bytes * p.m * p.n}}) {
      if (std::string_view(name) == "c_in" && form.beta() == 0) continue;  // never read
      if (have != want) {
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("problems[{}].{}: {} bytes; problem {}x{}x{} (m x n x k) takes {}", i, name,
                        have, p.m, p.n, p.k, want));
      }
    }
    v1::GroupedProblem* dims = request.add_group();
    dims->set_m(p.m);
    dims->set_n(p.n);
    dims->set_k(p.k);
    request.mutable_a()->append(p.a);
    request.mutable_b()->append(p.b);
    if (form.beta() != 0) request.mutable_c_in()->append(p.c_in);
  }
  v1::GemmResponse answer;
  grpc::Status s = Gemm(request, &answer, options);
  if (!s.ok()) return s;
  if (int64_t(answer.c().size()) != ResultBytes(request)) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        fmt::format("the server sent {} bytes of C; the group's C takes {} (a "
                                    "server from before grouped GEMMs?)",
                                    answer.c().size(), ResultBytes(request)));
  }
  c->clear();
  size_t offset = 0;
  for (const GroupedOperands& p : problems) {
    const size_t bytes = c_element_bytes * p.m * p.n;
    c->push_back(answer.c().substr(offset, bytes));
    offset += bytes;
  }
  if (response != nullptr) {
    answer.clear_c();
    *response = std::move(answer);
  }
  return grpc::Status::OK;
}

grpc::Status GemmClient::ListKernels(v1::ListKernelsResponse* response,
                                     const CallOptions& options) const {
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  return RouteTo(options.replica).stub->ListKernels(&context, v1::ListKernelsRequest(), response);
}

grpc::Status GemmClient::GetServerInfo(v1::ServerInfo* response, const CallOptions& options) const {
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  return RouteTo(options.replica)
      .stub->GetServerInfo(&context, v1::GetServerInfoRequest(), response);
}

}  // namespace hgemm
