#include "client/gemm_client.h"

#include <fmt/format.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/support/sync_stream.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "client/error_details.h"
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

// StreamAnswer's reading of a GemmStreamResponse from `input`: a chunk's data straight into
// C's buffer. False if the bytes do not parse; a chunk that cannot be written sets
// answer->problem and is skipped. gemm_id and offset are 0 until their fields come (proto3
// leaves out zeros); one that comes after the data it places, a second chunk, done or data
// field, is a problem.
bool ReadStreamAnswer(google::protobuf::io::CodedInputStream* input, StreamAnswer* answer) {
  using google::protobuf::internal::WireFormatLite;
  constexpr auto kVarint = WireFormatLite::WIRETYPE_VARINT;
  constexpr auto kBytes = WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  const auto not_in_flight = [&] {
    answer->problem =
        fmt::format("the server answered gemm_id {}, which is not in flight", answer->gemm_id);
  };
  const auto out_of_order = [&] {
    answer->problem =
        "a GemmStream answer is not in the form protobuf writes (gemm_id, then one chunk: offset, "
        "then data; or one done)";
    return true;
  };
  while (const uint32_t tag = input->ReadTag()) {
    if (tag == WireFormatLite::MakeTag(v1::GemmStreamResponse::kGemmIdFieldNumber, kVarint)) {
      if (answer->has_chunk) return out_of_order();
      if (!input->ReadVarint64(&answer->gemm_id)) return false;
    } else if (tag == WireFormatLite::MakeTag(v1::GemmStreamResponse::kDoneFieldNumber, kBytes)) {
      if (answer->has_chunk || answer->has_done) return out_of_order();
      std::string bytes;
      uint32_t length = 0;
      if (!input->ReadVarint32(&length) || !input->ReadString(&bytes, int(length)) ||
          !answer->done.ParseFromString(bytes)) {
        return false;
      }
      answer->has_done = true;
    } else if (tag == WireFormatLite::MakeTag(v1::GemmStreamResponse::kChunkFieldNumber, kBytes)) {
      if (answer->has_chunk || answer->has_done) return out_of_order();
      uint32_t length = 0;
      if (!input->ReadVarint32(&length) || length > INT_MAX) return false;
      const auto limit = input->PushLimit(int(length));
      uint64_t offset = 0;
      bool data_seen = false;
      while (const uint32_t chunk_tag = input->ReadTag()) {
        if (chunk_tag == WireFormatLite::MakeTag(v1::ResultChunk::kOffsetFieldNumber, kVarint)) {
          if (data_seen) return out_of_order();
          if (!input->ReadVarint64(&offset)) return false;
        } else if (chunk_tag == WireFormatLite::MakeTag(v1::ResultChunk::kDataFieldNumber, kBytes)) {
          if (data_seen) return out_of_order();
          uint32_t bytes = 0;
          if (!input->ReadVarint32(&bytes) || bytes > INT_MAX) return false;
          data_seen = true;
          CBuffer c;
          if (!answer->c_of || !answer->c_of(answer->gemm_id, &c)) {
            not_in_flight();
          } else if (offset > c.capacity || bytes > c.capacity - offset) {
            answer->problem = fmt::format("gemm_id {}: result chunk past the end of C's {} bytes",
                                          answer->gemm_id, c.capacity);
          } else {
            if (!input->ReadRaw(c.data + offset, int(bytes))) return false;
            continue;
          }
          if (!input->Skip(int(bytes))) return false;
        } else if (!WireFormatLite::SkipField(input, chunk_tag)) {
          return false;
        }
      }
      // At the chunk's end, not at the input's: a chunk cut short does not parse.
      if (!input->ConsumedEntireMessage() || input->BytesUntilLimit() != 0) return false;
      input->PopLimit(limit);
      answer->has_chunk = true;
    } else if (!WireFormatLite::SkipField(input, tag)) {
      return false;
    }
  }
  // A done's gemm_id may come after it: its GEMM is looked up once the answer is read.
  CBuffer c;
  if (answer->has_done && (!answer->c_of || !answer->c_of(answer->gemm_id, &c))) not_in_flight();
  return true;
}

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
      if (status.ok() && (!input.ConsumedEntireMessage() || !message->rest->ParseFromString(rest))) {
        status = Status(StatusCode::INTERNAL, "the Gemm response did not parse");
      } else if (status.ok() && !message->c_seen && message->c_expected > 0) {
        status = Status(StatusCode::INTERNAL,
                        fmt::format("the server sent no C; {} bytes were expected",
                                    message->c_expected));
      }
    }
    buffer->Clear();
    message->error = status;
    return Status::OK;
  }
};

Status SerializationTraits<hgemm::StreamAnswer, void>::Deserialize(ByteBuffer* buffer,
                                                                   hgemm::StreamAnswer* answer) {
  answer->gemm_id = 0;
  answer->has_chunk = answer->has_done = false;
  answer->done.Clear();
  answer->problem.clear();
  {
    ProtoBufferReader reader(buffer);
    google::protobuf::io::CodedInputStream input(&reader);
    input.SetTotalBytesLimit(INT_MAX);
    if (!hgemm::ReadStreamAnswer(&input, answer) ||
        (answer->problem.empty() && !input.ConsumedEntireMessage())) {
      answer->has_chunk = answer->has_done = false;
      answer->problem = "a GemmStream answer did not parse";
    }
  }
  buffer->Clear();
  return Status::OK;
}

}  // namespace grpc

namespace hgemm {
namespace {

// GemmService.Gemm as the generated stub names it, for calls with GemmInPlace's messages.
const grpc::internal::RpcMethod& GemmMethod() {
  static const std::string name = std::string("/") + v1::GemmService::service_full_name() + "/Gemm";
  static const grpc::internal::RpcMethod method(name.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  return method;
}

// Bytes of C a Gemm answer carries, which GemmInPlace's response expects: none when C stays on
// the server or goes to a region.
size_t ReturnedCBytes(const v1::GemmRequest& request) {
  if (request.keep_c_resident() || request.has_c_region()) return 0;
  return size_t(GemmClient::ResultBytes(request));
}

void ApplyDeadline(const CallOptions& options, grpc::ClientContext* context) {
  if (options.timeout.count() > 0) {
    context->set_deadline(std::chrono::system_clock::now() + options.timeout);
  }
  if (!options.client_id.empty()) context->AddMetadata("x-client-id", options.client_id);
  if (!options.traceparent.empty()) context->AddMetadata("traceparent", options.traceparent);
}

// Writes every request's header and chunks; stops early if the stream breaks.
void WriteRequests(const std::vector<const v1::GemmRequest*>& requests, int64_t chunk_bytes,
                   GemmAnswerStream* stream) {
  for (size_t id = 0; id < requests.size(); ++id) {
    StreamedGemmMessages messages(*requests[id], id, chunk_bytes);
    grpc::ByteBuffer message;
    while (messages.Next(&message)) {
      if (!stream->Write(message)) return;
    }
  }
  stream->WritesDone();
}

// GemmService.GemmStream as the generated stub names it, for streams of StreamAnswers.
const grpc::internal::RpcMethod& GemmStreamMethod() {
  static const std::string name =
      std::string("/") + v1::GemmService::service_full_name() + "/GemmStream";
  static const grpc::internal::RpcMethod method(name.c_str(),
                                                grpc::internal::RpcMethod::BIDI_STREAMING);
  return method;
}

// GemmService's client-streaming uploads as the generated stub names them, for calls that
// write their chunks as ByteBuffers (WriteUpload).
const grpc::internal::RpcMethod& UploadMatrixMethod() {
  static const std::string name =
      std::string("/") + v1::GemmService::service_full_name() + "/UploadMatrix";
  static const grpc::internal::RpcMethod method(name.c_str(),
                                                grpc::internal::RpcMethod::CLIENT_STREAMING);
  return method;
}
const grpc::internal::RpcMethod& UploadPartMethod() {
  static const std::string name =
      std::string("/") + v1::GemmService::service_full_name() + "/UploadPart";
  static const grpc::internal::RpcMethod method(name.c_str(),
                                                grpc::internal::RpcMethod::CLIENT_STREAMING);
  return method;
}

// One upload call (UploadMatrix or UploadPart, `Response` its answer): `header` (an
// UploadMatrixRequest or PartRequest), then `bytes` as messages of one chunk field each
// (field 2 in both) of at most chunk_bytes. A chunk's payload is a static slice of `bytes`,
// not a copy: the call reads the caller's memory, which outlives it. Protobuf's wire format
// makes these the bytes the generated code would send.
template <typename Header, typename Response>
grpc::Status WriteUpload(grpc::Channel* channel, const grpc::internal::RpcMethod& method,
                         grpc::ClientContext* context, const Header& header, const char* bytes,
                         uint64_t size, int64_t chunk_bytes, Response* response) {
  static_assert(Header::kChunkFieldNumber == 2);
  using google::protobuf::internal::WireFormatLite;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> stream(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          channel, method, context, response));
  grpc::Slice whole(header.SerializeAsString());
  bool ok = stream->Write(grpc::ByteBuffer(&whole, 1));
  for (uint64_t at = 0; ok && at < size; at += uint64_t(chunk_bytes)) {
    const uint64_t length = std::min<uint64_t>(uint64_t(chunk_bytes), size - at);
    uint8_t key[16];
    uint8_t* end = google::protobuf::io::CodedOutputStream::WriteTagToArray(
        WireFormatLite::MakeTag(Header::kChunkFieldNumber,
                                WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
        key);
    end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(length, end);
    grpc::Slice slices[] = {grpc::Slice(key, size_t(end - key)),
                            grpc::Slice(bytes + at, length, grpc::Slice::STATIC_SLICE)};
    ok = stream->Write(grpc::ByteBuffer(slices, 2));
  }
  stream->WritesDone();
  return stream->Finish();
}

// results before a GemmStream's answers: one per request, unanswered, with room for C unless it
// goes into c_into (or stays on the server).
void StartResults(const std::vector<const v1::GemmRequest*>& requests,
                  const std::vector<CBuffer>* c_into, std::vector<StreamedGemm>* results) {
  results->assign(requests.size(), StreamedGemm{});
  for (size_t id = 0; id < requests.size(); ++id) {
    v1::GemmResponse& r = (*results)[id].response;
    r.set_m(requests[id]->m());
    r.set_n(requests[id]->n());
    if (c_into == nullptr && !requests[id]->keep_c_resident()) {
      r.mutable_c()->resize(GemmClient::ResultBytes(*requests[id]));
    }
    (*results)[id].status = grpc::Status(grpc::StatusCode::UNKNOWN, "no answer from the server");
  }
}

// Where a GemmStream's answers put C (StreamAnswer::c_of): results[id]'s C, or c_into[id].
std::function<bool(uint64_t, CBuffer*)> ResultBuffers(std::vector<StreamedGemm>* results,
                                                      const std::vector<CBuffer>* c_into) {
  return [results, c_into](uint64_t id, CBuffer* c) {
    if (id >= results->size()) return false;
    std::string* kept = (*results)[id].response.mutable_c();
    *c = c_into != nullptr ? (*c_into)[id] : CBuffer{kept->data(), kept->size()};
    return true;
  };
}

// One answer of a GemmStream into results (its chunk is in C already; a done sets its GEMM's
// status and response); an answer that breaks the protocol sets *protocol_error instead.
// REQUIRES: answer.c_of is ResultBuffers(results, ...) (a done past results is a problem).
void TakeAnswer(const StreamAnswer& answer, std::vector<StreamedGemm>* results,
                grpc::Status* protocol_error) {
  if (!answer.problem.empty()) {
    *protocol_error = grpc::Status(grpc::StatusCode::INTERNAL, answer.problem);
    return;
  }
  if (!answer.has_done) return;
  StreamedGemm& result = (*results)[answer.gemm_id];
  const v1::GemmDone& done = answer.done;
  result.answered = true;
  result.status = StatusOf(done);
  if (!result.status.ok()) result.response.clear_c();
  *result.response.mutable_timing() = done.timing();
  *result.response.mutable_execution() = done.execution();
  result.response.set_request_id(done.request_id());
  if (done.has_c_matrix()) *result.response.mutable_c_matrix() = done.c_matrix();
}

// A call to `replica` that could not reach it: say what that means for the matrices there.
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

// "" for an empty path, else the file's contents.
std::string ReadPem(const char* option, const std::string& path) {
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream pem;
  if (in) pem << in.rdbuf();
  if (!in || in.bad()) {
    throw std::runtime_error(fmt::format("{} {}: cannot read: {}", option, path, std::strerror(errno)));
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

// One GEMM on a GemmStream of its own, driven by gRPC's callbacks (GemmClient::GemmAsync):
// writes its header and chunks one after the other while reading C's chunks into c_into, then
// hands the outcome to `done` and deletes itself. Thread safety: gRPC runs one reaction at a
// time per direction; reads and writes touch disjoint members.
class AsyncStreamedGemm final : public grpc::ClientBidiReactor<grpc::ByteBuffer, StreamAnswer> {
 public:
  AsyncStreamedGemm(v1::GemmRequest request, CBuffer c_into, int64_t chunk_bytes,
                    std::shared_ptr<grpc::ClientContext> context, std::string replica,
                    grpc::Channel* channel, GemmClient::GemmDone done)
      : done_(std::move(done)),
        request_(std::move(request)),
        messages_(request_, 0, chunk_bytes),
        c_into_{c_into},
        context_(std::move(context)),
        replica_(std::move(replica)),
        channel_(channel) {
    StartResults({&request_}, &c_into_, &results_);
    answer_.c_of = ResultBuffers(&results_, &c_into_);
  }

  // Starts the call. After this, the reactor owns itself.
  void Start() {
    grpc::internal::ClientCallbackReaderWriterFactory<grpc::ByteBuffer, StreamAnswer>::Create(
        channel_, GemmStreamMethod(), context_.get(), this);
    StartRead(&answer_);
    NextWrite();
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (ok) NextWrite();  // else the stream is broken; OnDone says why
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    TakeAnswer(answer_, &results_, &protocol_error_);
    StartRead(&answer_);
  }
  void OnDone(const grpc::Status& status) override {
    // As the blocking one-GEMM GemmStream: the stream's failure first, then the GEMM's own.
    const grpc::Status outcome = !status.ok() ? ExplainUnreachable(status, replica_, channel_)
                                 : !protocol_error_.ok() ? protocol_error_
                                                         : results_[0].status;
    done_(outcome, std::move(results_[0].response));
    delete this;
  }

 private:
  void NextWrite() {
    if (messages_.Next(&message_)) {
      StartWrite(&message_);
    } else {
      StartWritesDone();
    }
  }

  // Destroyed last: what done_ owns may be what keeps the client alive, and the context holds
  // a reference to the channel (GemmAsync's REQUIRES).
  const GemmClient::GemmDone done_;
  const v1::GemmRequest request_;
  StreamedGemmMessages messages_;
  std::vector<CBuffer> c_into_;
  const std::shared_ptr<grpc::ClientContext> context_;
  const std::string replica_;
  grpc::Channel* const channel_;  // the client's, which outlives the call (GemmAsync)
  grpc::ByteBuffer message_;  // the write in flight
  StreamAnswer answer_;       // the read in flight
  std::vector<StreamedGemm> results_;
  grpc::Status protocol_error_;
};

// Runs work(0) .. work(n - 1) on n threads at once; the first failure, else OK.
grpc::Status OnThreads(int n, const std::function<grpc::Status(int)>& work) {
  std::vector<grpc::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back([&, i] { statuses[i] = work(i); });
  statuses[0] = work(0);
  for (std::thread& t : threads) t.join();
  for (const grpc::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return grpc::Status::OK;
}

// Byte range `i` of `parts` nearly equal ones of `bytes` (even: elements stay whole).
std::pair<uint64_t, uint64_t> PartRange(uint64_t bytes, int parts, int i) {
  const uint64_t size = (bytes / parts + 1) & ~uint64_t{1};
  const uint64_t begin = std::min(bytes, size * i);
  return {begin, i == parts - 1 ? bytes : std::min(bytes, begin + size)};
}

}  // namespace

struct GemmClient::Routes {
  Routes(std::shared_ptr<grpc::Channel> target, const ConnectOptions& connect,
         std::string target_address)
      : connect(connect),
        target_address(std::move(target_address)),
        target{"", target, std::shared_ptr(v1::GemmService::NewStub(target))} {}

  const ConnectOptions connect;
  const std::string target_address;  // "" when made from a channel
  const Route target;
  std::mutex mu;
  std::map<std::string, Route> replicas;  // guarded by mu
  // Part connections by replica ("": the target), each a channel of its own.
  std::map<std::string, std::vector<Route>> parts;  // guarded by mu
  // Whether each replica ("": the target) offers the bulk channel, once it answered.
  std::map<std::string, bool> bulk_offered;  // guarded by mu
  // The bulk lanes' TLS context (its CAs and certificate files read once), made at first use.
  std::shared_ptr<SSL_CTX> bulk_tls;  // guarded by mu
};

bool StreamedGemmMessages::Next(v1::GemmStreamRequest* message) {
  std::string_view data;
  if (!NextWithoutData(message, &data)) return false;
  if (message->has_chunk()) message->mutable_chunk()->set_data(data.data(), data.size());
  return true;
}

bool StreamedGemmMessages::Next(grpc::ByteBuffer* wire) {
  using google::protobuf::io::CodedOutputStream;
  using google::protobuf::internal::WireFormatLite;
  v1::GemmStreamRequest message;
  std::string_view data;
  if (!NextWithoutData(&message, &data)) return false;
  if (!message.has_chunk()) {
    grpc::Slice whole(message.SerializeAsString());
    *wire = grpc::ByteBuffer(&whole, 1);
    return true;
  }
  // GemmStreamRequest{chunk: MatrixChunk{gemm_id, operand, offset, data}}: every byte before
  // the data in one small slice, the data in another.
  const std::string fields = message.chunk().SerializeAsString();
  const uint32_t data_key =
      WireFormatLite::MakeTag(v1::MatrixChunk::kDataFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  const size_t chunk_bytes = fields.size() + CodedOutputStream::VarintSize32(data_key) +
                             CodedOutputStream::VarintSize64(data.size()) + data.size();
  uint8_t head[32];
  uint8_t* end = CodedOutputStream::WriteTagToArray(
      WireFormatLite::MakeTag(v1::GemmStreamRequest::kChunkFieldNumber,
                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
      head);
  end = CodedOutputStream::WriteVarint64ToArray(chunk_bytes, end);
  std::string prefix(reinterpret_cast<const char*>(head), size_t(end - head));
  prefix += fields;
  end = CodedOutputStream::WriteTagToArray(data_key, head);
  end = CodedOutputStream::WriteVarint64ToArray(data.size(), end);
  prefix.append(reinterpret_cast<const char*>(head), size_t(end - head));
  grpc::Slice slices[] = {grpc::Slice(prefix), grpc::Slice(data.data(), data.size())};
  *wire = grpc::ByteBuffer(slices, 2);
  return true;
}

bool StreamedGemmMessages::NextWithoutData(v1::GemmStreamRequest* message, std::string_view* data) {
  if (!header_sent_) {
    header_sent_ = true;
    v1::GemmHeader* header = message->mutable_header();
    header->set_gemm_id(gemm_id_);
    header->set_m(request_.m());
    header->set_n(request_.n());
    header->set_k(request_.k());
    *header->mutable_options() = request_.options();
    header->set_a_handle(request_.a_handle());
    header->set_b_handle(request_.b_handle());
    header->set_keep_c_resident(request_.keep_c_resident());
    header->set_c_ttl_seconds(request_.c_ttl_seconds());
    header->set_transpose_a(request_.transpose_a());
    header->set_transpose_b(request_.transpose_b());
    header->set_dtype(request_.dtype());
    header->set_c_dtype(request_.c_dtype());
    if (request_.has_alpha()) header->set_alpha(request_.alpha());
    header->set_beta(request_.beta());
    header->set_c_in_handle(request_.c_in_handle());
    header->set_batch(request_.batch());
    return true;
  }
  // An operand given by handle has no bytes here (a() of an unset oneof is empty). C_in is
  // sent only when the server reads it (beta != 0); a region has no stream form.
  static constexpr v1::Operand kOperands[] = {v1::OPERAND_A, v1::OPERAND_B, v1::OPERAND_C};
  auto view = [](const void* data, size_t size, const std::string& otherwise) {
    return data != nullptr ? std::string_view(static_cast<const char*>(data), size)
                           : std::string_view(otherwise);
  };
  for (; operand_ < 3; ++operand_, offset_ = 0) {
    const std::string_view bytes =
        operand_ == 0          ? view(detached_.a, detached_.a_bytes, request_.a())
        : operand_ == 1        ? view(detached_.b, detached_.b_bytes, request_.b())
        : request_.beta() != 0 ? std::string_view(request_.c_in())
                               : std::string_view();
    if (offset_ >= bytes.size()) continue;
    v1::MatrixChunk* chunk = message->mutable_chunk();
    chunk->set_gemm_id(gemm_id_);
    chunk->set_operand(kOperands[operand_]);
    chunk->set_offset(offset_);
    *data = bytes.substr(offset_, std::min<size_t>(chunk_bytes_, bytes.size() - offset_));
    offset_ += data->size();
    return true;
  }
  return false;
}

bool WriteStreamedGemm(const v1::GemmRequest& request, uint64_t gemm_id, int64_t chunk_bytes,
                       GemmStreamWriter* stream) {
  StreamedGemmMessages messages(request, gemm_id, chunk_bytes);
  v1::GemmStreamRequest message;
  while (messages.Next(&message)) {
    if (!stream->Write(message)) return false;
  }
  return true;
}

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
      throw std::runtime_error("tls_cert and tls_key go together (the client's certificate and key)");
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

GemmClient::Route GemmClient::PartRouteFor(const std::string& handle, int index) const {
  const std::string replica = ReplicaOf(handle);
  const std::string address = replica.empty() ? routes_->target_address : replica;
  if (address.empty()) return routes_->target;  // made from a channel: its one connection
  std::lock_guard<std::mutex> lock(routes_->mu);
  std::vector<Route>& routes = routes_->parts[replica];
  while (int(routes.size()) <= index) {
    ConnectOptions own = routes_->connect;
    own.private_subchannels = true;  // a TCP connection of its own
    Route route{replica, Connect(address, own), nullptr};
    route.stub = v1::GemmService::NewStub(route.channel);
    routes.push_back(std::move(route));
  }
  return routes[index];
}

GemmClient::Route GemmClient::RouteFor(const std::string& handle, const CallOptions& options) const {
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
    auto* call = new AsyncStreamedGemm(std::move(request), c_into, options.chunk_bytes, context,
                                       route.replica, route.channel.get(), std::move(done));
    call->Start();
    return;
  }
  // What the call uses lives with the callback, which gRPC keeps until it has run; `done` is
  // destroyed last (as in AsyncStreamedGemm). The channel is the client's (no reference here).
  // A and B leave from the caller's memory and C lands in c_into, as in GemmInPlace.
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

grpc::Status GemmClient::GemmStream(const std::vector<const v1::GemmRequest*>& requests,
                                    std::vector<StreamedGemm>* results,
                                    const CallOptions& options,
                                    const std::vector<CBuffer>* c_into) const {
  // One stream per replica, in the order each is first named.
  std::vector<std::string> order;
  std::map<std::string, std::vector<size_t>> by_replica;
  std::vector<std::pair<size_t, grpc::Status>> refused;
  for (size_t i = 0; i < requests.size(); ++i) {
    std::string replica;
    if (grpc::Status s = ReplicaOf(*requests[i], &replica); !s.ok()) {
      refused.emplace_back(i, s);
      continue;
    }
    if (replica.empty()) replica = options.replica;
    auto [it, added] = by_replica.try_emplace(replica);
    if (added) order.push_back(replica);
    it->second.push_back(i);
  }
  if (refused.empty() && order.size() <= 1) {
    return StreamOn(RouteTo(order.empty() ? options.replica : order[0]), requests, results, options,
                    c_into);
  }
  results->assign(requests.size(), StreamedGemm{});
  for (auto& [i, status] : refused) {
    (*results)[i].status = status;
    (*results)[i].answered = true;  // by this refusal: sending it again cannot help
  }
  grpc::Status first_failure;
  for (const std::string& replica : order) {
    const std::vector<size_t>& ids = by_replica[replica];
    std::vector<const v1::GemmRequest*> part;
    std::vector<CBuffer> part_c_into;
    for (size_t i : ids) {
      part.push_back(requests[i]);
      if (c_into != nullptr) part_c_into.push_back((*c_into)[i]);
    }
    std::vector<StreamedGemm> part_results;
    grpc::Status s = StreamOn(RouteTo(replica), part, &part_results, options,
                              c_into == nullptr ? nullptr : &part_c_into);
    if (!s.ok() && first_failure.ok()) first_failure = s;
    for (size_t j = 0; j < ids.size(); ++j) (*results)[ids[j]] = std::move(part_results[j]);
  }
  return first_failure;
}

std::unique_ptr<GemmAnswerStream> GemmClient::OpenStream(const std::string& replica,
                                                         const CallOptions& options,
                                                         grpc::ClientContext* context) const {
  ApplyDeadline(options, context);
  return std::unique_ptr<GemmAnswerStream>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, StreamAnswer>::Create(
          RouteTo(replica).channel.get(), GemmStreamMethod(), context));
}

grpc::Status GemmClient::StreamOn(const Route& route,
                                  const std::vector<const v1::GemmRequest*>& requests,
                                  std::vector<StreamedGemm>* results,
                                  const CallOptions& options,
                                  const std::vector<CBuffer>* c_into) const {
  StartResults(requests, c_into, results);
  grpc::ClientContext context;
  std::unique_ptr<GemmAnswerStream> stream = OpenStream(route.replica, options, &context);
  // Writing and reading run at once: the server answers early GEMMs while later ones upload.
  std::thread writer(WriteRequests, std::cref(requests), options.chunk_bytes, stream.get());
  StreamAnswer answer;
  answer.c_of = ResultBuffers(results, c_into);
  grpc::Status protocol_error;
  while (stream->Read(&answer)) TakeAnswer(answer, results, &protocol_error);
  writer.join();
  grpc::Status status = stream->Finish();
  return status.ok() ? protocol_error
                     : ExplainUnreachable(status, route.replica, route.channel.get());
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

bool GemmClient::ShouldSendParts(const v1::GemmRequest& request, const CallOptions& options,
                                 const OperandBytes& detached) {
  const bool no_region = !request.has_a_region() && !request.has_b_region() &&
                         !request.has_c_region() && !request.keep_c_resident();
  // Parts carry one plain GEMM's A and B: a C input (alpha/beta), a batch or a group goes the
  // old way.
  const bool plain = !request.has_alpha() && request.beta() == 0 &&
                     request.c_in_source_case() == v1::GemmRequest::C_IN_SOURCE_NOT_SET &&
                     request.batch() <= 1 && request.group_size() == 0;
  const int64_t bytes = int64_t(request.a().size() + request.b().size() + detached.a_bytes +
                                detached.b_bytes) +
                        ResultBytes(request);
  return options.parallel_parts > 1 && no_region && plain && bytes >= options.parallel_min_bytes &&
         (request.a_source_case() == v1::GemmRequest::kA ||
          request.b_source_case() == v1::GemmRequest::kB || detached.a != nullptr ||
          detached.b != nullptr);
}

grpc::Status GemmClient::RunParts(const v1::GemmRequest& request, v1::GemmResponse* response,
                                  const CallOptions& options) const {
  const int parts = options.parallel_parts;
  // The GEMM without its bytes: A and B as transient uploads, C kept transient.
  v1::GemmRequest gemm;
  gemm.set_m(request.m());
  gemm.set_n(request.n());
  gemm.set_k(request.k());
  *gemm.mutable_options() = request.options();
  gemm.set_transpose_a(request.transpose_a());
  gemm.set_transpose_b(request.transpose_b());
  gemm.set_dtype(request.dtype());
  gemm.set_c_dtype(request.c_dtype());
  gemm.set_keep_c_resident(true);
  gemm.set_c_transient(true);
  if (request.has_a_handle()) gemm.set_a_handle(request.a_handle());
  if (request.has_b_handle()) gemm.set_b_handle(request.b_handle());
  struct Upload {
    const std::string* bytes;
    std::string handle;
  };
  std::vector<Upload> uploads;
  // After a failure, only to free the server's memory early: the call's own status is the one
  // to report, and an upload whose release fails (the connection that failed the call, say) is
  // transient, so the server releases it after upload_idle_timeout unused (MatrixStore).
  auto release_uploads = [&] {
    for (const Upload& u : uploads) (void)ReleaseMatrix(u.handle, options);
  };
  const uint32_t m = request.m(), n = request.n(), k = request.k();
  for (auto [inline_bytes, rows, cols, handle] :
       {std::tuple{request.a_source_case() == v1::GemmRequest::kA ? &request.a() : nullptr,
                   request.transpose_a() ? k : m, request.transpose_a() ? m : k,
                   gemm.mutable_a_handle()},
        std::tuple{request.b_source_case() == v1::GemmRequest::kB ? &request.b() : nullptr,
                   request.transpose_b() ? n : k, request.transpose_b() ? k : n,
                   gemm.mutable_b_handle()}}) {
    if (inline_bytes == nullptr) continue;
    v1::MatrixInfo info;
    CallOptions near = options;
    // The second upload goes where the first lives (replicas).
    if (!uploads.empty()) near.replica = ReplicaOf(uploads[0].handle);
    if (grpc::Status s = CreateUpload(rows, cols, request.dtype(), true, &info, near); !s.ok()) {
      release_uploads();
      return s;
    }
    *handle = info.handle();
    uploads.push_back({inline_bytes, info.handle()});
  }
  const bool bulk = options.bulk && OffersBulk(uploads[0].handle);
  // Every connection sends an equal share of A's and B's bytes, one after the other.
  uint64_t total = 0;
  for (const Upload& u : uploads) total += u.bytes->size();
  auto send_bulk = [&] {
    return OnThreads(int(uploads.size()), [&](int i) {
      const Upload& u = uploads[i];
      return BulkPut(u.handle, 0, u.bytes->data(), u.bytes->size(), parts, options);
    });
  };
  grpc::Status sent = bulk ? send_bulk() : OnThreads(parts, [&](int route) {
    auto [begin, end] = PartRange(total, parts, route);
    uint64_t base = 0;
    for (const Upload& u : uploads) {
      const uint64_t first = std::max(begin, base), last = std::min(end, base + u.bytes->size());
      if (first < last) {
        if (grpc::Status s = UploadPart(u.handle, first - base, u.bytes->data() + (first - base),
                                        last - first, route, options);
            !s.ok()) {
          return s;
        }
      }
      base += u.bytes->size();
    }
    return grpc::Status::OK;
  });
  if (!sent.ok()) {
    release_uploads();
    return sent;
  }
  v1::GemmResponse ran;
  if (grpc::Status s = Gemm(gemm, &ran, options); !s.ok()) {
    release_uploads();  // a GEMM that ran OK released them
    return s;
  }
  const std::string c_handle = ran.c_matrix().handle();
  *response = std::move(ran);
  response->clear_c_matrix();
  const uint64_t c_bytes = ResultBytes(request);
  std::string* c = response->mutable_c();
  c->resize(c_bytes);
  grpc::Status received =
      bulk ? BulkGet(c_handle, 0, c_bytes, c->data(), parts, options)
           : OnThreads(parts, [&](int route) {
               auto [begin, end] = PartRange(c_bytes, parts, route);
               if (begin == end) return grpc::Status::OK;
               return DownloadRange(c_handle, begin, end - begin, c->data() + begin, route,
                                    options);
             });
  grpc::Status released = ReleaseMatrix(c_handle, options);
  if (!received.ok()) {
    c->clear();
    return received;
  }
  return released;
}

grpc::Status GemmClient::Run(const v1::GemmRequest& request, v1::GemmResponse* response,
                             const CallOptions& options) const {
  if (ShouldSendParts(request, options)) {
    grpc::Status s = RunParts(request, response, options);
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
            fmt::format("problems[{}].{}: {} bytes; problem {}x{}x{} (m x n x k) takes {}", i,
                        name, have, p.m, p.n, p.k, want));
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

grpc::Status GemmClient::UploadMatrix(uint32_t rows, uint32_t cols, std::string_view data,
                                      v1::MatrixInfo* info, uint32_t ttl_seconds,
                                      const std::string& label, const CallOptions& options,
                                      v1::DataType dtype, int32_t device_id) const {
  const Route route = RouteTo(options.replica);
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::UploadMatrixRequest message;
  v1::MatrixHeader* header = message.mutable_header();
  header->set_rows(rows);
  header->set_cols(cols);
  header->set_ttl_seconds(ttl_seconds);
  header->set_label(label);
  header->set_dtype(dtype);
  if (device_id >= 0) header->set_device_id(device_id);
  grpc::Status status = WriteUpload(route.channel.get(), UploadMatrixMethod(), &context, message,
                                    data.data(), data.size(), options.chunk_bytes, info);
  return ExplainUnreachable(status, route.replica, route.channel.get());
}

grpc::Status GemmClient::ReleaseMatrix(const std::string& handle, const CallOptions& options,
                                       uint64_t* freed_bytes) const {
  const Route route = RouteFor(handle, options);
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::ReleaseMatrixRequest request;
  request.set_handle(handle);
  v1::ReleaseMatrixResponse response;
  grpc::Status status = ExplainUnreachable(route.stub->ReleaseMatrix(&context, request, &response),
                                           route.replica, route.channel.get());
  if (freed_bytes != nullptr) *freed_bytes = status.ok() ? response.freed_bytes() : 0;
  return status;
}

grpc::Status GemmClient::RegisterRegion(const std::string& path, int64_t bytes,
                                        const std::string& label, v1::RegionInfo* info,
                                        const CallOptions& options) const {
  const Route route = RouteTo("");  // the same host: never another replica
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::RegisterRegionRequest request;
  request.set_path(path);
  request.set_byte_size(uint64_t(bytes));
  request.set_label(label);
  return route.stub->RegisterRegion(&context, request, info);
}

grpc::Status GemmClient::UnregisterRegion(const std::string& region,
                                          const CallOptions& options) const {
  const Route route = RouteTo("");
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::UnregisterRegionRequest request;
  request.set_region(region);
  v1::UnregisterRegionResponse response;
  return route.stub->UnregisterRegion(&context, request, &response);
}

grpc::Status GemmClient::ListRegions(v1::ListRegionsResponse* response,
                                     const CallOptions& options) const {
  const Route route = RouteTo("");
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  return route.stub->ListRegions(&context, v1::ListRegionsRequest(), response);
}

grpc::Status GemmClient::ListMatrices(v1::ListMatricesResponse* response,
                                      const CallOptions& options) const {
  const Route route = RouteTo(options.replica);
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  return route.stub->ListMatrices(&context, v1::ListMatricesRequest(), response);
}

grpc::Status GemmClient::DownloadMatrix(const std::string& handle, std::string* data,
                                        const CallOptions& options) const {
  const Route route = RouteFor(handle, options);
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::DownloadMatrixRequest request;
  request.set_handle(handle);
  auto stream = route.stub->DownloadMatrix(&context, request);
  data->clear();
  v1::ResultChunk chunk;
  while (stream->Read(&chunk)) {
    if (chunk.offset() != data->size()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "download chunks out of order");
    }
    // Growing the buffer mid-download would stall the reads (and so the server's writes).
    if (chunk.offset() == 0) data->reserve(chunk.total_bytes());
    data->append(chunk.data());
  }
  return ExplainUnreachable(stream->Finish(), route.replica, route.channel.get());
}

grpc::Status GemmClient::CreateUpload(uint32_t rows, uint32_t cols, v1::DataType dtype,
                                      bool transient, v1::MatrixInfo* info,
                                      const CallOptions& options) const {
  const Route route = RouteTo(options.replica);
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::UploadCreateRequest request;
  request.mutable_header()->set_rows(rows);
  request.mutable_header()->set_cols(cols);
  request.mutable_header()->set_dtype(dtype);
  request.set_transient(transient);
  return ExplainUnreachable(route.stub->CreateUpload(&context, request, info), route.replica,
                            route.channel.get());
}

grpc::Status GemmClient::UploadPart(const std::string& handle, uint64_t offset,
                                    const char* bytes, uint64_t length, int route_index,
                                    const CallOptions& options, uint64_t* missing_bytes) const {
  const Route route = PartRouteFor(handle, route_index);
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::PartResponse response;
  v1::PartRequest message;
  v1::PartHeader* header = message.mutable_header();
  header->set_handle(handle);
  header->set_offset(offset);
  header->set_length(length);
  grpc::Status status = WriteUpload(route.channel.get(), UploadPartMethod(), &context, message,
                                    bytes, length, options.chunk_bytes, &response);
  if (missing_bytes != nullptr) *missing_bytes = response.missing_bytes();
  return ExplainUnreachable(status, route.replica, route.channel.get());
}

grpc::Status GemmClient::DownloadRange(const std::string& handle, uint64_t offset,
                                       uint64_t length, char* into, int route_index,
                                       const CallOptions& options) const {
  uint64_t received = 0;
  grpc::Status status = DownloadOn(PartRouteFor(handle, route_index), handle, offset, length,
                                   {into, length}, &received, options);
  if (status.ok() && received != length) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        fmt::format("download of {} bytes ended after {} (a server that ignores "
                                    "ranges?)",
                                    length, received));
  }
  return status;
}

bool GemmClient::OffersBulk(const std::string& handle) const {
  const std::string replica = ReplicaOf(handle);
  if (BulkHostOf(replica.empty() ? routes_->target_address : replica).empty()) return false;
  {
    std::lock_guard<std::mutex> lock(routes_->mu);
    if (auto it = routes_->bulk_offered.find(replica); it != routes_->bulk_offered.end()) {
      return it->second;
    }
  }
  const Route route = RouteTo(replica);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerInfo info;
  if (!route.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok()) {
    return false;  // asked again next time: the call that needs it will say what is wrong
  }
  std::lock_guard<std::mutex> lock(routes_->mu);
  return routes_->bulk_offered[replica] = info.features().bulk_channel();
}

grpc::Status GemmClient::OpenBulk(const std::string& handle, v1::BulkDirection direction,
                                  uint64_t offset, uint64_t length, int lanes,
                                  const CallOptions& options, v1::BulkGrant* grant,
                                  BulkEndpoint* endpoint) const {
  const Route route = RouteFor(handle, options);
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::BulkRequest request;
  request.set_handle(handle);
  request.set_direction(direction);
  request.set_offset(offset);
  request.set_length(length);
  request.set_lanes(uint32_t(std::max(lanes, 1)));
  if (grpc::Status s = ExplainUnreachable(route.stub->OpenBulk(&context, request, grant),
                                          route.replica, route.channel.get());
      !s.ok()) {
    return s;
  }
  endpoint->host = grant->host().empty()
                       ? BulkHostOf(route.replica.empty() ? routes_->target_address : route.replica)
                       : grant->host();
  endpoint->port = grant->port();
  const ConnectOptions& connect = routes_->connect;
  if (connect.UsesTls()) {
    std::lock_guard<std::mutex> lock(routes_->mu);
    if (!routes_->bulk_tls) {
      std::string error;
      routes_->bulk_tls =
          NewBulkTlsContext({connect.tls_ca, connect.tls_cert, connect.tls_key}, &error);
      if (!routes_->bulk_tls) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, error);
    }
    endpoint->tls = routes_->bulk_tls;
    endpoint->server_name = connect.tls_server_name;
  }
  if (endpoint->host.empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "bulk channel: this client reaches the server by no TCP host (a unix: "
                        "target, or a channel it was given)");
  }
  // The lanes must tile the range asked for: a lane outside it would make this client read or
  // write memory that is not the caller's buffer.
  uint64_t next = offset;
  for (const v1::BulkLane& lane : grant->lanes()) {
    if (lane.offset() != next || lane.length() == 0 || lane.length() > offset + length - next) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "bulk channel: the server's lanes do not tile the range asked for");
    }
    next += lane.length();
  }
  if (next != offset + length) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "bulk channel: the server's lanes do not cover the range asked for");
  }
  return grpc::Status::OK;
}

namespace {

// How long a lane's send or receive may wait: the call's timeout, else a minute.
std::chrono::milliseconds LaneTimeout(const CallOptions& options) {
  return options.timeout.count() > 0 ? options.timeout : std::chrono::milliseconds(60000);
}

}  // namespace

grpc::Status GemmClient::BulkPut(const std::string& handle, uint64_t offset, const char* bytes,
                                 uint64_t length, int lanes, const CallOptions& options,
                                 uint64_t* missing_bytes) const {
  v1::BulkGrant grant;
  BulkEndpoint endpoint;
  if (grpc::Status s = OpenBulk(handle, v1::BULK_PUT, offset, length, lanes, options, &grant,
                                &endpoint);
      !s.ok()) {
    return s;
  }
  std::vector<uint64_t> missing(grant.lanes_size(), UINT64_MAX);
  grpc::Status sent = OnThreads(grant.lanes_size(), [&](int i) {
    const v1::BulkLane& lane = grant.lanes(i);
    return PutOverLane(endpoint, lane, bytes + (lane.offset() - offset), LaneTimeout(options),
                       &missing[i]);
  });
  // The lane that landed last saw the fewest bytes missing.
  if (missing_bytes != nullptr) *missing_bytes = *std::min_element(missing.begin(), missing.end());
  return sent;
}

grpc::Status GemmClient::BulkGet(const std::string& handle, uint64_t offset, uint64_t length,
                                 char* into, int lanes, const CallOptions& options) const {
  v1::BulkGrant grant;
  BulkEndpoint endpoint;
  if (grpc::Status s = OpenBulk(handle, v1::BULK_GET, offset, length, lanes, options, &grant,
                                &endpoint);
      !s.ok()) {
    return s;
  }
  return OnThreads(grant.lanes_size(), [&](int i) {
    const v1::BulkLane& lane = grant.lanes(i);
    return GetOverLane(endpoint, lane, into + (lane.offset() - offset), LaneTimeout(options));
  });
}

grpc::Status GemmClient::DownloadInto(const std::string& handle, uint64_t offset,
                                      uint64_t length, CBuffer into, uint64_t* received,
                                      const CallOptions& options) const {
  return DownloadOn(RouteFor(handle, options), handle, offset, length, into, received, options);
}

grpc::Status GemmClient::DownloadOn(const Route& route, const std::string& handle,
                                    uint64_t offset, uint64_t length, CBuffer into,
                                    uint64_t* received, const CallOptions& options) const {
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::DownloadMatrixRequest request;
  request.set_handle(handle);
  request.set_offset(offset);
  request.set_length(length);
  auto stream = route.stub->DownloadMatrix(&context, request);
  v1::ResultChunk chunk;
  uint64_t written = 0;
  grpc::Status broken;
  auto stop = [&](grpc::Status why) {
    if (broken.ok()) broken = std::move(why);
    context.TryCancel();
  };
  while (stream->Read(&chunk)) {
    if (!broken.ok()) continue;
    // The first chunk of a whole-matrix download says how much will come.
    const uint64_t coming = written == 0 && length == 0 && chunk.total_bytes() > offset
                                ? chunk.total_bytes() - offset
                                : written + chunk.data().size();
    if (chunk.offset() != offset + written ||
        (length != 0 && chunk.data().size() > length - written)) {
      stop(grpc::Status(grpc::StatusCode::INTERNAL, "download chunk outside the range asked for"));
    } else if (coming > into.capacity) {
      stop(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        fmt::format("the download buffer holds {} bytes; the matrix has more "
                                    "from byte {} ({} at least)",
                                    into.capacity, offset, coming)));
    } else {
      std::memcpy(into.data + written, chunk.data().data(), chunk.data().size());
      written += chunk.data().size();
    }
  }
  grpc::Status status = stream->Finish();
  if (received != nullptr) *received = written;
  if (!broken.ok()) return broken;
  return ExplainUnreachable(status, route.replica, route.channel.get());
}

grpc::Status GemmClient::ListKernels(v1::ListKernelsResponse* response,
                                     const CallOptions& options) const {
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  return RouteTo(options.replica).stub->ListKernels(&context, v1::ListKernelsRequest(), response);
}

grpc::Status GemmClient::GetServerInfo(v1::ServerInfo* response,
                                       const CallOptions& options) const {
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  return RouteTo(options.replica).stub->GetServerInfo(&context, v1::GetServerInfoRequest(),
                                                      response);
}

}  // namespace hgemm
