#include "server/transport/lone_chunk.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "proto/hgemm.pb.h"

namespace hgemm {
namespace {

// `bytes` as a ByteBuffer of slices of at most `slice_bytes` each, as gRPC may deliver them.
grpc::ByteBuffer Buffer(const std::string& bytes, size_t slice_bytes) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += slice_bytes) {
    slices.emplace_back(bytes.data() + at, std::min(slice_bytes, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const WireBytes& chunk) {
  std::string joined;
  for (std::string_view piece : chunk.pieces()) joined += piece;
  return joined;
}

std::string RandomBytes(size_t n) {
  std::mt19937_64 rng(n);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = char(rng() | 1);  // never all zeros
  return bytes;
}

TEST(LoneChunkOf, FindsTheChunkWhateverTheSlicing) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{1} << 20}) {
    v1::PartRequest request;
    request.set_chunk(RandomBytes(size));
    const std::string wire = request.SerializeAsString();
    for (size_t slice_bytes : {size_t{1}, size_t{2}, size_t{7}, size_t{4096}, wire.size()}) {
      if (size == (size_t{1} << 20) && slice_bytes < 4096) continue;  // a million slices
      WireBytes chunk;
      ASSERT_TRUE(LoneChunkOf(Buffer(wire, slice_bytes), &chunk)) << size << " " << slice_bytes;
      EXPECT_EQ(chunk.size(), int64_t(size));
      EXPECT_EQ(Joined(chunk), request.chunk()) << size << " " << slice_bytes;
    }
  }
}

TEST(LoneChunkOf, FindsAnUploadMatrixChunk) {
  static_assert(v1::UploadMatrixRequest::kChunkFieldNumber == kLoneChunkField);
  v1::UploadMatrixRequest request;
  request.set_chunk(RandomBytes(5000));
  WireBytes chunk;
  ASSERT_TRUE(LoneChunkOf(Buffer(request.SerializeAsString(), 1024), &chunk));
  EXPECT_EQ(Joined(chunk), request.chunk());
  v1::UploadMatrixRequest header;
  header.mutable_header()->set_rows(1);
  EXPECT_FALSE(LoneChunkOf(Buffer(header.SerializeAsString(), 1024), &chunk));
}

TEST(LoneChunkOf, OutlivesTheMessage) {
  v1::PartRequest request;
  request.set_chunk(RandomBytes(100000));
  WireBytes chunk;
  {
    grpc::ByteBuffer message = Buffer(request.SerializeAsString(), 1000);
    ASSERT_TRUE(LoneChunkOf(message, &chunk));
  }
  EXPECT_EQ(Joined(chunk), request.chunk());
}

TEST(LoneChunkOf, LeavesEverythingElseToProtobuf) {
  v1::PartRequest header;
  header.mutable_header()->set_handle("m-1");
  header.mutable_header()->set_length(8);
  v1::PartRequest chunk;
  chunk.set_chunk("12345678");
  const std::string one = chunk.SerializeAsString();
  const std::vector<std::string> others = {
      header.SerializeAsString(),
      "",                                // no field set
      one + one,                         // the chunk twice (protobuf keeps the last)
      one + std::string("\x18\x01", 2),  // an unknown field after it
      std::string("\x18\x01", 2) + one,  // one before it
      one.substr(0, one.size() - 1),     // cut short
      std::string("\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),  // an over-long varint
  };
  for (const std::string& wire : others) {
    WireBytes taken("untouched");
    EXPECT_FALSE(LoneChunkOf(Buffer(wire, 3), &taken)) << wire.size();
    EXPECT_EQ(Joined(taken), "untouched");
  }
}

}  // namespace
}  // namespace hgemm
