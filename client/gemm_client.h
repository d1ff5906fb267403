// GemmClient: a synchronous C++ client of hgemm.v1.GemmService.
//
// Unary Gemm for small matrices, GemmStream (chunked, many GEMMs on one call) for large ones;
// Run() picks by size. Thread safety: a GemmClient may be used from many threads at once
// (gRPC stubs are thread-safe); each call is independent.
//
// Replicas (proto/hgemm.proto, "Replicas"): a call naming a resident matrix's handle goes to the
// replica that holds it (the address in the handle, proto/handle.h) over a channel of its own,
// made with Connect(replica, the client's ConnectOptions) at first use and kept; every other
// call is balanced over the target (round_robin over its addresses: "ipv4:H:P1,H:P2", or a DNS
// name resolving to every replica). A GEMM whose handles live on two replicas is refused here,
// FAILED_PRECONDITION naming both: upload the second operand where the first lives
// (CallOptions::replica). A call naming a handle of a replica that cannot be reached gets
// UNAVAILABLE saying that the replica is gone or down and that its matrices must be uploaded
// again. Handles naming no replica (a server without --advertise_address) go to the target.
// Copies of a GemmClient share its channels (the target's and the replicas').
//
// Parallel parts (proto/hgemm.proto, "Parallel parts"): one connection moves about 1 GB/s, so
// Run() sends a GEMM whose payload is at least CallOptions::parallel_min_bytes over
// CallOptions::parallel_parts connections at once: A and B as transient uploads filled by
// parts, C kept transient on the server and downloaded by byte ranges straight into the
// response. The part connections (channels with private subchannels, made at first use and
// kept) go to the target given at construction, or to the replica the uploads live on.
#ifndef HGEMM_CLIENT_GEMM_CLIENT_H_
#define HGEMM_CLIENT_GEMM_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "client/bulk_lane.h"
#include "proto/grpc_args.h"
#include "proto/hgemm.grpc.pb.h"

namespace hgemm {

// How Connect() makes a channel. Every channel to the service (clients, load generator, one per
// replica) is made from one of these, so credentials are set in one place.
struct ConnectOptions {
  // A subchannel pool of the channel's own instead of the process-wide one: channels made with
  // it open their own connections (the load generator spreads calls over several).
  bool private_subchannels = false;
  // TLS: on when `tls` is set or any of the paths below is. tls_ca is the PEM bundle the
  // server's certificate is checked against ("": the system's roots); tls_cert and tls_key
  // (PEM, both or neither) are the client's certificate for mutual TLS.
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // The name the server's certificate must carry, if not the target's host (e.g. connecting by
  // IP address to a certificate issued for a DNS name).
  std::string tls_server_name;
  // Sent as "authorization: Bearer TOKEN" on every call ("": none). It is added by a client
  // interceptor rather than call credentials, which gRPC sends only over TLS: the token then
  // goes over plaintext channels too, which is meant for loopback tests only.
  std::string token;
  // gRPC channel arguments set on every channel (--grpc_arg), for transport experiments.
  std::vector<GrpcArg> grpc_args;

  bool UsesTls() const { return tls || !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty(); }
};

// A channel to `target` (e.g. "127.0.0.1:50051", "dns:///svc:50051") with no limit on the
// size of received messages (C of a large unary GEMM exceeds gRPC's 4 MiB default).
// Throws std::runtime_error naming the file if a TLS file can't be read, or if only one of
// tls_cert and tls_key is set.
std::shared_ptr<grpc::Channel> Connect(const std::string& target,
                                       const ConnectOptions& options = {});

// The outcome of one GEMM sent on a stream.
struct StreamedGemm {
  grpc::Status status;        // from the GEMM's `done` message
  v1::GemmResponse response;  // c, timing, execution, request_id (when status is OK)
  // Whether its `done` arrived (or the client refused it, never sending it): a GEMM a broken
  // stream left unanswered may be sent again.
  bool answered = false;
};

struct CallOptions {
  // 0 means no deadline.
  std::chrono::milliseconds timeout{0};
  // Chunk size for GemmStream operands.
  int64_t chunk_bytes = int64_t{1} << 20;
  // Run(): payloads (A + B bytes) above this go through GemmStream.
  int64_t unary_limit_bytes = int64_t{3} << 20;
  // Sent as "x-client-id" metadata: the owner of resident matrices (default: the peer address).
  std::string client_id;
  // Sent as "traceparent" metadata: the W3C trace context the server logs with the call
  // ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"; the server ignores a malformed one).
  std::string traceparent;
  // Run(): a GEMM whose operand and result bytes travelling add up to at least
  // parallel_min_bytes goes as parallel_parts parts over as many connections (see "Parallel
  // parts" above), shared among the client's GEMMs in flight (PartsFor); parallel_parts ≤ 1
  // turns it off. A server without CreateUpload gets the
  // GEMM the old way. Defaults measured on loopback (docs/data_plane.md).
  int parallel_parts = 4;
  int64_t parallel_min_bytes = int64_t{16} << 20;
  // Parallel parts move their bytes over the bulk channel (plain TCP beside gRPC, "Bulk
  // channel" in proto/hgemm.proto), parallel_parts lanes each way, where the server offers one
  // (ServerInfo.features.bulk_channel, asked once per replica); else by UploadPart and ranged
  // DownloadMatrix calls.
  bool bulk = true;
  // Where a call that names no handle goes: a replica's address (GemmClient::ReplicaOf of a
  // handle, or MatrixInfo.replica), e.g. to upload B onto the replica that holds A. Empty:
  // balanced over the target. Calls naming a handle go to its replica whatever this says.
  std::string replica;
};

// Caller-owned memory that a streamed C is written into (GemmClient::GemmStream's c_into).
struct CBuffer {
  char* data = nullptr;
  size_t capacity = 0;  // bytes
};

// A GEMM's A and B bytes in the caller's memory (GemmClient::GemmInPlace).
struct OperandBytes {
  const void* a = nullptr;
  size_t a_bytes = 0;
  const void* b = nullptr;
  size_t b_bytes = 0;
};

// One problem of GemmClient::GemmGrouped: its dimensions and its operands as stored (A m×k, or
// k×m with transpose_a; B k×n, or n×k with transpose_b) in the grouped request's dtype, and C_in
// (m×n of its c_dtype) read only with beta ≠ 0. The views must stay valid during the call.
struct GroupedOperands {
  uint32_t m = 0, n = 0, k = 0;
  std::string_view a, b, c_in;
};

using GemmStreamWriter = grpc::ClientReaderWriter<v1::GemmStreamRequest, v1::GemmStreamResponse>;

// One GemmStreamResponse as GemmClient::OpenStream's stream reads it: a chunk of C goes from
// gRPC's buffer straight into the buffer `c_of` names for its GEMM, copied once (a
// GemmStreamResponse would hold it in a string first, one more copy of every C). An answer is
// expected in the form protobuf writes it (gemm_id, then one chunk: offset, then data; or one
// done); any other form is a `problem`.
// Thread safety: one Read at a time fills it; c_of runs inside that Read, on its thread.
struct StreamAnswer {
  // The reader's: C's buffer of GEMM `gemm_id`; false if that GEMM is not in flight.
  std::function<bool(uint64_t gemm_id, CBuffer* c)> c_of;

  // What one Read took: a chunk (already in C's buffer) or a done, unless `problem` says why
  // the answer could not be taken (a chunk or done of a GEMM not in flight, a chunk past the
  // end of its C: not written; another form; bytes that do not parse). A reader breaks the
  // stream on a problem: what an answer with one may have written into a C is never answered
  // as that C.
  uint64_t gemm_id = 0;
  bool has_chunk = false;
  bool has_done = false;
  v1::GemmDone done;
  std::string problem;
};
}  // namespace hgemm

namespace grpc {
// How gRPC reads a StreamAnswer (gemm_stream.cc). Always OK: bytes that do not parse become the
// answer's problem, which the reader turns into a broken stream (a failed Read would leave the
// GEMMs in flight unanswered).
template <>
class SerializationTraits<hgemm::StreamAnswer, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer, hgemm::StreamAnswer* answer);
};
}  // namespace grpc

namespace hgemm {

// A GemmStream that writes serialized GemmStreamRequests (StreamedGemmMessages' wire form) and
// reads StreamAnswers.
using GemmAnswerStream = grpc::ClientReaderWriter<grpc::ByteBuffer, StreamAnswer>;

// The messages of one GEMM on a GemmStream, one at a time: its header (tagged `gemm_id`), then
// A and B in chunks of `chunk_bytes` (none for an operand given by handle). `detached`: A and B
// read from the caller's memory it names instead of the request's bytes (an operand it leaves
// null: the request's). Thread safety: one user. REQUIRES: `request` and the memory `detached`
// names outlive it.
class StreamedGemmMessages {
 public:
  StreamedGemmMessages(const v1::GemmRequest& request, uint64_t gemm_id, int64_t chunk_bytes,
                       const OperandBytes& detached = {})
      : request_(request), gemm_id_(gemm_id), chunk_bytes_(chunk_bytes), detached_(detached) {}
  // The next message into *message; false when there are none left.
  bool Next(v1::GemmStreamRequest* message);
  // The same, serialized into *wire: a chunk's data copied once, into the buffer's own memory
  // (a message would hold it in a string, copied again when gRPC serializes it).
  bool Next(grpc::ByteBuffer* wire);

 private:
  // The next message, a chunk's data left out (as *data; empty for a header).
  bool NextWithoutData(v1::GemmStreamRequest* message, std::string_view* data);

  const v1::GemmRequest& request_;
  const uint64_t gemm_id_;
  const int64_t chunk_bytes_;
  const OperandBytes detached_;
  bool header_sent_ = false;
  int operand_ = 0;    // 0: A, 1: B, 2: C_in, 3: done
  size_t offset_ = 0;  // within the operand
};

// Writes one GEMM onto an open GemmStream (StreamedGemmMessages). False once the stream is
// broken.
bool WriteStreamedGemm(const v1::GemmRequest& request, uint64_t gemm_id, int64_t chunk_bytes,
                       GemmStreamWriter* stream);

class GemmClient {
 public:
  // Balances over Connect(target, options); replicas get Connect(replica, options).
  explicit GemmClient(const std::string& target, const ConnectOptions& options = {});
  // Balances over `channel`, made for the target with `options` (replicas get
  // Connect(replica, options): pass the options the channel was made with).
  explicit GemmClient(std::shared_ptr<grpc::Channel> channel, const ConnectOptions& options = {});

  // The replica address a handle names; empty for a handle of a single server.
  static std::string ReplicaOf(const std::string& handle);
  // The replica a GEMM must run on: that of its handles (empty: none named, balanced).
  // FAILED_PRECONDITION, naming both handles and replicas, when A's and B's differ.
  static grpc::Status ReplicaOf(const v1::GemmRequest& request, std::string* replica);
  // The channel calls to `replica` take (empty: the target's): made at first use, then kept.
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& replica) const;

  // One unary Gemm call.
  grpc::Status Gemm(const v1::GemmRequest& request, v1::GemmResponse* response,
                    const CallOptions& options = {}) const;
  // The same call without copying the operands or C through protobuf strings: A and B go to
  // gRPC as slices of the caller's memory (`operands`, in place of request.a and request.b,
  // which must be unset; a null pointer sends no field), and C is copied once, out of gRPC's
  // buffers, into `c_into` (response->c() stays empty; no C is expected when it is kept on the
  // server or goes to a region). The wire is Gemm's. INTERNAL, nothing written past c_into,
  // when the server's C is not ResultBytes(request) or does not fit.
  // REQUIRES: the memory stays valid until the call returns. Why: the C ABI (Python's native
  // core) copied A, B and C twice more than hgemm_load per call (~6 ms of CPU at 2048³).
  grpc::Status GemmInPlace(const v1::GemmRequest& request, OperandBytes operands, CBuffer c_into,
                           v1::GemmResponse* response, const CallOptions& options = {}) const;

  // One grouped GEMM (GemmRequest.group) in one unary Gemm call: `form` gives what the problems
  // share (transpose_a/b, dtype, c_dtype, alpha, beta, options; its m, n, k, batch, operands
  // and group are ignored), `problems` their sizes and operands, packed in order here. On OK,
  // (*c)[i] holds problem i's C (m×n of c_dtype) and *response (if not null) the timing and
  // execution (its c moved out). INVALID_ARGUMENT before any call for an empty group or an
  // operand of the wrong size (naming "problems[i].a"); the server checks the rest.
  grpc::Status GemmGrouped(const v1::GemmRequest& form,
                           const std::vector<GroupedOperands>& problems,
                           std::vector<std::string>* c, v1::GemmResponse* response = nullptr,
                           const CallOptions& options = {}) const;

  // All `requests` on one GemmStream call (gemm_id = index) per replica they name (one call for
  // all when they name none). On return, results[i] belongs to requests[i]. The returned status
  // is the streams' (the first that failed): a GEMM can fail on its own (its results[i].status,
  // e.g. FAILED_PRECONDITION for handles on two replicas, never sent) while the streams succeed.
  // c_into (if not null, one per request): C of requests[i] is written as it arrives into
  // (*c_into)[i] instead of results[i].response.c (left empty); a chunk that would pass its
  // capacity is not written, and the returned status is INTERNAL. REQUIRES: each buffer holds
  // its 2·m·n bytes and stays alive until the call returns.
  grpc::Status GemmStream(const std::vector<const v1::GemmRequest*>& requests,
                          std::vector<StreamedGemm>* results, const CallOptions& options = {},
                          const std::vector<CBuffer>* c_into = nullptr) const;

  // Opens a GemmStream to `replica` ("": the target) with the options' metadata and deadline
  // (none when timeout is 0), for a caller that writes GEMMs onto it and reads the answers
  // itself (StreamedGemmMessages; the C ABI's persistent streams), C's chunks read into the
  // buffers of their GEMMs (StreamAnswer). REQUIRES: `context` is fresh and outlives the
  // stream, and the client outlives both.
  std::unique_ptr<GemmAnswerStream> OpenStream(const std::string& replica,
                                               const CallOptions& options,
                                               grpc::ClientContext* context) const;

  // What GemmAsync comes to: the GEMM's status (as GemmStream's or Gemm's would be) and its
  // response (C is in c_into, not in response.c()).
  using GemmDone = std::function<void(grpc::Status, v1::GemmResponse)>;
  // Starts one GEMM and returns without waiting. Unary: GemmInPlace's call (A and B sent from
  // `operands`, request.a and request.b unset; C read into c_into). `streamed`: a one-GEMM
  // GemmStream (A and B copied from `operands` into its chunks) whose C goes into c_into as it
  // arrives (a chunk past its capacity: INTERNAL).
  // `done` runs exactly once: on a gRPC thread, or on this one before returning when the GEMM
  // is refused at once (FAILED_PRECONDITION: handles on two replicas). It must not block.
  // context->TryCancel() from any thread ends the GEMM (CANCELLED); its deadline and metadata
  // are set here from `options`, and the GEMM keeps it until done has run. REQUIRES: context is
  // fresh; the operands' and c_into's memory stay alive until done runs; the client (its
  // channels) stays alive until `done` has been destroyed, which happens after the call let go
  // of the context and channel. (A gRPC callback thread must not drop the last reference to a
  // channel: gRPC would shut down its callback queue from its own thread.)
  void GemmAsync(v1::GemmRequest request, OperandBytes operands, bool streamed, CBuffer c_into,
                 const CallOptions& options, std::shared_ptr<grpc::ClientContext> context,
                 GemmDone done) const;

  // Parallel parts for the largest payloads (CallOptions::parallel_min_bytes), else Gemm for
  // small payloads, a one-GEMM GemmStream for large ones (a grouped GEMM: always Gemm);
  // returns that GEMM's status.
  grpc::Status Run(const v1::GemmRequest& request, v1::GemmResponse* response,
                   const CallOptions& options = {}) const;

  grpc::Status ListKernels(v1::ListKernelsResponse* response,
                           const CallOptions& options = {}) const;
  grpc::Status GetServerInfo(v1::ServerInfo* response, const CallOptions& options = {}) const;

  // Resident matrices. `data` holds rows·cols values of `dtype` (UNSPECIFIED: fp16; fp16 or
  // bf16: 2·rows·cols bytes), sent from where it lies. The upload goes to options.replica if set
  // (info->replica() says where it went), onto CUDA device `device_id` (< 0: the server picks).
  grpc::Status UploadMatrix(uint32_t rows, uint32_t cols, std::string_view data,
                            v1::MatrixInfo* info, uint32_t ttl_seconds = 0,
                            const std::string& label = "", const CallOptions& options = {},
                            v1::DataType dtype = v1::DATA_TYPE_UNSPECIFIED,
                            int32_t device_id = -1) const;
  // *freed_bytes (if not null): the bytes the server freed.
  grpc::Status ReleaseMatrix(const std::string& handle, const CallOptions& options = {},
                             uint64_t* freed_bytes = nullptr) const;
  // The matrices of the replica the call reaches (options.replica, or a balanced pick).
  grpc::Status ListMatrices(v1::ListMatricesResponse* response,
                            const CallOptions& options = {}) const;
  grpc::Status DownloadMatrix(const std::string& handle, std::string* data,
                              const CallOptions& options = {}) const;
  // Bytes [offset, offset + length) of a resident matrix (length 0: to its end) written into
  // caller memory as they arrive, on the handle's channel; *received (if not null): the bytes
  // written. INVALID_ARGUMENT naming the capacity, the call cancelled and nothing written past
  // it, when the bytes would not fit (known from the first chunk's total_bytes when length is
  // 0); INTERNAL when the server sends another range (one that ignores ranges).
  grpc::Status DownloadInto(const std::string& handle, uint64_t offset, uint64_t length,
                            CBuffer into, uint64_t* received,
                            const CallOptions& options = {}) const;

  // Uploads by parts (see "Parallel parts"): CreateUpload of a rows×cols matrix of `dtype`,
  // then UploadPart of `bytes` at byte `offset` (in chunks of options.chunk_bytes) on `route`
  // (0 ≤ route < options.parallel_parts: the part connection it takes; routes spread parts over
  // connections). *missing_bytes (if not null): what the upload still misses after it.
  grpc::Status CreateUpload(uint32_t rows, uint32_t cols, v1::DataType dtype, bool transient,
                            v1::MatrixInfo* info, const CallOptions& options = {}) const;
  grpc::Status UploadPart(const std::string& handle, uint64_t offset, const char* bytes,
                          uint64_t length, int route, const CallOptions& options = {},
                          uint64_t* missing_bytes = nullptr) const;
  // Bytes [offset, offset + length) of a resident matrix into `into` (which holds `length`
  // bytes), on part connection `route` as UploadPart's.
  grpc::Status DownloadRange(const std::string& handle, uint64_t offset, uint64_t length,
                             char* into, int route, const CallOptions& options = {}) const;
  // The bulk channel (see CallOptions::bulk): bytes [offset, offset + length) of the upload
  // `handle` (CreateUpload) sent from `bytes` over `lanes` connections at once, each a part
  // (*missing_bytes, if not null: what the upload still misses after them); or of a matrix
  // received into `into` (room for `length` bytes). A server with no lane to spare
  // (RESOURCE_EXHAUSTED from OpenBulk) or turning a lane's connection away (UNAVAILABLE: its
  // bulk connections are all busy) gets those bytes over gRPC instead, by UploadPart and
  // DownloadRange on as many part connections: many GEMMs at once stay correct, only slower.
  // FAILED_PRECONDITION from a server without a bulk channel, UNIMPLEMENTED from one older
  // than it; else as UploadPart and DownloadRange.
  grpc::Status BulkPut(const std::string& handle, uint64_t offset, const char* bytes,
                       uint64_t length, int lanes, const CallOptions& options = {},
                       uint64_t* missing_bytes = nullptr) const;
  grpc::Status BulkGet(const std::string& handle, uint64_t offset, uint64_t length, char* into,
                       int lanes, const CallOptions& options = {}) const;
  // Whether the replica of `handle` (or the target) offers the bulk channel and this client can
  // reach it (a TCP target); asked once per replica, then remembered.
  bool OffersBulk(const std::string& handle) const;
  // True if Run() would send this request as parallel parts: large enough, A or B inline, C
  // returned, and no alpha, beta, C input or batch (those go the old way). `detached`: A and B
  // bytes that will travel beside the request (GemmInPlace's operands), not in it.
  static bool ShouldSendParts(const v1::GemmRequest& request, const CallOptions& options,
                              const OperandBytes& detached = {});
  // The parts (and bulk lanes) each GEMM gets when `gemms_in_flight` Run()s of this client are
  // in progress: parallel_parts shared among them, so that splitting never adds connections to
  // a loaded client, whose GEMMs already fill the link; below 2, Run() sends the GEMM whole.
  static int PartsFor(int parallel_parts, int gemms_in_flight);

  // Shared memory (same host, over a "unix:" target; see client/shared_region.h): maps `bytes`
  // of the sealed memfd at `path` on the server as a region of this client (info->region() is
  // its handle), frees it, lists them.
  grpc::Status RegisterRegion(const std::string& path, int64_t bytes, const std::string& label,
                              v1::RegionInfo* info, const CallOptions& options = {}) const;
  grpc::Status UnregisterRegion(const std::string& region, const CallOptions& options = {}) const;
  grpc::Status ListRegions(v1::ListRegionsResponse* response,
                           const CallOptions& options = {}) const;

  // True if Run() would stream this request (`detached`: as for ShouldSendParts).
  static bool ShouldStream(const v1::GemmRequest& request, const CallOptions& options,
                           const OperandBytes& detached = {});

  // Bytes of the request's C (batch·m·n elements of its c_dtype, or the sum of its group's m·n:
  // 4 bytes for FP32, else 2).
  static int64_t ResultBytes(const v1::GemmRequest& request);

 private:
  // Where calls to one replica (or, for "", to the target) go.
  struct Route {
    std::string replica;
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<v1::GemmService::Stub> stub;
  };
  // The per-replica routes, shared by copies of the client. Thread-safe.
  struct Routes;

  Route RouteTo(const std::string& replica) const;
  // The route of a GEMM: its handles' replica (ReplicaOf), else options.replica.
  grpc::Status RouteOf(const v1::GemmRequest& request, const CallOptions& options,
                       Route* route) const;
  // Part connection `index` to the replica of `handle` (or the target).
  Route PartRouteFor(const std::string& handle, int index) const;
  // Run() as parallel parts; UNIMPLEMENTED from a server without CreateUpload.
  grpc::Status RunParts(const v1::GemmRequest& request, v1::GemmResponse* response,
                        const CallOptions& options) const;
  // OpenBulk on the route of `handle`, and where its lanes connect.
  grpc::Status OpenBulk(const std::string& handle, v1::BulkDirection direction, uint64_t offset,
                        uint64_t length, int lanes, const CallOptions& options,
                        v1::BulkGrant* grant, BulkEndpoint* endpoint) const;
  // One DownloadMatrix call on `route`: DownloadInto's.
  grpc::Status DownloadOn(const Route& route, const std::string& handle, uint64_t offset,
                          uint64_t length, CBuffer into, uint64_t* received,
                          const CallOptions& options) const;
  // The route of a call naming `handle` (empty: none), else of options.replica.
  Route RouteFor(const std::string& handle, const CallOptions& options) const;
  // One GemmStream call on `route` for all of `requests` (gemm_id = index); c_into as
  // GemmStream's.
  grpc::Status StreamOn(const Route& route, const std::vector<const v1::GemmRequest*>& requests,
                        std::vector<StreamedGemm>* results, const CallOptions& options,
                        const std::vector<CBuffer>* c_into) const;

  std::shared_ptr<Routes> routes_;
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_GEMM_CLIENT_H_
