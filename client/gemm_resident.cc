// GemmClient's resident matrices and shared-memory regions (client/gemm_client.h): upload,
// download (whole or by range into caller memory), release and list a replica's matrices;
// register, unregister and list regions.
#include <fmt/format.h>

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/sync_stream.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "client/gemm_client.h"
#include "client/gemm_client_internal.h"

namespace hgemm {

// The chunks of one DownloadMatrix read straight into the caller's buffer (DownloadOn): a
// chunk's data lands at into.data + written when it is the range's next bytes and fits; else
// `problem` (with `code`) says why, nothing more is written, and the reader ends the call.
struct DownloadSink {
  CBuffer into;
  uint64_t offset = 0;  // the range's first byte in the matrix
  uint64_t length = 0;  // bytes asked for (0: to the matrix's end)
  uint64_t written = 0;
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string problem;
};

}  // namespace hgemm

namespace grpc {
// How gRPC reads a DownloadMatrix chunk into a DownloadSink. Always OK: bytes that do not parse
// become its problem.
template <>
class SerializationTraits<hgemm::DownloadSink, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer, hgemm::DownloadSink* download);
};
}  // namespace grpc

namespace hgemm {

using client_internal::ApplyDeadline;
using client_internal::ExplainUnreachable;
using client_internal::WriteUpload;

namespace {

// GemmService.UploadMatrix as the generated stub names it, for calls that write their chunks as
// ByteBuffers (WriteUpload).
const grpc::internal::RpcMethod& UploadMatrixMethod() {
  static const client_internal::ServiceMethod method("UploadMatrix",
                                                     grpc::internal::RpcMethod::CLIENT_STREAMING);
  return method.get();
}

// GemmService.DownloadMatrix as the generated stub names it, for calls read as DownloadSink.
const grpc::internal::RpcMethod& DownloadMatrixMethod() {
  static const client_internal::ServiceMethod method("DownloadMatrix",
                                                     grpc::internal::RpcMethod::SERVER_STREAMING);
  return method.get();
}

// DownloadSink's reading of one ResultChunk from `input`. False if the bytes do not parse; a
// chunk that cannot be written sets download->problem and is skipped.
bool ReadDownloadChunk(google::protobuf::io::CodedInputStream* input, DownloadSink* download) {
  auto refuse = [download](grpc::StatusCode code, std::string problem) {
    download->code = code;
    download->problem = std::move(problem);
  };
  uint64_t placed = 0;  // counted once the read has landed
  const client_internal::ChunkRead read =
      client_internal::ReadResultChunk(input, [&](uint64_t offset, uint32_t bytes) -> char* {
        const uint64_t coming = download->written + bytes;
        if (offset != download->offset + download->written ||
            (download->length != 0 && coming > download->length)) {
          refuse(grpc::StatusCode::INTERNAL, "download chunk outside the range asked for");
          return nullptr;
        }
        if (coming > download->into.capacity) {
          refuse(grpc::StatusCode::INVALID_ARGUMENT,
                 fmt::format("the download buffer holds {} bytes; the matrix has more from byte "
                             "{} ({} at least)",
                             download->into.capacity, download->offset, coming));
          return nullptr;
        }
        placed = bytes;
        return download->into.data + download->written;
      });
  if (read == client_internal::ChunkRead::kOutOfOrder) {
    refuse(grpc::StatusCode::INTERNAL,
           "a DownloadMatrix chunk is not in the form protobuf writes (offset, then data)");
  }
  if (read == client_internal::ChunkRead::kRead) download->written += placed;
  return read != client_internal::ChunkRead::kUnparsable;
}

}  // namespace

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

grpc::Status GemmClient::DownloadInto(const std::string& handle, uint64_t offset, uint64_t length,
                                      CBuffer into, uint64_t* received,
                                      const CallOptions& options) const {
  return DownloadOn(RouteFor(handle, options), handle, offset, length, into, received, options);
}

grpc::Status GemmClient::DownloadOn(const Route& route, const std::string& handle, uint64_t offset,
                                    uint64_t length, CBuffer into, uint64_t* received,
                                    const CallOptions& options) const {
  grpc::ClientContext context;
  ApplyDeadline(options, &context);
  v1::DownloadMatrixRequest request;
  request.set_handle(handle);
  request.set_offset(offset);
  request.set_length(length);
  // Each chunk's bytes go from gRPC's buffers into `into` once, not through a ResultChunk.
  std::unique_ptr<grpc::ClientReader<DownloadSink>> stream(
      grpc::internal::ClientReaderFactory<DownloadSink>::Create(
          route.channel.get(), DownloadMatrixMethod(), &context, request));
  DownloadSink download{.into = into, .offset = offset, .length = length};
  while (stream->Read(&download)) {
    if (!download.problem.empty()) context.TryCancel();  // the reads then end
  }
  grpc::Status status = stream->Finish();
  if (received != nullptr) *received = download.written;
  if (!download.problem.empty()) return grpc::Status(download.code, download.problem);
  if (status.ok() && length != 0 && download.written != length) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        fmt::format("the server sent {} of the {} bytes asked for", download.written, length));
  }
  return ExplainUnreachable(status, route.replica, route.channel.get());
}

}  // namespace hgemm

namespace grpc {

Status SerializationTraits<hgemm::DownloadSink, void>::Deserialize(ByteBuffer* buffer,
                                                                   hgemm::DownloadSink* download) {
  if (download->problem.empty()) {
    ProtoBufferReader reader(buffer);
    google::protobuf::io::CodedInputStream input(&reader);
    input.SetTotalBytesLimit(INT_MAX);
    if (!hgemm::ReadDownloadChunk(&input, download) || !input.ConsumedEntireMessage()) {
      if (download->problem.empty()) {
        download->code = StatusCode::INTERNAL;
        download->problem = "a DownloadMatrix chunk did not parse";
      }
    }
  }
  buffer->Clear();
  return Status::OK;
}

}  // namespace grpc
