// WireBytes: bytes that came off the wire, as pieces of memory that something else owns (gRPC's
// receive slices, or a string), kept alive by the WireBytes. They let a chunk's payload travel
// from the transport to where it is copied (UploadQueue::Write) without a copy on the way.
// Thread safety: immutable once built; may be moved to another thread.
#ifndef HGEMM_SERVER_CORE_WIRE_BYTES_H_
#define HGEMM_SERVER_CORE_WIRE_BYTES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hgemm {

class WireBytes {
 public:
  WireBytes() = default;
  // The bytes of `bytes`, which it keeps (implicit: a string is the plain case).
  WireBytes(std::string bytes) {
    auto owned = std::make_shared<const std::string>(std::move(bytes));
    if (!owned->empty()) pieces_.emplace_back(*owned);
    size_ = int64_t(owned->size());
    owner_ = std::move(owned);
  }
  // `pieces`, in order, valid while `owner` lives.
  WireBytes(std::vector<std::string_view> pieces, std::shared_ptr<const void> owner)
      : pieces_(std::move(pieces)), owner_(std::move(owner)) {
    for (std::string_view piece : pieces_) size_ += int64_t(piece.size());
  }

  const std::vector<std::string_view>& pieces() const { return pieces_; }
  int64_t size() const { return size_; }

 private:
  std::vector<std::string_view> pieces_;
  std::shared_ptr<const void> owner_;
  int64_t size_ = 0;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_CORE_WIRE_BYTES_H_
