#include "server/transport/lone_chunk.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace hgemm {

bool LoneChunkOf(const grpc::ByteBuffer& message, WireBytes* chunk) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!message.Dump(slices.get()).ok()) return false;
  // The tag and the length's varint: at most 11 bytes, which may straddle slices.
  uint8_t head[11];
  size_t head_size = 0;
  for (const grpc::Slice& slice : *slices) {
    const size_t take = std::min(slice.size(), sizeof(head) - head_size);
    std::copy_n(slice.begin(), take, head + head_size);
    head_size += take;
    if (head_size == sizeof(head)) break;
  }
  constexpr uint8_t kChunkTag = (kLoneChunkField << 3) | 2;  // length-delimited
  if (head_size == 0 || head[0] != kChunkTag) return false;
  uint64_t length = 0;
  size_t at = 1;
  for (int shift = 0;; shift += 7) {
    if (at == head_size || shift > 63) return false;
    const uint8_t byte = head[at++];
    length |= uint64_t(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) break;
  }
  if (length != message.Length() - at) return false;  // another field follows
  std::vector<std::string_view> pieces;
  size_t skip = at;
  for (const grpc::Slice& slice : *slices) {
    const size_t skipped = std::min(skip, slice.size());
    skip -= skipped;
    if (slice.size() > skipped) {
      pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()) + skipped,
                          slice.size() - skipped);
    }
  }
  *chunk = WireBytes(std::move(pieces), std::move(slices));
  return true;
}

}  // namespace hgemm
