// GemmClient's parallel parts and bulk channel (client/gemm_client.h, "Parallel parts"): Run()'s
// GEMM as transient uploads filled by parts over several connections, C downloaded by ranges;
// the part connections; CreateUpload, UploadPart and DownloadRange; and the bulk channel's
// lanes beside gRPC (OffersBulk, OpenBulk, BulkPut, BulkGet).
#include <fmt/format.h>

#include <grpcpp/impl/rpc_method.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "client/bulk_lane.h"
#include "client/gemm_client.h"
#include "client/gemm_client_internal.h"

namespace hgemm {

using client_internal::ApplyDeadline;
using client_internal::ExplainUnreachable;
using client_internal::WriteUpload;

namespace {

// GemmService.UploadPart as the generated stub names it, for calls that write their chunks as
// ByteBuffers (WriteUpload).
const grpc::internal::RpcMethod& UploadPartMethod() {
  static const client_internal::ServiceMethod method("UploadPart",
                                                     grpc::internal::RpcMethod::CLIENT_STREAMING);
  return method.get();
}

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

// Whether a bulk transfer was turned away for want of room, not for what it asked: no lane to
// spare (RESOURCE_EXHAUSTED from OpenBulk) or no bulk connection (UNAVAILABLE from the lane's
// listener). The same bytes can still go over gRPC.
bool BulkFull(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         s.error_code() == grpc::StatusCode::UNAVAILABLE;
}

// Bytes [offset, offset + length) of upload `handle` from `bytes` over `parts` part connections
// at once, an equal share each (*missing: the fewest bytes the upload still missed after one).
grpc::Status UploadInParts(const GemmClient& client, const std::string& handle, uint64_t offset,
                           const char* bytes, uint64_t length, int parts,
                           const CallOptions& options, uint64_t* missing) {
  std::vector<uint64_t> left(parts, UINT64_MAX);
  grpc::Status s = OnThreads(parts, [&](int route) {
    const auto [begin, end] = PartRange(length, parts, route);
    if (begin == end) return grpc::Status::OK;
    return client.UploadPart(handle, offset + begin, bytes + begin, end - begin, route, options,
                             &left[route]);
  });
  *missing = *std::min_element(left.begin(), left.end());
  return s;
}

// Bytes [offset, offset + length) of matrix `handle` into `into` over `parts` part connections
// at once, an equal share each.
grpc::Status DownloadInParts(const GemmClient& client, const std::string& handle, uint64_t offset,
                             uint64_t length, char* into, int parts, const CallOptions& options) {
  return OnThreads(parts, [&](int route) {
    const auto [begin, end] = PartRange(length, parts, route);
    if (begin == end) return grpc::Status::OK;
    return client.DownloadRange(handle, offset + begin, end - begin, into + begin, route, options);
  });
}

// How long a lane's send or receive may wait: the call's timeout, else a minute.
std::chrono::milliseconds LaneTimeout(const CallOptions& options) {
  return options.timeout.count() > 0 ? options.timeout : std::chrono::milliseconds(60000);
}

}  // namespace

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

bool GemmClient::ShouldSendParts(const v1::GemmRequest& request, const CallOptions& options,
                                 const OperandBytes& detached) {
  const bool no_region = !request.has_a_region() && !request.has_b_region() &&
                         !request.has_c_region() && !request.keep_c_resident();
  // Parts carry one plain GEMM's A and B: a C input (alpha/beta), a batch or a group goes the
  // old way.
  const bool plain = !request.has_alpha() && request.beta() == 0 &&
                     request.c_in_source_case() == v1::GemmRequest::C_IN_SOURCE_NOT_SET &&
                     request.batch() <= 1 && request.group_size() == 0;
  const int64_t bytes =
      int64_t(request.a().size() + request.b().size() + detached.a_bytes + detached.b_bytes) +
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
  struct Wanted {
    const std::string* bytes;
    uint32_t rows, cols;
    std::string* handle;
  };
  std::vector<Wanted> wanted;
  for (Wanted w : {Wanted{request.a_source_case() == v1::GemmRequest::kA ? &request.a() : nullptr,
                          request.transpose_a() ? k : m, request.transpose_a() ? m : k,
                          gemm.mutable_a_handle()},
                   Wanted{request.b_source_case() == v1::GemmRequest::kB ? &request.b() : nullptr,
                          request.transpose_b() ? n : k, request.transpose_b() ? k : n,
                          gemm.mutable_b_handle()}}) {
    if (w.bytes != nullptr) wanted.push_back(w);
  }
  // The uploads go where the GEMM's resident operand lives, if it has one (replicas), else
  // where the caller's options send them.
  CallOptions near = options;
  std::string home;
  if (grpc::Status s = ReplicaOf(request, &home); !s.ok()) return s;
  if (!home.empty()) near.replica = home;
  // Both uploads at once: one round trip instead of two.
  std::vector<v1::MatrixInfo> infos(wanted.size());
  std::vector<grpc::Status> created(wanted.size());
  (void)OnThreads(int(wanted.size()), [&](int i) {
    const Wanted& w = wanted[i];
    return created[i] = CreateUpload(w.rows, w.cols, request.dtype(), true, &infos[i], near);
  });
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (created[i].ok()) uploads.push_back({wanted[i].bytes, infos[i].handle()});
  }
  for (const grpc::Status& s : created) {
    if (!s.ok()) {
      release_uploads();
      return s;
    }
  }
  // Behind a target balanced over replicas the two may land apart: the second is made again
  // where the first lives.
  if (uploads.size() == 2 && ReplicaOf(uploads[0].handle) != ReplicaOf(uploads[1].handle)) {
    (void)ReleaseMatrix(uploads[1].handle, options);
    uploads.pop_back();
    near.replica = ReplicaOf(uploads[0].handle);
    v1::MatrixInfo info;
    if (grpc::Status s =
            CreateUpload(wanted[1].rows, wanted[1].cols, request.dtype(), true, &info, near);
        !s.ok()) {
      release_uploads();
      return s;
    }
    uploads.push_back({wanted[1].bytes, info.handle()});
  }
  for (size_t i = 0; i < wanted.size(); ++i) *wanted[i].handle = uploads[i].handle;
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
  // C lands in the buffer the response already holds (a caller's earlier C of this size, say):
  // a fresh 128 MiB string at 8192³ costs its page faults and zeroing on every GEMM.
  std::string c_buffer = std::move(*response->mutable_c());
  *response = std::move(ran);
  response->clear_c_matrix();
  const uint64_t c_bytes = ResultBytes(request);
  std::string* c = response->mutable_c();
  *c = std::move(c_buffer);
  c->resize(c_bytes);
  grpc::Status received =
      bulk ? BulkGet(c_handle, 0, c_bytes, c->data(), parts, options)
           : DownloadInParts(*this, c_handle, 0, c_bytes, c->data(), parts, options);
  grpc::Status released = ReleaseMatrix(c_handle, options);
  if (!received.ok()) {
    c->clear();
    return received;
  }
  return released;
}

int GemmClient::PartsFor(int parallel_parts, int gemms_in_flight) {
  return parallel_parts / std::max(gemms_in_flight, 1);
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

grpc::Status GemmClient::UploadPart(const std::string& handle, uint64_t offset, const char* bytes,
                                    uint64_t length, int route_index, const CallOptions& options,
                                    uint64_t* missing_bytes) const {
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

grpc::Status GemmClient::DownloadRange(const std::string& handle, uint64_t offset, uint64_t length,
                                       char* into, int route_index,
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
  endpoint->pool = routes_->bulk_lanes;
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

grpc::Status GemmClient::BulkPut(const std::string& handle, uint64_t offset, const char* bytes,
                                 uint64_t length, int lanes, const CallOptions& options,
                                 uint64_t* missing_bytes) const {
  v1::BulkGrant grant;
  BulkEndpoint endpoint;
  uint64_t missing = UINT64_MAX;
  const grpc::Status opened =
      OpenBulk(handle, v1::BULK_PUT, offset, length, lanes, options, &grant, &endpoint);
  grpc::Status sent;
  if (BulkFull(opened)) {
    sent =
        UploadInParts(*this, handle, offset, bytes, length, std::max(lanes, 1), options, &missing);
  } else if (!opened.ok()) {
    return opened;
  } else {
    std::vector<uint64_t> left(grant.lanes_size(), UINT64_MAX);
    sent = OnThreads(grant.lanes_size(), [&](int i) {
      const v1::BulkLane& lane = grant.lanes(i);
      const char* from = bytes + (lane.offset() - offset);
      grpc::Status s = PutOverLane(endpoint, lane, from, LaneTimeout(options), &left[i]);
      // A lane turned away, or cut (its part then counts nothing, and its range may be sent
      // again): that range, over gRPC.
      if (BulkFull(s))
        s = UploadPart(handle, lane.offset(), from, lane.length(), i, options, &left[i]);
      return s;
    });
    // The lane that landed last saw the fewest bytes missing.
    missing = *std::min_element(left.begin(), left.end());
  }
  if (missing_bytes != nullptr) *missing_bytes = missing;
  return sent;
}

grpc::Status GemmClient::BulkGet(const std::string& handle, uint64_t offset, uint64_t length,
                                 char* into, int lanes, const CallOptions& options) const {
  v1::BulkGrant grant;
  BulkEndpoint endpoint;
  const grpc::Status opened =
      OpenBulk(handle, v1::BULK_GET, offset, length, lanes, options, &grant, &endpoint);
  if (BulkFull(opened)) {
    return DownloadInParts(*this, handle, offset, length, into, std::max(lanes, 1), options);
  }
  if (!opened.ok()) return opened;
  return OnThreads(grant.lanes_size(), [&](int i) {
    const v1::BulkLane& lane = grant.lanes(i);
    char* to = into + (lane.offset() - offset);
    grpc::Status s = GetOverLane(endpoint, lane, to, LaneTimeout(options));
    if (BulkFull(s)) s = DownloadRange(handle, lane.offset(), lane.length(), to, i, options);
    return s;
  });
}

}  // namespace hgemm
