// The bytes of a bulk-channel connection beside the messages (proto/hgemm.proto, "Bulk
// channel"), shared by the server and the clients: the hello a lane opens with, the status frame
// the server answers with, and blocking send/receive of whole buffers on a lane's connection,
// plain TCP or TLS over it (OpenSSL; the kernel's record layer, kTLS, where OpenSSL and the
// kernel offer it).
// Thread safety: a Connection is used by one thread at a time; the rest are pure functions.
#ifndef HGEMM_PROTO_BULK_WIRE_H_
#define HGEMM_PROTO_BULK_WIRE_H_

#include <openssl/ssl.h>

#include <cstdint>
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

std::string Hello(std::string_view capability);
// The frame's bytes; a message longer than kMaxFrameMessageBytes is cut.
std::string EncodeFrame(const Frame& frame);

// A lane's connection: a connected TCP socket, and the TLS session over it once a handshake
// made one. Owns both: closes them when it goes. Timeouts are the socket's (SO_RCVTIMEO,
// SO_SNDTIMEO); a call that stopped on one leaves errno EAGAIN.
class Connection {
 public:
  Connection() = default;
  // Takes `fd`, a connected socket, and turns Nagle's algorithm off on it: a lane writes whole
  // buffers, and the small writes of a TLS handshake (and of its session tickets after it)
  // would otherwise wait for the peer's delayed ACK, 40 ms each.
  explicit Connection(int fd);
  Connection(Connection&& other) noexcept { *this = std::move(other); }
  Connection& operator=(Connection&& other) noexcept;
  Connection(const Connection&) = delete;
  ~Connection();

  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }
  // Whether the kernel carries the TLS records each way (kTLS): no user-space crypto copy.
  bool kernel_tls_send() const;
  bool kernel_tls_receive() const;

  // TLS over the socket, as the server (`context` its certificate and client checks) or as the
  // client (`context` the trusted CAs and its own certificate; `server_name` the name or IP
  // address the server's certificate must carry, sent as SNI when it is a name). "" once the
  // handshake is done, else why it failed.
  std::string HandshakeAsServer(SSL_CTX* context);
  std::string HandshakeAsClient(SSL_CTX* context, const std::string& server_name);

  // Sends all `size` bytes (a closed peer is an error, not SIGPIPE). False on an error or a
  // send timeout.
  bool SendAll(const char* data, size_t size);
  // Receives up to `size` bytes, stopping early only at the end of the stream (errno 0), an
  // error or a receive timeout. Returns the bytes received.
  size_t ReceiveAll(char* data, size_t size);
  // Reads one frame; false if the stream ended or failed first (or announced a message over
  // kMaxFrameMessageBytes).
  bool ReceiveFrame(Frame* frame);
  // Ends the sending side (TLS: close_notify first); receiving goes on.
  void ShutdownSend();
  // Frees the TLS session and gives up the socket without closing it; returns it.
  int Release();

 private:
  int fd_ = -1;
  SSL* ssl_ = nullptr;
};

}  // namespace hgemm::bulk

#endif  // HGEMM_PROTO_BULK_WIRE_H_
