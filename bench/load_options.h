// What one hgemm_load run is told: the shape mix, the call mode and target, which operands are
// resident, and the windows of a point (LoadOptions), with the parsers of the flags' lists.
// Thread safety: plain values and pure functions.
#ifndef HGEMM_BENCH_LOAD_OPTIONS_H_
#define HGEMM_BENCH_LOAD_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/gemm_client.h"
#include "client/gemm_dims.h"
#include "proto/hgemm.pb.h"
#include "proto/numerics/cpu_gemm.h"

namespace hgemm::bench {

// One GEMM shape of the mix; `weight` is its share of the calls.
struct Shape : GemmDims {
  int weight = 1;
  bool c_fp32 = false;  // C is fp32 (--c_dtype=fp32): twice CBytes()

  int64_t RequestBytes() const { return ABytes() + BBytes(); }  // A + B (fp16 and bf16 alike)
  int64_t ReplyBytes() const { return c_fp32 ? 2 * CBytes() : CBytes(); }  // C
  int64_t PayloadBytes() const { return RequestBytes() + ReplyBytes(); }
};

// Parses "256x256x256,2048x2048x2048:3" (MxNxK, optional ":weight", default 1).
// Returns "" or what is wrong.
std::string ParseShapes(const std::string& text, std::vector<Shape>* shapes);
// Parses "1,2,4" into positive numbers. Returns "" or what is wrong.
std::string ParseIntList(const std::string& text, std::vector<int>* values);
std::string ParseDoubleList(const std::string& text, std::vector<double>* values);

enum class Mode { kUnary, kStream };
enum class Target { kService, kEcho };
// How a service point's operands and C travel: in the gRPC messages, or (kShm, same host: a
// unix: target, a server with --allow_shared_memory) in shared-memory regions that unary Gemm
// calls name: A and B of every shape in one region registered per point, C in one per worker;
// or (kRing) the same regions named by the entries of a submission ring per worker (AttachRing),
// no gRPC call per GEMM.
enum class Transport { kGrpc, kShm, kRing };
// Which operands live on the server: none (A and B sent, C returned), B (A sent, C returned),
// all (A and B by handle, C kept on the server: only handles cross the wire).
enum class Resident { kNone, kB, kAll };
const char* ModeName(Mode mode);
const char* TargetName(Target target);
const char* TransportName(Transport transport);  // "grpc", "shm", "ring"
const char* ResidentName(Resident resident);     // "none", "b", "all"
// Parses "none", "b" or "all". Returns false for anything else.
bool ParseResident(const std::string& text, Resident* resident);

// Operand bytes that actually cross the wire per GEMM with `resident` (handles not counted).
int64_t SentBytes(const Shape& shape, Resident resident);      // A + B, A, or 0
int64_t ReceivedBytes(const Shape& shape, Resident resident);  // C, C, or 0

struct LoadOptions {
  std::vector<Shape> shapes;
  // unary: one Gemm (Echo) call per GEMM. stream: one GemmStream (EchoStream) per worker, kept
  // open for the whole point, one GEMM in flight on it at a time.
  Mode mode = Mode::kUnary;
  // Unary mode, > 1: every service GEMM goes through GemmClient::Run as this many parallel
  // parts over as many connections of its worker (CallOptions::parallel_parts); 1: one Gemm.
  int parallel_parts = 1;
  std::string kernel = "auto";
  v1::Accumulation accumulation = v1::ACCUMULATION_UNSPECIFIED;
  // Ask the server to check every C by Freivalds' method (GemmOptions.verify), with this many
  // repetitions (0: the server's default); its cost shows as the server's verify_ms.
  bool verify = false;
  int verify_repetitions = 0;
  // Layout and types of every GEMM (--transpose_a, --transpose_b, --dtype, --c_dtype); the
  // shapes' c_fp32 follow form.c_fp32.
  GemmForm form;
  // Workers per gRPC channel (each channel is its own TCP connection); 0: one channel for all.
  int workers_per_channel = 1;
  // Warm-up: at least this long and until every worker has completed a call.
  double warmup_s = 1.0;
  // A window lasts at least window_s and until it holds min_window_requests completions.
  double window_s = 1.0;
  int min_window_requests = 10;
  int stable_windows = 3;
  double stable_tolerance = 0.10;  // each window within ±10 % of the windows' mean
  int max_windows = 10;
  // Hard bound on one point (warm-up + windows); in-flight calls still finish after it.
  double max_point_s = 30;
  // Deadline of one call (unary) or of a point's streams on top of max_point_s.
  double call_timeout_s = 120;
  // Operand chunk size of stream mode (both targets).
  int64_t chunk_bytes = int64_t{1} << 20;
  // Reply chunk size the echo stream uses: set it to the server's stream_chunk_bytes.
  int64_t reply_chunk_bytes = int64_t{1} << 20;
  uint64_t seed = 20261203;
  // Resident operands (service target; the echo baseline then carries only the bytes the
  // service calls send and receive).
  Resident resident = Resident::kNone;
  // "x-client-id" of every service call (owner of the uploaded matrices when the server has no
  // authentication); "" → "hgemm_load-<pid>".
  std::string client_id;
  // TLS and token of the service's channels (the echo baseline is always plaintext).
  ConnectOptions connect;
};

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_LOAD_OPTIONS_H_
