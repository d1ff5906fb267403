// The persistent stream's wire forms, on bytes made here: StreamAnswer (a GemmStreamResponse read
// with C's chunk written straight into its GEMM's buffer) against protobuf's own serialization,
// including what a broken server could send (a GEMM not in flight, a chunk past C's end, fields
// out of order, bytes that do not parse); and StreamedGemmMessages' serialized form, which must
// parse as the very GemmStreamRequests its message form gives.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/gemm_client.h"

namespace hgemm {
namespace {

grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string BytesOf(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

std::string Chunk(uint64_t gemm_id, uint64_t offset, const std::string& data) {
  v1::GemmStreamResponse response;
  response.set_gemm_id(gemm_id);
  response.mutable_chunk()->set_offset(offset);
  response.mutable_chunk()->set_data(data);
  return response.SerializeAsString();
}

class StreamAnswerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.assign(16, '#');
    answer_.c_of = [this](uint64_t gemm_id, CBuffer* c) {
      if (gemm_id != in_flight_) return false;
      *c = CBuffer{c_.data(), c_.size()};
      return true;
    };
  }
  void Read(const std::string& bytes) {
    grpc::ByteBuffer buffer = BufferOf(bytes);
    ASSERT_TRUE((grpc::SerializationTraits<StreamAnswer>::Deserialize(&buffer, &answer_).ok()));
  }

  uint64_t in_flight_ = 7;
  std::string c_;
  StreamAnswer answer_;
};

TEST_F(StreamAnswerTest, AChunkGoesIntoItsGemmsBufferAtItsOffset) {
  Read(Chunk(7, 4, "abcd"));
  EXPECT_EQ(answer_.problem, "");
  EXPECT_TRUE(answer_.has_chunk);
  EXPECT_FALSE(answer_.has_done);
  EXPECT_EQ(answer_.gemm_id, 7u);
  EXPECT_EQ(c_, "####abcd########");
  Read(Chunk(7, 12, "wxyz"));  // ends at C's last byte
  EXPECT_EQ(answer_.problem, "");
  EXPECT_EQ(c_, "####abcd####wxyz");
}

TEST_F(StreamAnswerTest, GemmIdAndOffsetZeroAreTheFieldsProtobufLeavesOut) {
  in_flight_ = 0;
  const std::string bytes = Chunk(0, 0, "ab");
  ASSERT_EQ(bytes.size(), 6u);  // chunk{data} alone: no gemm_id, no offset
  Read(bytes);
  EXPECT_EQ(answer_.problem, "");
  EXPECT_EQ(c_, "ab##############");
}

TEST_F(StreamAnswerTest, ADoneCarriesItsStatusAndTiming) {
  v1::GemmStreamResponse response;
  response.set_gemm_id(7);
  response.mutable_done()->set_status_code(5);
  response.mutable_done()->set_status_message("no such matrix");
  response.mutable_done()->mutable_timing()->set_kernel_ms(1.5);
  Read(response.SerializeAsString());
  EXPECT_EQ(answer_.problem, "");
  EXPECT_TRUE(answer_.has_done);
  EXPECT_FALSE(answer_.has_chunk);
  EXPECT_EQ(answer_.gemm_id, 7u);
  EXPECT_EQ(answer_.done.status_code(), 5);
  EXPECT_EQ(answer_.done.status_message(), "no such matrix");
  EXPECT_EQ(answer_.done.timing().kernel_ms(), 1.5);
  Read(Chunk(7, 0, "a"));  // the next Read starts afresh
  EXPECT_FALSE(answer_.has_done);
  EXPECT_EQ(answer_.done.status_message(), "");
}

TEST_F(StreamAnswerTest, FieldsItDoesNotKnowAreSkipped) {
  v1::GemmStreamResponse response;
  response.set_gemm_id(7);
  response.mutable_chunk()->set_offset(2);
  response.mutable_chunk()->set_data("xy");
  response.mutable_chunk()->set_total_bytes(16);
  // An unknown field 99 (varint) after the chunk, as a newer server might send.
  Read(response.SerializeAsString() + std::string("\x98\x06\x01", 3));
  EXPECT_EQ(answer_.problem, "");
  EXPECT_EQ(c_, "##xy############");
}

TEST_F(StreamAnswerTest, AChunkOfAGemmNotInFlightIsAProblemAndWritesNothing) {
  Read(Chunk(8, 0, "abcd"));
  EXPECT_EQ(answer_.problem, "the server answered gemm_id 8, which is not in flight");
  EXPECT_EQ(c_, std::string(16, '#'));
}

TEST_F(StreamAnswerTest, ADoneOfAGemmNotInFlightIsAProblem) {
  v1::GemmStreamResponse response;
  response.set_gemm_id(8);
  response.mutable_done()->set_status_code(0);
  Read(response.SerializeAsString());
  EXPECT_EQ(answer_.problem, "the server answered gemm_id 8, which is not in flight");
  v1::GemmStreamResponse id_after_done;  // gemm_id written after the done: still looked up
  id_after_done.set_gemm_id(7);
  response.clear_gemm_id();
  Read(response.SerializeAsString() + id_after_done.SerializeAsString());
  EXPECT_EQ(answer_.problem, "");
  EXPECT_TRUE(answer_.has_done);
}

TEST_F(StreamAnswerTest, AChunkPastTheEndOfCIsAProblemAndWritesNothing) {
  Read(Chunk(7, 13, "wxyz"));
  EXPECT_EQ(answer_.problem, "gemm_id 7: result chunk past the end of C's 16 bytes");
  Read(Chunk(7, uint64_t(-2), "wxyz"));  // an offset where 64 bits wrap
  EXPECT_EQ(answer_.problem, "gemm_id 7: result chunk past the end of C's 16 bytes");
  EXPECT_EQ(c_, std::string(16, '#'));
}

TEST_F(StreamAnswerTest, AGemmIdOrOffsetAfterTheDataItPlacesIsAProblem) {
  v1::GemmStreamResponse id_only;
  id_only.set_gemm_id(7);
  Read(Chunk(0, 0, "ab") + id_only.SerializeAsString());
  EXPECT_NE(answer_.problem.find("not in the form protobuf writes"), std::string::npos)
      << answer_.problem;

  v1::ResultChunk data_then_offset;
  data_then_offset.set_data("ab");
  std::string inner = data_then_offset.SerializeAsString() + std::string("\x08\x04", 2);
  v1::GemmStreamResponse id;
  id.set_gemm_id(7);
  Read(id.SerializeAsString() + std::string(1, '\x12') + std::string(1, char(inner.size())) +
       inner);
  EXPECT_NE(answer_.problem.find("not in the form protobuf writes"), std::string::npos)
      << answer_.problem;
}

TEST_F(StreamAnswerTest, ASecondChunkDoneOrDataIsAProblem) {
  v1::GemmStreamResponse done;
  done.mutable_done()->set_status_code(0);
  done.mutable_done()->set_request_id("r");
  for (const std::string& bytes :
       {Chunk(7, 0, "ab") + Chunk(7, 2, "cd"), done.SerializeAsString() + Chunk(7, 0, "ab"),
        Chunk(7, 0, "ab") + done.SerializeAsString(),
        done.SerializeAsString() + done.SerializeAsString()}) {
    Read(bytes);
    EXPECT_NE(answer_.problem.find("not in the form protobuf writes"), std::string::npos)
        << answer_.problem;
  }
  v1::ResultChunk two_data;
  two_data.set_data("ab");
  const std::string inner = two_data.SerializeAsString() + two_data.SerializeAsString();
  Read(std::string("\x08\x07\x12", 3) + std::string(1, char(inner.size())) + inner);
  EXPECT_NE(answer_.problem.find("not in the form protobuf writes"), std::string::npos)
      << answer_.problem;
}

TEST_F(StreamAnswerTest, BytesThatDoNotParseAreAProblem) {
  const std::string whole = Chunk(7, 4, "abcd");
  Read(whole.substr(0, whole.size() - 2));  // cut inside the data
  EXPECT_EQ(answer_.problem, "a GemmStream answer did not parse");
  EXPECT_FALSE(answer_.has_chunk);
  Read(std::string("\x12\x05\x08\x01", 4));  // a chunk shorter than it says
  EXPECT_EQ(answer_.problem, "a GemmStream answer did not parse");
  EXPECT_FALSE(answer_.has_chunk);
  Read(std::string("\x1a\x05\x08", 3));  // a done shorter than it says
  EXPECT_EQ(answer_.problem, "a GemmStream answer did not parse");
  EXPECT_FALSE(answer_.has_done);
}

// StreamedGemmMessages' two forms, message by message, for a GEMM with A inline, B borrowed,
// C_in sent (beta != 0), chunks that do not divide the operands.
TEST(StreamedGemmMessagesWire, TheSerializedFormParsesAsTheMessageForm) {
  v1::GemmRequest request;
  request.set_m(3);
  request.set_n(5);
  request.set_k(7);
  request.set_transpose_b(true);
  request.set_beta(0.5f);
  request.set_a(std::string(2 * 3 * 7, 'a'));
  request.set_c_in(std::string(2 * 3 * 5, 'c'));
  const std::string b(2 * 7 * 5, 'b');
  const OperandBytes detached{nullptr, 0, b.data(), b.size()};
  StreamedGemmMessages as_messages(request, 42, 16, detached);
  StreamedGemmMessages as_wire(request, 42, 16, detached);
  v1::GemmStreamRequest message;
  grpc::ByteBuffer wire;
  int count = 0;
  std::string a_seen, b_seen, c_in_seen;
  while (as_messages.Next(&message)) {
    ASSERT_TRUE(as_wire.Next(&wire)) << "message " << count;
    v1::GemmStreamRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(BytesOf(wire))) << "message " << count;
    EXPECT_EQ(parsed.SerializeAsString(), message.SerializeAsString()) << "message " << count;
    if (parsed.has_chunk()) {
      std::string* seen = parsed.chunk().operand() == v1::OPERAND_A   ? &a_seen
                          : parsed.chunk().operand() == v1::OPERAND_B ? &b_seen
                                                                      : &c_in_seen;
      EXPECT_EQ(parsed.chunk().offset(), seen->size());
      *seen += parsed.chunk().data();
    } else {
      EXPECT_EQ(count, 0);
      EXPECT_EQ(parsed.header().gemm_id(), 42u);
    }
    message.Clear();
    ++count;
  }
  EXPECT_FALSE(as_wire.Next(&wire));
  EXPECT_EQ(count, 1 + 3 + 5 + 2);  // header; A 42 bytes, B 70, C_in 30 in chunks of 16
  EXPECT_EQ(a_seen, request.a());
  EXPECT_EQ(b_seen, b);
  EXPECT_EQ(c_in_seen, request.c_in());
}

}  // namespace
}  // namespace hgemm
