// GemmArgs: one GEMM as a program describes it with its own memory (A, B and C_in as bytes at
// its pointers, by resident handle or in registered regions; C into its buffer, kept on the
// server or into a region) together with its options. Check() refuses what cannot be sent
// before anything is; Request() is the GemmRequest that carries it. The C ABI's
// hgemm_gemm_options_t holds one, so that every front end of the client refuses alike and
// builds its requests in one place.
// Thread safety: a value type; the memory it points to is the caller's.
#ifndef HGEMM_CLIENT_GEMM_ARGS_H_
#define HGEMM_CLIENT_GEMM_ARGS_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "client/gemm_client.h"
#include "proto/hgemm.pb.h"

namespace hgemm {

struct GemmArgs {
  // Options (GemmOptions and the GemmRequest fields of the same names).
  std::string kernel = "auto";
  v1::Accumulation accumulation = v1::ACCUMULATION_UNSPECIFIED;
  std::string request_id;
  bool verify = false;
  uint32_t verify_repetitions = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  // Stored as given (an int from C may be out of range): Check() refuses what is not a type.
  v1::DataType dtype = v1::DATA_TYPE_UNSPECIFIED;
  v1::DataType c_dtype = v1::DATA_TYPE_UNSPECIFIED;
  std::optional<float> alpha;  // unset: the server's 1
  float beta = 0;
  uint32_t batch = 0;
  // Operands named instead of passed as bytes; at most one source per operand.
  std::string a_handle;
  std::string b_handle;
  std::string c_in_handle;
  v1::RegionRef a_region, b_region, c_in_region, c_region;  // an empty region: none
  const void* c_in = nullptr;  // C_in's bytes, read by each call (with beta != 0)
  size_t c_in_bytes = 0;

  // Check()'s c_capacity for a C kept on the server: it needs no room here.
  static constexpr size_t kCKept = SIZE_MAX;
  // Whether this GEMM may name regions at all (only Gemm calls take them).
  enum class Regions { kRefused, kTaken };

  // INVALID_ARGUMENT naming the argument when the types, the bytes of A and B passed in
  // `operands` (none for an operand named by handle or region), C_in's bytes or C's room
  // (c_capacity: the caller's buffer; 0 with c_region; kCKept) do not fit an m×n×k GEMM of these
  // types, or an operand has two sources; OK otherwise.
  grpc::Status Check(uint32_t m, uint32_t n, uint32_t k, const OperandBytes& operands,
                     size_t c_capacity, Regions regions = Regions::kRefused) const;

  // Check() for the form of a grouped GEMM (GemmClient::GemmGrouped): each problem brings its
  // own operands and C_in, so the form names none and has no batch. kNotAGroupForm otherwise.
  grpc::Status CheckGroupForm() const;
  static const grpc::Status kNotAGroupForm;

  // Check() for an entry of the submission ring (RingClient), which carries no bytes: A and B
  // named by region or handle, C_in by region or handle, C into c_region or, with keep_c, kept.
  grpc::Status CheckRingEntry(uint32_t m, uint32_t n, uint32_t k, bool keep_c) const;

  // The request of an m×n×k GEMM (Check()ed first). A and B passed as bytes are copied into it,
  // or with `detached` only named there (GemmClient::GemmInPlace sends them from the caller's
  // memory). A C_in with beta 0 is never read, so it is not sent.
  void Request(uint32_t m, uint32_t n, uint32_t k, const OperandBytes& operands,
               v1::GemmRequest* request, OperandBytes* detached = nullptr) const;
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_GEMM_ARGS_H_
