// GemmClient's resident matrices and shared-memory regions (client/gemm_client.h): upload,
// download (whole or by range into caller memory), release and list a replica's matrices;
// register, unregister and list regions.
#include <fmt/format.h>

#include <grpcpp/impl/rpc_method.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "client/gemm_client.h"
#include "client/gemm_client_internal.h"

namespace hgemm {

using client_internal::ApplyDeadline;
using client_internal::ExplainUnreachable;
using client_internal::WriteUpload;

namespace {

// GemmService.UploadMatrix as the generated stub names it, for calls that write their chunks as
// ByteBuffers (WriteUpload).
const grpc::internal::RpcMethod& UploadMatrixMethod() {
  static const std::string name =
      std::string("/") + v1::GemmService::service_full_name() + "/UploadMatrix";
  static const grpc::internal::RpcMethod method(name.c_str(),
                                                grpc::internal::RpcMethod::CLIENT_STREAMING);
  return method;
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

}  // namespace hgemm
