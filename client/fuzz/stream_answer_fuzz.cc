// libFuzzer target: StreamAnswer, the client core's reading of a GemmStreamResponse off the wire
// (what any server may send), with C's chunks written straight into the buffers of two GEMMs in
// flight (gemm_id 0: 64 bytes, gemm_id 5: 0 bytes, as a kept C) and the input split into gRPC
// slices where the fuzzer says.
// Oracle: no access outside a buffer (ASan: each is a heap block of exactly its size);
// Deserialize is always OK; an answer taken without a problem, of bytes protobuf parses, is what
// protobuf parses from them (same gemm_id, chunk or done; a done equal to protobuf's; a chunk's
// data at its offset in C and no other byte of C written). With a problem the stream breaks, so
// only memory safety is checked then.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/gemm_client.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "FUZZ INVARIANT BROKEN: %s\n", what);
  std::abort();
}

constexpr size_t kCBytes = 64;
constexpr unsigned char kPoison = 0xa5;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hgemm;
  if (size < 1) return 0;
  // The first byte: where the rest is cut into two slices.
  const size_t cut = size > 1 ? data[0] % size : 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(bytes.substr(0, std::min(cut, bytes.size())));
  slices.emplace_back(bytes.substr(std::min(cut, bytes.size())));
  grpc::ByteBuffer buffer(slices.data(), slices.size());

  auto c = std::make_unique<unsigned char[]>(kCBytes);
  std::memset(c.get(), kPoison, kCBytes);
  auto kept = std::make_unique<unsigned char[]>(1);  // 0 bytes usable; ASan sees past-the-end
  StreamAnswer answer;
  answer.c_of = [&](uint64_t gemm_id, CBuffer* into) {
    if (gemm_id == 0)
      *into = CBuffer{reinterpret_cast<char*>(c.get()), kCBytes};
    else if (gemm_id == 5)
      *into = CBuffer{reinterpret_cast<char*>(kept.get()), 0};
    else
      return false;
    return true;
  };
  if (!grpc::SerializationTraits<StreamAnswer>::Deserialize(&buffer, &answer).ok()) {
    Fail("Deserialize returned an error (it must say problems in the answer)");
  }
  if (!answer.problem.empty()) return 0;
  v1::GemmStreamResponse parsed;
  const bool parses = parsed.ParseFromString(bytes);
  // Protobuf refuses some malformed unknown fields (a field number 0, a tag past 32 bits) that
  // StreamAnswer skips: only memory safety is checked for those.
  if (!parses) return 0;
  if (answer.gemm_id != parsed.gemm_id()) Fail("gemm_id differs from protobuf's");
  if (answer.has_done != parsed.has_done() || answer.has_chunk != parsed.has_chunk()) {
    Fail("chunk / done differ from protobuf's");
  }
  if (answer.has_done && answer.done.SerializeAsString() != parsed.done().SerializeAsString()) {
    Fail("done differs from protobuf's");
  }
  // Bytes of C outside the chunk that was placed keep their poison.
  size_t from = kCBytes, to = kCBytes;
  // A chunk without data writes nothing, wherever its offset points.
  if (answer.has_chunk && parsed.gemm_id() == 0 && !parsed.chunk().data().empty()) {
    from = parsed.chunk().offset();
    to = from + parsed.chunk().data().size();
    if (std::memcmp(c.get() + from, parsed.chunk().data().data(), to - from) != 0) {
      Fail("the chunk's data is not at its offset in C");
    }
  }
  for (size_t i = 0; i < kCBytes; ++i) {
    if ((i < from || i >= to) && c[i] != kPoison) Fail("a byte of C outside the chunk was written");
  }
  return 0;
}
