// GemmClient's streams (client/gemm_client.h): GemmStream and OpenStream, the blocking and
// callback GEMMs on a GemmStream call, and their wire forms (StreamedGemmMessages writes a GEMM's
// messages, StreamAnswer reads C's chunks straight into the caller's buffers).
#include <fmt/format.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <utility>

#include "client/error_details.h"
#include "client/gemm_client.h"
#include "client/gemm_client_internal.h"

namespace hgemm {
namespace {

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
      const client_internal::ChunkRead read =
          client_internal::ReadResultChunk(input, [&](uint64_t offset, uint32_t bytes) -> char* {
            CBuffer c;
            if (!answer->c_of || !answer->c_of(answer->gemm_id, &c)) {
              not_in_flight();
              return nullptr;
            }
            if (offset > c.capacity || bytes > c.capacity - offset) {
              answer->problem = fmt::format("gemm_id {}: result chunk past the end of C's {} bytes",
                                            answer->gemm_id, c.capacity);
              return nullptr;
            }
            return c.data + offset;
          });
      if (read == client_internal::ChunkRead::kOutOfOrder) return out_of_order();
      if (read == client_internal::ChunkRead::kUnparsable) return false;
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

}  // namespace

namespace client_internal {

ChunkRead ReadResultChunk(google::protobuf::io::CodedInputStream* input,
                          const std::function<char*(uint64_t offset, uint32_t bytes)>& place) {
  using google::protobuf::internal::WireFormatLite;
  uint64_t offset = 0;
  bool data_seen = false;
  while (const uint32_t tag = input->ReadTag()) {
    if (tag == WireFormatLite::MakeTag(v1::ResultChunk::kOffsetFieldNumber,
                                       WireFormatLite::WIRETYPE_VARINT)) {
      if (data_seen) return ChunkRead::kOutOfOrder;
      if (!input->ReadVarint64(&offset)) return ChunkRead::kUnparsable;
    } else if (tag == WireFormatLite::MakeTag(v1::ResultChunk::kDataFieldNumber,
                                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      if (data_seen) return ChunkRead::kOutOfOrder;
      uint32_t bytes = 0;
      if (!input->ReadVarint32(&bytes) || bytes > INT_MAX) return ChunkRead::kUnparsable;
      data_seen = true;
      char* to = place(offset, bytes);
      if (to != nullptr ? !input->ReadRaw(to, int(bytes)) : !input->Skip(int(bytes))) {
        return ChunkRead::kUnparsable;
      }
    } else if (!WireFormatLite::SkipField(input, tag)) {
      return ChunkRead::kUnparsable;
    }
  }
  return ChunkRead::kRead;
}

}  // namespace client_internal
}  // namespace hgemm

namespace grpc {

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

using client_internal::ApplyDeadline;
using client_internal::ExplainUnreachable;

namespace {

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
  static const client_internal::ServiceMethod method("GemmStream",
                                                     grpc::internal::RpcMethod::BIDI_STREAMING);
  return method.get();
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
  grpc::ByteBuffer message_;      // the write in flight
  StreamAnswer answer_;           // the read in flight
  std::vector<StreamedGemm> results_;
  grpc::Status protocol_error_;
};

}  // namespace

namespace client_internal {

void StartStreamedGemm(v1::GemmRequest request, CBuffer c_into, int64_t chunk_bytes,
                       std::shared_ptr<grpc::ClientContext> context, std::string replica,
                       grpc::Channel* channel, GemmClient::GemmDone done) {
  auto* call = new AsyncStreamedGemm(std::move(request), c_into, chunk_bytes, std::move(context),
                                     std::move(replica), channel, std::move(done));
  call->Start();
}

}  // namespace client_internal

bool StreamedGemmMessages::Next(v1::GemmStreamRequest* message) {
  std::string_view data;
  if (!NextWithoutData(message, &data)) return false;
  if (message->has_chunk()) message->mutable_chunk()->set_data(data.data(), data.size());
  return true;
}

bool StreamedGemmMessages::Next(grpc::ByteBuffer* wire) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
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
  const uint32_t data_key = WireFormatLite::MakeTag(v1::MatrixChunk::kDataFieldNumber,
                                                    WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
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

grpc::Status GemmClient::GemmStream(const std::vector<const v1::GemmRequest*>& requests,
                                    std::vector<StreamedGemm>* results, const CallOptions& options,
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
                                  std::vector<StreamedGemm>* results, const CallOptions& options,
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

}  // namespace hgemm
