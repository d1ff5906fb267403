// Internal to the GemmClient library (client/gemm_client.cc and the files beside it:
// gemm_stream.cc, gemm_parts.cc, gemm_resident.cc); not part of the client's API, and no target
// outside //client:gemm_client may include it. It holds what more than one of those files needs:
// the per-replica routes of a client, the deadline and metadata every call carries, the
// explanation of an unreachable replica, and the zero-copy upload call.
//
// Thread safety: the functions are thread-safe; GemmClient::Routes guards its maps with its
// mutex (each field says which).
#ifndef HGEMM_CLIENT_GEMM_CLIENT_INTERNAL_H_
#define HGEMM_CLIENT_GEMM_CLIENT_INTERNAL_H_

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/bulk_lane.h"
#include "client/gemm_client.h"

namespace hgemm {

// Where a client's calls go: the target's route, made at construction, and the replicas' and
// part connections' routes, made at first use and kept. Copies of a GemmClient share one.
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
  // The bulk lanes' connections kept between transfers (thread-safe itself).
  const std::shared_ptr<BulkLanePool> bulk_lanes = std::make_shared<BulkLanePool>();
  // Run()s in progress on every copy of the client: PartsFor's load.
  std::atomic<int> gemms_in_flight{0};
};

namespace client_internal {

// Sets the options' deadline (none when timeout is 0) and metadata (x-client-id, traceparent)
// on a call's context. REQUIRES: `context` has not started a call.
void ApplyDeadline(const CallOptions& options, grpc::ClientContext* context);

// A call to `replica` that could not reach it: say what that means for the matrices there.
// Returns `status` itself for the target (replica ""), for any other failure, and for a replica
// that answered.
// A GemmService method as the generated stub names it ("/hgemm.v1.GemmService/<name>"), for
// calls made with the client's own message types (ByteBuffers written raw, answers read
// straight into the caller's memory). Keep one per method in a function-local static: the
// RpcMethod points into its name.
class ServiceMethod {
 public:
  ServiceMethod(const char* name, grpc::internal::RpcMethod::RpcType type)
      : name_(std::string("/") + v1::GemmService::service_full_name() + "/" + name),
        method_(name_.c_str(), type) {}
  ServiceMethod(const ServiceMethod&) = delete;
  ServiceMethod& operator=(const ServiceMethod&) = delete;
  const grpc::internal::RpcMethod& get() const { return method_; }

 private:
  const std::string name_;
  const grpc::internal::RpcMethod method_;
};

grpc::Status ExplainUnreachable(grpc::Status status, const std::string& replica,
                                grpc::Channel* channel);

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
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel, method, context,
                                                                    response));
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

// Starts GemmAsync's streamed GEMM (gemm_stream.cc): `request` with its operands inline, C read
// into c_into, on `channel` (the client's route to `replica`). `done` runs exactly once, on a
// gRPC thread; the call owns itself until then. REQUIRES: as GemmClient::GemmAsync's, with
// `context` already given its deadline and metadata.
void StartStreamedGemm(v1::GemmRequest request, CBuffer c_into, int64_t chunk_bytes,
                       std::shared_ptr<grpc::ClientContext> context, std::string replica,
                       grpc::Channel* channel, GemmClient::GemmDone done);

// How ReadResultChunk ended.
enum class ChunkRead { kRead, kUnparsable, kOutOfOrder };

// Reads one ResultChunk's fields from `input` to its end (or to the limit pushed for it),
// straight into the caller's memory: the data goes where place(offset, bytes) points, or is
// skipped when it returns null (place records why). The offset (0 until its field comes) must
// come before the data and there is one data field at most, as protobuf writes them: otherwise
// kOutOfOrder. kUnparsable when the bytes do not parse.
ChunkRead ReadResultChunk(google::protobuf::io::CodedInputStream* input,
                          const std::function<char*(uint64_t offset, uint32_t bytes)>& place);

}  // namespace client_internal
}  // namespace hgemm

#endif  // HGEMM_CLIENT_GEMM_CLIENT_INTERNAL_H_
