// Pieces of requests that the service-level fuzz targets (service_fuzz, transport_fuzz) draw
// alike: operand bytes, handles, GemmOptions, unary Gemm requests, GemmStream headers and
// chunks, UploadMatrix messages. Thread safety: stateless.
#ifndef HGEMM_SERVER_FUZZ_FUZZ_REQUESTS_H_
#define HGEMM_SERVER_FUZZ_FUZZ_REQUESTS_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "proto/hgemm.pb.h"
#include "server/fuzz/fuzz_util.h"

namespace hgemm::fuzz {

// Mostly `exact` bytes of `fill` (when at most `limit`), else a short wrong length.
inline std::string ExactOrShort(FuzzedDataProvider& in, unsigned __int128 exact, char fill,
                                size_t limit) {
  if (in.ConsumeIntegralInRange<int>(0, 3) != 0 && exact <= limit) {
    return std::string(size_t(exact), fill);
  }
  return std::string(in.ConsumeIntegralInRange<size_t>(0, 64), fill);
}

// Mostly the exact 2·rows·cols bytes (when small), else a short wrong length.
inline std::string OperandBytes(FuzzedDataProvider& in, uint32_t rows, uint32_t cols) {
  return ExactOrShort(in, Bytes(rows, cols), '\0', 1u << 16);
}

// "", fuzz bytes, an over-long name, or mostly a handle an earlier call of the input got.
inline std::string Handle(FuzzedDataProvider& in, const std::vector<std::string>& handles) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      return "";
    case 1:
      return in.ConsumeRandomLengthString(64);
    case 2:
      return std::string(in.ConsumeIntegralInRange<size_t>(1, 100000), 'h');
    default:
      return handles.empty() ? ""
                             : handles[in.ConsumeIntegralInRange<size_t>(0, handles.size() - 1)];
  }
}

// A kernel name (known, "auto", unknown) and an accumulation (one past the enum too).
inline void Options(FuzzedDataProvider& in, v1::GemmOptions* o) {
  static const char* kKernels[] = {"", "auto", "openblas_sgemm", "nope"};
  o->set_kernel(kKernels[in.ConsumeIntegralInRange<int>(0, 3)]);
  o->set_accumulation(v1::Accumulation(in.ConsumeIntegralInRange<int>(0, 3)));
}

// A unary Gemm: boundary dimensions, A and B mostly as bytes, else handles, options, sometimes
// keep_c.
inline void UnaryRequest(FuzzedDataProvider& in, const std::vector<std::string>& handles,
                         v1::GemmRequest* r) {
  r->set_m(Dim(in));
  r->set_n(Dim(in));
  r->set_k(Dim(in));
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0)
    r->set_a_handle(Handle(in, handles));
  else
    r->set_a(OperandBytes(in, r->m(), r->k()));
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0)
    r->set_b_handle(Handle(in, handles));
  else
    r->set_b(OperandBytes(in, r->k(), r->n()));
  Options(in, r->mutable_options());
  r->set_keep_c_resident(in.ConsumeIntegralInRange<int>(0, 3) == 0);
}

// The next byte offset of each operand of a streamed GEMM, indexed by v1::Operand (A, B, C_in).
using NextOffsets = uint64_t[4];

// A GemmStream header of `id`: boundary dimensions, sometimes handles for A and B, options,
// sometimes keep_c. `next_offsets` start again at 0.
inline void StreamHeader(FuzzedDataProvider& in, uint64_t id,
                         const std::vector<std::string>& handles, NextOffsets& next_offsets,
                         v1::GemmHeader* h) {
  h->set_gemm_id(id);
  h->set_m(Dim(in));
  h->set_n(Dim(in));
  h->set_k(Dim(in));
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) h->set_a_handle(Handle(in, handles));
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) h->set_b_handle(Handle(in, handles));
  Options(in, h->mutable_options());
  h->set_keep_c_resident(in.ConsumeIntegralInRange<int>(0, 3) == 0);
  std::fill(std::begin(next_offsets), std::end(next_offsets), 0);
}

// A chunk of A or B (up to `last_operand`: OPERAND_C adds C_in) of `id`: up to one byte more
// than the largest operand the harnesses' servers take (kMaxElementsPerMatrix fp16 values), so
// that a chunk can fill or overrun any operand while an input sends no more bytes than that
// takes; mostly at the operand's next offset (advanced).
inline void StreamChunk(FuzzedDataProvider& in, uint64_t id, NextOffsets& next_offsets,
                        v1::MatrixChunk* c, v1::Operand last_operand = v1::OPERAND_B) {
  c->set_gemm_id(id);
  const int operand = in.ConsumeIntegralInRange<int>(1, int(last_operand));
  c->set_operand(v1::Operand(operand));
  c->set_offset(in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint64_t>()
                                                          : next_offsets[operand]);
  const size_t size = in.ConsumeIntegralInRange<size_t>(1, 2 * kMaxElementsPerMatrix + 1);
  c->set_data(std::string(size, '\0'));
  next_offsets[operand] += size;
}

// An UploadMatrix message of a rows x cols matrix: mostly a header when `first`, else mostly a
// chunk (the whole matrix, when small, or a fuzzed length).
inline void UploadMessage(FuzzedDataProvider& in, bool first, uint32_t rows, uint32_t cols,
                          v1::UploadMatrixRequest* m) {
  if (first ? in.ConsumeIntegralInRange<int>(0, 7) != 0
            : in.ConsumeIntegralInRange<int>(0, 7) == 0) {
    m->mutable_header()->set_rows(rows);
    m->mutable_header()->set_cols(cols);
    if (in.ConsumeBool()) m->mutable_header()->set_device_id(in.ConsumeIntegralInRange<int>(-2, 1));
    m->mutable_header()->set_label(in.ConsumeRandomLengthString(200));
  } else {
    const unsigned __int128 exact = Bytes(rows, cols);
    m->set_chunk(std::string(in.ConsumeBool() && exact <= (1u << 16)
                                 ? size_t(exact)
                                 : in.ConsumeIntegralInRange<size_t>(0, 4096),
                             '\0'));
  }
}

}  // namespace hgemm::fuzz

#endif  // HGEMM_SERVER_FUZZ_FUZZ_REQUESTS_H_
