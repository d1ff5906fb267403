#include "server/session/stream_assembler.h"

#include <gtest/gtest.h>

#include <map>

#include "server/testing/stream_messages.h"

namespace hgemm {
namespace {

class StreamAssemblerTest : public ::testing::Test {
 protected:
  StreamAssemblerTest() : assembler_(rules_, 1 << 20) {
    rules_.max_elements_per_matrix = 1 << 16;
    rules_.kernels = {{.name = "k", .fp32_accumulation = true, .scaled_types = kAllTypesBits}};
  }

  absl::Status Header(uint64_t id, uint32_t m, uint32_t n, uint32_t k) {
    StreamMessage message = StreamHeader(id, m, n, k);
    return Consume(message);
  }

  absl::Status Chunk(uint64_t id, ChunkOperand operand, uint64_t offset, std::string data) {
    StreamMessage message = StreamChunk(id, operand, offset, std::move(data));
    return Consume(message);
  }

  RequestRules rules_;
  StreamAssembler assembler_;
  // The operand bytes the chunks delivered so far, by gemm_id.
  std::string Delivered(uint64_t id, ChunkOperand operand) { return delivered_[{id, operand}]; }

  absl::Status Consume(StreamMessage& message) {
    absl::Status s = assembler_.Consume(message, &event_);
    if (s.ok() && event_.chunk) {
      std::string& bytes = delivered_[{event_.chunk->gemm_id, event_.chunk->operand}];
      EXPECT_EQ(event_.chunk->offset, int64_t(bytes.size()));
      bytes += event_.chunk->data;
    }
    return s;
  }

  bool Last() const { return event_.chunk && event_.chunk->last; }

  StreamEvent event_;
  std::map<std::pair<uint64_t, ChunkOperand>, std::string> delivered_;
};

TEST_F(StreamAssemblerTest, HandsOutChunksInOrderWithTheirOffsets) {
  ASSERT_TRUE(Header(7, 2, 3, 2).ok());  // A: 8 bytes, B: 12 bytes
  ASSERT_NE(event_.header, nullptr);
  EXPECT_EQ(event_.header->gemm_id, 7u);
  EXPECT_EQ(event_.header->order.job.shape.n, 3);
  EXPECT_EQ(event_.header->ChunkedBytes(), 20);
  ASSERT_TRUE(Chunk(7, ChunkOperand::kA, 0, "abc").ok());
  ASSERT_TRUE(Chunk(7, ChunkOperand::kA, 3, "defgh").ok());
  ASSERT_TRUE(Chunk(7, ChunkOperand::kB, 0, "0123456789").ok());
  EXPECT_EQ(event_.header, nullptr);
  EXPECT_FALSE(Last());
  EXPECT_EQ(assembler_.Incomplete(), std::vector<uint64_t>{7});
  ASSERT_TRUE(Chunk(7, ChunkOperand::kB, 10, "AB").ok());
  EXPECT_TRUE(Last());
  EXPECT_EQ(event_.chunk->offset, 10);
  EXPECT_EQ(Delivered(7, ChunkOperand::kA), "abcdefgh");
  EXPECT_EQ(Delivered(7, ChunkOperand::kB), "0123456789AB");
  EXPECT_TRUE(assembler_.Incomplete().empty());
}

TEST_F(StreamAssemblerTest, InterleavedGemmsAssembleIndependently) {
  ASSERT_TRUE(Header(1, 1, 1, 1).ok());
  ASSERT_TRUE(Header(2, 1, 1, 1).ok());
  ASSERT_TRUE(Chunk(2, ChunkOperand::kA, 0, "aa").ok());
  ASSERT_TRUE(Chunk(1, ChunkOperand::kA, 0, "xx").ok());
  ASSERT_TRUE(Chunk(2, ChunkOperand::kB, 0, "bb").ok());
  EXPECT_TRUE(Last());
  EXPECT_EQ(event_.chunk->gemm_id, 2u);
  ASSERT_TRUE(Chunk(1, ChunkOperand::kB, 0, "yy").ok());
  EXPECT_TRUE(Last());
  EXPECT_EQ(event_.chunk->gemm_id, 1u);
  EXPECT_EQ(Delivered(1, ChunkOperand::kA), "xx");
  EXPECT_EQ(Delivered(2, ChunkOperand::kA), "aa");
}

TEST_F(StreamAssemblerTest, ChunkOutOfOrderIsRejected) {
  ASSERT_TRUE(Header(1, 2, 2, 2).ok());
  absl::Status s = Chunk(1, ChunkOperand::kA, 4, "abcd");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk.offset"), std::string::npos) << s.message();
}

TEST_F(StreamAssemblerTest, BBeforeAIsRejected) {
  ASSERT_TRUE(Header(1, 2, 2, 2).ok());
  absl::Status s = Chunk(1, ChunkOperand::kB, 0, "abcd");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("B chunk before all of A"), std::string::npos);
}

TEST_F(StreamAssemblerTest, ChunkPastTheEndIsRejected) {
  ASSERT_TRUE(Header(1, 1, 1, 2).ok());  // A: 4 bytes
  EXPECT_EQ(Chunk(1, ChunkOperand::kA, 0, "abcde").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StreamAssemblerTest, ChunkWithoutHeaderIsRejected) {
  absl::Status s = Chunk(9, ChunkOperand::kA, 0, "ab");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no header"), std::string::npos);
}

TEST_F(StreamAssemblerTest, EmptyChunkAndMissingOperandAreRejected) {
  ASSERT_TRUE(Header(1, 1, 1, 1).ok());
  EXPECT_EQ(Chunk(1, ChunkOperand::kA, 0, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Chunk(1, ChunkOperand::kUnknown, 0, "ab").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StreamAssemblerTest, MessageOfNeitherKindIsRejected) {
  StreamMessage neither;
  absl::Status s = Consume(neither);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "message: neither a header nor a chunk");
}

TEST_F(StreamAssemblerTest, DuplicateIdInFlightIsRejectedUntilReleased) {
  ASSERT_TRUE(Header(1, 1, 1, 1).ok());
  EXPECT_EQ(Header(1, 1, 1, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Chunk(1, ChunkOperand::kA, 0, "aa").ok());
  ASSERT_TRUE(Chunk(1, ChunkOperand::kB, 0, "bb").ok());
  EXPECT_EQ(Header(1, 1, 1, 1).code(), absl::StatusCode::kInvalidArgument);  // still running
  assembler_.Release(1);
  EXPECT_TRUE(Header(1, 1, 1, 1).ok());
}

// A bad header value is that GEMM's problem, answered for it alone; it does not end the
// stream. Its chunks are dropped until the id is used again.
TEST_F(StreamAssemblerTest, BadHeaderIsRefusedForThatGemmAlone) {
  ASSERT_TRUE(Header(1, 2, 2, 2).ok());
  ASSERT_TRUE(Header(5, 0, 1, 1).ok());
  ASSERT_NE(event_.header, nullptr);
  EXPECT_EQ(event_.header->refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(event_.header->refused.message(), "gemm_id 5: m: must be at least 1");
  ASSERT_TRUE(Header(6, 4294967295u, 4294967295u, 4294967295u).ok());
  EXPECT_EQ(event_.header->refused.code(), absl::StatusCode::kResourceExhausted);
  // The client's chunks for them come anyway: dropped, no event.
  ASSERT_TRUE(Chunk(5, ChunkOperand::kA, 0, "xx").ok());
  EXPECT_EQ(event_.header, nullptr);
  EXPECT_EQ(event_.chunk, nullptr);
  ASSERT_TRUE(Chunk(6, ChunkOperand::kB, 12345, "yy").ok());
  EXPECT_EQ(event_.chunk, nullptr);
  // The good GEMM goes on.
  ASSERT_TRUE(Chunk(1, ChunkOperand::kA, 0, "aaaaaaaa").ok());
  ASSERT_TRUE(Chunk(1, ChunkOperand::kB, 0, "bbbbbbbb").ok());
  EXPECT_TRUE(Last());
  // Answered, the id is reused: chunks count again, and break the rules if out of order.
  assembler_.Release(5);
  ASSERT_TRUE(Header(5, 1, 1, 1).ok());
  EXPECT_TRUE(event_.header->refused.ok());
  EXPECT_EQ(Chunk(5, ChunkOperand::kA, 1, "xx").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StreamAssemblerTest, RefusedByTheCallerDropsItsChunksAndFreesItsBytes) {
  ASSERT_TRUE(Header(1, 256, 256, 256).ok());  // 256 KiB pending of 1 MiB
  ASSERT_TRUE(Header(2, 256, 256, 256).ok());
  ASSERT_TRUE(Header(3, 256, 256, 256).ok());
  ASSERT_TRUE(Header(4, 256, 256, 256).ok());
  ASSERT_TRUE(Header(9, 1, 1, 1).ok());
  EXPECT_EQ(event_.header->refused.code(), absl::StatusCode::kResourceExhausted);
  assembler_.Refuse(1);
  ASSERT_TRUE(Chunk(1, ChunkOperand::kA, 0, "xx").ok());
  EXPECT_EQ(event_.chunk, nullptr);
  EXPECT_EQ(assembler_.Incomplete(), (std::vector<uint64_t>{2, 3, 4}));
  ASSERT_TRUE(Header(10, 256, 256, 256).ok());
  EXPECT_TRUE(event_.header->refused.ok());
}

TEST_F(StreamAssemblerTest, OperandsByHandleNeedNoChunks) {
  StreamMessage message = StreamHeader(4, 2, 2, 2, "m-a");
  ASSERT_TRUE(Consume(message).ok());
  ASSERT_NE(event_.header, nullptr);
  EXPECT_EQ(event_.header->order.a.kind, OperandSource::Kind::kResident);
  EXPECT_EQ(event_.header->order.a.handle, "m-a");
  EXPECT_EQ(event_.header->ChunkedBytes(), 8);  // B only
  EXPECT_EQ(Chunk(4, ChunkOperand::kA, 0, "abcdefgh").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Chunk(4, ChunkOperand::kB, 0, "01234567").ok());
  EXPECT_TRUE(Last());
  EXPECT_EQ(Delivered(4, ChunkOperand::kB), "01234567");

  HeaderOf(message).gemm_id = 5;
  HeaderOf(message).spec.b = OperandSource::Resident("m-b");
  HeaderOf(message).spec.keep_c_resident = true;
  ASSERT_TRUE(Consume(message).ok());
  ASSERT_NE(event_.header, nullptr);
  EXPECT_EQ(event_.header->ChunkedBytes(), 0);  // both resident: no chunks to wait for
  EXPECT_TRUE(event_.header->keep_c());
  EXPECT_TRUE(assembler_.Incomplete().empty());
}

TEST_F(StreamAssemblerTest, PendingBytesAreBounded) {
  ASSERT_TRUE(Header(1, 256, 1, 256).ok());  // 128 KiB of A, 512 B of B
  // 2 more of 256x256 (128 KiB each side) pass 1 MiB of pending operands on the fourth.
  ASSERT_TRUE(Header(2, 256, 256, 256).ok());
  ASSERT_TRUE(Header(3, 256, 256, 256).ok());
  ASSERT_TRUE(Header(4, 256, 256, 256).ok());
  ASSERT_TRUE(Header(5, 256, 256, 256).ok());
  EXPECT_EQ(event_.header->refused.code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(StreamAssemblerTest, CInChunksComeAfterBWhenBetaIsSet) {
  StreamMessage header = StreamHeader(4, 2, 3, 2);  // A: 8 bytes, B: 12, C_in: 12
  HeaderOf(header).spec.beta = 2;
  ASSERT_TRUE(Consume(header).ok());
  ASSERT_NE(event_.header, nullptr);
  ASSERT_TRUE(event_.header->refused.ok()) << event_.header->refused;
  EXPECT_EQ(event_.header->ChunkedBytes(), 32);
  ASSERT_TRUE(Chunk(4, ChunkOperand::kA, 0, "abcdefgh").ok());
  absl::Status s = Chunk(4, ChunkOperand::kCIn, 0, "early");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("C_in chunk before all of A and B"), std::string::npos) << s.message();
}

TEST_F(StreamAssemblerTest, GemmIsCompleteWithItsLastCInByte) {
  StreamMessage header = StreamHeader(4, 2, 3, 2);
  HeaderOf(header).spec.beta = 2;
  ASSERT_TRUE(Consume(header).ok());
  ASSERT_TRUE(Chunk(4, ChunkOperand::kA, 0, "abcdefgh").ok());
  ASSERT_TRUE(Chunk(4, ChunkOperand::kB, 0, "0123456789AB").ok());
  EXPECT_FALSE(Last());
  ASSERT_TRUE(Chunk(4, ChunkOperand::kCIn, 0, "cdefghijklm").ok());
  EXPECT_FALSE(Last());
  ASSERT_TRUE(Chunk(4, ChunkOperand::kCIn, 11, "n").ok());
  EXPECT_TRUE(Last());
  EXPECT_EQ(Delivered(4, ChunkOperand::kCIn), "cdefghijklmn");
  EXPECT_TRUE(assembler_.Incomplete().empty());

  // beta 0 (or C_in by handle): no C_in chunks; the GEMM is complete with B's last byte.
  for (const char* c_in_handle : {"", "h"}) {
    assembler_.Release(4);
    delivered_.clear();
    HeaderOf(header).spec.beta = c_in_handle[0] ? 1 : 0;
    HeaderOf(header).spec.c_in =
        c_in_handle[0] ? OperandSource::Resident(c_in_handle) : OperandSource::Arriving();
    ASSERT_TRUE(Consume(header).ok());
    EXPECT_EQ(event_.header->ChunkedBytes(), 20);
    ASSERT_TRUE(Chunk(4, ChunkOperand::kA, 0, "abcdefgh").ok());
    ASSERT_TRUE(Chunk(4, ChunkOperand::kB, 0, "0123456789AB").ok());
    EXPECT_TRUE(Last());
    absl::Status s = Chunk(4, ChunkOperand::kCIn, 0, "late");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace hgemm
