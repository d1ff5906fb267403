// The request model of the core: one GEMM as its client described it (GemmSpec: a unary
// GemmRequest, a stream's GemmHeader or a ring entry, every field as sent but in the core's
// vocabulary), and the same GEMM once validated (GemmOrder: a job, where each operand comes
// from, where C goes). The transport builds a GemmSpec from a wire message at its edge
// (server/transport/convert.h), the submission ring builds one from its entry; ValidateGemm
// (validation.h) checks it once and makes the GemmOrder that GemmCore admits and runs. Beside
// them, the other requests the core takes as sent: a resident matrix's header (MatrixSpec) and
// a region to register (RegionSpec). No protobuf, no gRPC.
// Thread safety: plain values.
#ifndef HGEMM_SERVER_SESSION_GEMM_SPEC_H_
#define HGEMM_SERVER_SESSION_GEMM_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/accumulation.h"
#include "server/core/job.h"
#include "server/core/shape.h"

namespace hgemm {

// Where the bytes of one operand come from.
struct OperandSource {
  enum class Kind {
    kInline,    // `data`: `bytes` bytes the caller keeps alive until the GEMM is answered
    kResident,  // `handle`: a resident matrix of the owner (a transient one is released once
                // the GEMM has run)
    kArriving,  // in pieces, after admission, into an ArrivingBuffer on the GEMM's device
    kRegion,    // `handle`: a shared-memory or CUDA IPC region of the owner, from byte `offset`
    kNone,      // no bytes: an operand the GEMM does not have (C_in without beta)
  };
  Kind kind = Kind::kInline;
  const uint16_t* data = nullptr;  // kInline: the elements, whatever their type
  int64_t bytes = 0;               // kInline: how many bytes `data` holds
  std::string handle;
  uint64_t offset = 0;  // kRegion

  // `bytes` viewed in place, not copied.
  static OperandSource Inline(std::string_view bytes) {
    return {Kind::kInline, reinterpret_cast<const uint16_t*>(bytes.data()), int64_t(bytes.size())};
  }
  static OperandSource Resident(std::string handle) {
    return {Kind::kResident, nullptr, 0, std::move(handle)};
  }
  static OperandSource Arriving() { return {Kind::kArriving}; }
  static OperandSource Region(std::string region, uint64_t offset) {
    return {Kind::kRegion, nullptr, 0, std::move(region), offset};
  }
  static OperandSource None() { return {Kind::kNone}; }
};

// Where C goes.
struct ResultSink {
  enum class Kind {
    kHost,          // into host memory the caller sets as job().c before Run
    kKeepResident,  // stays on the device as a new resident matrix of the owner
    kRegion,        // into the owner's shared-memory region `region` at byte `offset`
    kIntoResident,  // in place into the owner's resident matrix `region` (m×n of C's type)
  };
  Kind kind = Kind::kHost;
  uint32_t ttl_seconds = 0;  // kKeepResident: 0 is the store's default
  std::string region;        // kRegion; kIntoResident: the matrix's handle
  uint64_t offset = 0;       // kRegion
  bool transient = false;    // kKeepResident: a transient matrix (ttl_seconds unused)

  static ResultSink Host() { return {Kind::kHost, 0}; }
  static ResultSink KeepResident(uint32_t ttl_seconds, bool transient = false) {
    return {Kind::kKeepResident, ttl_seconds, {}, 0, transient};
  }
  static ResultSink Region(std::string region, uint64_t offset) {
    return {Kind::kRegion, 0, std::move(region), offset};
  }
  static ResultSink IntoResident(std::string matrix) {
    return {Kind::kIntoResident, 0, std::move(matrix)};
  }
};

// An enum field as the client sent it: the number on the wire, which a refusal names, and
// what it means here. `value` is empty when the number is 0 (the field unset, its default) or
// outside the wire's enum (`known` false: refused by validation, which names the number).
template <typename T>
struct WireEnum {
  int64_t number = 0;
  bool known = true;
  std::optional<T> value;

  static WireEnum Unset() { return {}; }
  static WireEnum Of(int64_t number, T value) { return {number, true, value}; }
  static WireEnum Unknown(int64_t number) { return {number, false, std::nullopt}; }
};

// One GEMM as its client described it, unchecked.
struct GemmSpec {
  // What refusals put before the spec's field names: "" for a GemmRequest and a ring entry,
  // "header." for a stream's GemmHeader (see Field()).
  std::string field_prefix;
  uint32_t m = 0, n = 0, k = 0;
  struct Options {
    std::string kernel;                   // "" or "auto": the server picks
    WireEnum<Accumulation> accumulation;  // unset: FP32
    std::string request_id;
    bool verify = false;              // check C before answering (server/verify)
    uint32_t verify_repetitions = 0;  // 0: the server's default
  };
  Options options;
  bool transpose_a = false;       // A is stored k×m
  bool transpose_b = false;       // B is stored n×k
  WireEnum<ElementType> dtype;    // of A and B; unset: fp16
  WireEnum<ElementType> c_dtype;  // of C (and C_in); unset: dtype's
  std::optional<float> alpha;     // unset: 1
  float beta = 0;
  uint32_t batch = 0;  // 0 and 1: one GEMM
  // A grouped GEMM's problems (then m, n, k are 0); empty: not grouped.
  struct Problem {
    uint32_t m = 0, n = 0, k = 0;
  };
  std::vector<Problem> group;
  OperandSource a, b;
  OperandSource c_in = OperandSource::None();  // read only with beta ≠ 0
  ResultSink c;  // kHost, kRegion or kIntoResident; kept resident instead with keep_c_resident
  bool keep_c_resident = false;
  uint32_t c_ttl_seconds = 0;  // of a kept C: 0 is the store's default
  bool c_transient = false;    // a kept C is a transient matrix

  // Field `name` as a refusal names it: field_prefix + name ("header.options.kernel").
  std::string Field(std::string_view name) const { return field_prefix + std::string(name); }
};

// A resident matrix's header as its client described it (UploadMatrix, CreateUpload),
// unchecked: rows·cols values of `dtype`, row-major.
struct MatrixSpec {
  uint32_t rows = 0, cols = 0;
  WireEnum<ElementType> dtype;       // unset: fp16
  std::optional<int32_t> device_id;  // the device it lives on; unset: the store picks
  uint32_t ttl_seconds = 0;          // 0: the store's default
  std::string label;
  // Where its bytes come from: kArriving (chunks after the header) or kRegion (a region of the
  // owner, read at once; UploadMatrix over a Unix socket).
  OperandSource source = OperandSource::Arriving();
};

// A region as its client asked to register it (RegisterRegion), unchecked: `byte_size` bytes
// of the file at `path` (a memfd of the caller's, "/proc/<pid>/fd/<fd>"), or of the device
// memory that `cuda_ipc` names.
struct RegionSpec {
  struct CudaIpc {
    std::string handle;  // a cudaIpcMemHandle_t's bytes
    std::string device;  // the device it lives on: its UUID or PCI bus id
  };
  std::string path;
  std::optional<CudaIpc> cuda_ipc;  // set: a CUDA IPC region (then `path` must be empty)
  uint64_t byte_size = 0;
  std::string label;
};

// One GEMM as a transport hands it over to GemmCore: validated.
struct GemmOrder {
  GemmJob job;  // validated: shape, kernel, accumulation, scales, request id (buffers unset)
  OperandSource a, b;
  // C_in (m×n of C's type), used only when job.shape.c_input (beta ≠ 0); its data is a
  // uint16_t* view of the bytes whatever C's type.
  OperandSource c_in = OperandSource::None();
  ResultSink c;
  // The call came over a Unix socket (same host): required for regions (with
  // GemmCoreOptions::regions.allow_shared_memory).
  bool over_unix_socket = false;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_GEMM_SPEC_H_
