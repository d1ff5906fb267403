// SharedRegion: memory of this process that an hgemm-serve server on the same host maps too,
// for GEMMs whose operands and C travel through shared memory instead of gRPC messages
// (proto/hgemm.proto, "Shared memory").
//
// It is a memfd (memfd_create with MFD_ALLOW_SEALING), sized once and sealed against
// shrinking (F_SEAL_SHRINK, which the server requires: the file can never become shorter
// than the server's mapping), and mapped here read-write. Register it with
// GemmClient::RegisterRegion(region.path(), region.bytes(), ...) over a "unix:" target, then
// name {region, offset} in GemmRequest.a_region / b_region / c_region.
// Thread safety: the object is immutable; the bytes are the caller's to synchronize (C is
// final once the Gemm call that writes it has returned).
#ifndef HGEMM_CLIENT_SHARED_REGION_H_
#define HGEMM_CLIENT_SHARED_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

namespace hgemm {

class SharedRegion {
 public:
  // A new sealed memfd of `bytes` (≥ 1) bytes, zero-filled and mapped; nullptr with *error
  // (naming the system call and errno) if it cannot be made.
  static std::unique_ptr<SharedRegion> Create(int64_t bytes, std::string* error);
  // `bytes` rounded up to where the next part of a region starts: a cache line, and so a
  // multiple of the 16 bytes the server requires of every region offset.
  static constexpr int64_t AlignPart(int64_t bytes) { return (bytes + 63) / 64 * 64; }
  ~SharedRegion();  // unmaps and closes (the server keeps its own mapping until unregistered)
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  int fd() const { return fd_; }
  // The name the server opens it by: "/proc/<this pid>/fd/<fd>".
  std::string path() const;

 private:
  SharedRegion(int fd, uint8_t* data, int64_t bytes) : fd_(fd), data_(data), bytes_(bytes) {}
  const int fd_;
  uint8_t* const data_;
  const int64_t bytes_;
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_SHARED_REGION_H_
