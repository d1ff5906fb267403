// The bytes of a bulk-channel connection beside the messages (proto/hgemm.proto, "Bulk
// channel"), shared by the server and the clients: the hello a lane opens with, the status frame
// the server answers with, and blocking send/receive of whole buffers on a socket.
// Thread safety: pure functions; a socket is used by one thread at a time.
#ifndef HGEMM_PROTO_BULK_WIRE_H_
#define HGEMM_PROTO_BULK_WIRE_H_

#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace hgemm::bulk {

inline constexpr char kHelloMagic[] = "HGBULK01";  // 8 bytes, no terminator on the wire
inline constexpr size_t kMagicBytes = 8;
inline constexpr size_t kCapabilityBytes = 32;
inline constexpr size_t kHelloBytes = kMagicBytes + kCapabilityBytes;
inline constexpr size_t kFrameHeaderBytes = 16;  // code, message bytes, value
inline constexpr uint32_t kMaxFrameMessageBytes = 4096;

// A status frame: a google.rpc.Code (absl's and gRPC's numbering), its message, and a value
// (PUT: the upload's bytes still missing).
struct Frame {
  uint32_t code = 0;
  std::string message;
  uint64_t value = 0;
};

inline std::string Hello(std::string_view capability) {
  return std::string(kHelloMagic, kMagicBytes) + std::string(capability);
}

inline void PutLittleEndian(uint64_t v, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = char((v >> (8 * i)) & 0xff);
}

inline uint64_t GetLittleEndian(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(in[i])) << (8 * i);
  return v;
}

// The frame's bytes; a message longer than kMaxFrameMessageBytes is cut.
inline std::string EncodeFrame(const Frame& frame) {
  const std::string_view message =
      std::string_view(frame.message).substr(0, kMaxFrameMessageBytes);
  std::string out(kFrameHeaderBytes, '\0');
  PutLittleEndian(frame.code, 4, out.data());
  PutLittleEndian(message.size(), 4, out.data() + 4);
  PutLittleEndian(frame.value, 8, out.data() + 8);
  out.append(message);
  return out;
}

// Sends all `size` bytes (MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE). False on an
// error or a send timeout (SO_SNDTIMEO); errno says which.
inline bool SendAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= size_t(n);
  }
  return true;
}

// Receives up to `size` bytes, stopping early only at the end of the stream, an error or a
// receive timeout (SO_RCVTIMEO: errno EAGAIN). Returns the bytes received.
inline size_t ReceiveAll(int fd, char* data, size_t size) {
  size_t got = 0;
  while (got < size) {
    const ssize_t n = recv(fd, data + got, size - got, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;
      break;
    }
    got += size_t(n);
  }
  return got;
}

// Reads one frame; false if the stream ended or failed first (or announced a message over
// kMaxFrameMessageBytes).
inline bool ReceiveFrame(int fd, Frame* frame) {
  char header[kFrameHeaderBytes];
  if (ReceiveAll(fd, header, sizeof header) != sizeof header) return false;
  frame->code = uint32_t(GetLittleEndian(header, 4));
  const uint32_t message_bytes = uint32_t(GetLittleEndian(header + 4, 4));
  frame->value = GetLittleEndian(header + 8, 8);
  if (message_bytes > kMaxFrameMessageBytes) return false;
  frame->message.resize(message_bytes);
  return ReceiveAll(fd, frame->message.data(), message_bytes) == message_bytes;
}

}  // namespace hgemm::bulk

#endif  // HGEMM_PROTO_BULK_WIRE_H_
