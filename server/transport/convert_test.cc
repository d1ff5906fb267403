#include "server/transport/convert.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

namespace hgemm {
namespace {

using Kind = OperandSource::Kind;

TEST(Convert, RequestOperandsComeFromTheirOneofs) {
  v1::GemmRequest request;
  request.set_m(2);
  request.set_n(3);
  request.set_k(4);
  request.set_a(std::string(16, '\1'));
  request.set_b_handle("");  // set, but empty: validation refuses it by name
  request.mutable_c_in_region()->set_region("r-1");
  request.mutable_c_in_region()->set_offset(64);
  request.mutable_c_region()->set_region("r-2");
  request.set_keep_c_resident(true);
  request.set_c_ttl_seconds(30);
  request.set_alpha(0);
  request.add_group()->set_k(9);
  const GemmSpec spec = ToSpec(request);
  EXPECT_EQ(spec.field_prefix, "");
  EXPECT_EQ(spec.k, 4u);
  EXPECT_EQ(spec.a.kind, Kind::kInline);
  EXPECT_EQ(spec.a.bytes, 16);
  EXPECT_EQ(static_cast<const void*>(spec.a.data), request.a().data());  // viewed, not copied
  EXPECT_EQ(spec.b.kind, Kind::kResident);
  EXPECT_EQ(spec.b.handle, "");
  EXPECT_EQ(spec.c_in.kind, Kind::kRegion);
  EXPECT_EQ(spec.c_in.handle, "r-1");
  EXPECT_EQ(spec.c_in.offset, 64u);
  EXPECT_EQ(spec.c.kind, ResultSink::Kind::kRegion);
  EXPECT_TRUE(spec.keep_c_resident);
  EXPECT_EQ(spec.c_ttl_seconds, 30u);
  ASSERT_TRUE(spec.alpha.has_value());  // alpha 0 has presence
  EXPECT_EQ(*spec.alpha, 0.0f);
  ASSERT_EQ(spec.group.size(), 1u);
  EXPECT_EQ(spec.group[0].k, 9u);

  const GemmSpec unset = ToSpec(v1::GemmRequest());
  EXPECT_EQ(unset.a.kind, Kind::kInline);  // no bytes: refused by their count
  EXPECT_EQ(unset.a.bytes, 0);
  EXPECT_EQ(unset.c_in.kind, Kind::kNone);
  EXPECT_EQ(unset.c.kind, ResultSink::Kind::kHost);
  EXPECT_FALSE(unset.alpha.has_value());
}

TEST(Convert, EnumsKeepTheirNumbers) {
  EXPECT_FALSE(FromProto(v1::DATA_TYPE_UNSPECIFIED).value.has_value());
  EXPECT_EQ(FromProto(v1::DATA_TYPE_BF16).value.value_or(ElementType::kFp16), ElementType::kBf16);
  EXPECT_EQ(FromProto(v1::DATA_TYPE_FP32).number, 3);
  const WireEnum<ElementType> unknown = FromProto(v1::DataType(77));
  EXPECT_FALSE(unknown.known);
  EXPECT_EQ(unknown.number, 77);
  EXPECT_EQ(FromProto(v1::ACCUMULATION_FP16).value.value_or(Accumulation::kFp32),
            Accumulation::kFp16);
  EXPECT_FALSE(FromProto(v1::Accumulation(-1)).known);
}

TEST(Convert, HeaderFieldsArePrefixedAndOperandsWithoutAHandleArrive) {
  v1::GemmStreamRequest message;
  v1::GemmHeader* header = message.mutable_header();
  header->set_gemm_id(7);
  header->set_m(2);
  header->set_b_handle("m-b");
  header->mutable_options()->set_kernel("k");
  const StreamMessage read = ToStreamMessage(message);
  const auto* h = std::get_if<StreamMessage::Header>(&read.content);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->gemm_id, 7u);
  EXPECT_EQ(h->spec.Field("options.kernel"), "header.options.kernel");
  EXPECT_EQ(h->spec.options.kernel, "k");
  EXPECT_EQ(h->spec.a.kind, Kind::kArriving);
  EXPECT_EQ(h->spec.b.kind, Kind::kResident);
  EXPECT_EQ(h->spec.c_in.kind, Kind::kArriving);

  v1::GemmStreamRequest neither;
  EXPECT_TRUE(std::holds_alternative<std::monostate>(ToStreamMessage(neither).content));
}

// A chunk's bytes change hands, never copied: the session sees the buffer the wire filled.
TEST(Convert, ChunksAreMovedNotCopied) {
  v1::GemmStreamRequest stream;
  v1::MatrixChunk* chunk = stream.mutable_chunk();
  chunk->set_gemm_id(3);
  chunk->set_operand(v1::OPERAND_C);
  chunk->set_offset(uint64_t{1} << 63);
  chunk->set_data(std::string(4096, 'x'));
  const char* bytes = chunk->data().data();
  StreamMessage read = ToStreamMessage(stream);
  const auto* c = std::get_if<StreamMessage::Chunk>(&read.content);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->operand, ChunkOperand::kCIn);
  EXPECT_EQ(c->offset, uint64_t{1} << 63);
  EXPECT_EQ(c->data.data(), bytes);
  stream.mutable_chunk()->set_operand(v1::Operand(9));
  read = ToStreamMessage(stream);
  EXPECT_EQ(std::get<StreamMessage::Chunk>(read.content).operand, ChunkOperand::kUnknown);

  v1::UploadMatrixRequest upload;
  upload.set_chunk(std::string(4096, 'y'));
  bytes = upload.chunk().data();
  const UploadMessage upload_read = ToUploadMessage(upload);
  const auto* wire = std::get_if<WireBytes>(&upload_read.content);
  ASSERT_NE(wire, nullptr);
  ASSERT_EQ(wire->pieces().size(), 1u);
  EXPECT_EQ(wire->pieces()[0].data(), bytes);
  EXPECT_EQ(wire->size(), 4096);

  v1::PartRequest part;
  part.set_chunk(std::string(4096, 'z'));
  bytes = part.chunk().data();
  const PartMessage part_read = ToPartMessage(part);
  wire = std::get_if<WireBytes>(&part_read.content);
  ASSERT_NE(wire, nullptr);
  EXPECT_EQ(wire->pieces()[0].data(), bytes);
}

TEST(Convert, MatrixHeaders) {
  v1::UploadMatrixRequest message;
  v1::MatrixHeader* header = message.mutable_header();
  header->set_rows(3);
  header->set_cols(5);
  header->set_device_id(0);
  header->set_dtype(v1::DataType(9));
  header->mutable_region()->set_region("r-1");
  header->mutable_region()->set_offset(128);
  const UploadMessage read = ToUploadMessage(message);
  const auto* spec = std::get_if<MatrixSpec>(&read.content);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->cols, 5u);
  ASSERT_TRUE(spec->device_id.has_value());  // set, to device 0
  EXPECT_EQ(*spec->device_id, 0);
  EXPECT_FALSE(spec->dtype.known);
  EXPECT_EQ(spec->source.kind, Kind::kRegion);
  EXPECT_EQ(spec->source.offset, 128u);
  EXPECT_FALSE(ToSpec(v1::MatrixHeader()).device_id.has_value());
  EXPECT_EQ(ToSpec(v1::MatrixHeader()).source.kind, Kind::kArriving);

  v1::PartRequest part;
  part.mutable_header()->set_handle("m-1");
  part.mutable_header()->set_length(8);
  const PartMessage part_read = ToPartMessage(part);
  const auto* part_spec = std::get_if<PartSpec>(&part_read.content);
  ASSERT_NE(part_spec, nullptr);
  EXPECT_EQ(part_spec->handle, "m-1");
  EXPECT_EQ(part_spec->length, 8u);
}

}  // namespace
}  // namespace hgemm
