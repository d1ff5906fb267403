#include "proto/bulk_wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace hgemm::bulk {
namespace {

void PutLittleEndian(uint64_t v, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = char((v >> (8 * i)) & 0xff);
}

uint64_t GetLittleEndian(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(in[i])) << (8 * i);
  return v;
}

// OpenSSL's error queue as text (and emptied), for a failed handshake.
std::string TlsError(const char* what) {
  std::string text = what;
  while (unsigned long e = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(e, buffer, sizeof buffer);
    text += std::string(": ") + buffer;
  }
  return text;
}

// After a failed SSL_read/SSL_write: errno as the socket call would have left it.
void SetErrnoFrom(SSL* ssl, int result) {
  const int error = SSL_get_error(ssl, result);
  if (error == SSL_ERROR_ZERO_RETURN) {
    errno = 0;  // close_notify: the end of the stream
  } else if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;  // the socket's timeout
  } else if (error != SSL_ERROR_SYSCALL || errno == 0) {
    errno = error == SSL_ERROR_SYSCALL ? 0 : EPROTO;
  }
  ERR_clear_error();
}

// Where OpenSSL decrypts (no kernel TLS), each SSL_read returns one record of at most 16 KiB
// and reads its header and its body by a syscall each. Read-ahead into a buffer of many records
// reads them with one. Where the kernel could carry TLS (its tls module is loaded), read-ahead
// stays off: bytes read ahead when the handshake ends keep OpenSSL from handing the receive side
// to the kernel.
constexpr size_t kTlsReadBufferBytes = size_t{256} << 10;

void ReadAheadUnlessKernelTls(SSL* ssl) {
  static const bool kernel_tls = access("/sys/module/tls", F_OK) == 0;
  if (kernel_tls) return;
  SSL_set_default_read_buffer_len(ssl, kTlsReadBufferBytes);
  SSL_set_read_ahead(ssl, 1);
}

}  // namespace

std::string Hello(std::string_view capability) {
  return std::string(kHelloMagic, kMagicBytes) + std::string(capability);
}

std::string EncodeFrame(const Frame& frame) {
  const std::string_view message = std::string_view(frame.message).substr(0, kMaxFrameMessageBytes);
  std::string out(kFrameHeaderBytes, '\0');
  PutLittleEndian(frame.code, 4, out.data());
  PutLittleEndian(message.size(), 4, out.data() + 4);
  PutLittleEndian(frame.value, 8, out.data() + 8);
  out.append(message);
  return out;
}

Connection::Connection(int fd) : fd_(fd) {
  const int one = 1;
  (void)setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // fails on a non-TCP fd
}

Connection& Connection::operator=(Connection&& other) noexcept {
  std::swap(fd_, other.fd_);
  std::swap(ssl_, other.ssl_);
  return *this;
}

Connection::~Connection() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (fd_ >= 0) close(fd_);
}

bool Connection::kernel_tls_send() const {
  return ssl_ != nullptr && BIO_get_ktls_send(SSL_get_wbio(ssl_));
}

bool Connection::kernel_tls_receive() const {
  return ssl_ != nullptr && BIO_get_ktls_recv(SSL_get_rbio(ssl_));
}

std::string Connection::HandshakeAsServer(SSL_CTX* context) {
  ssl_ = SSL_new(context);
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) return TlsError("SSL_new");
  ReadAheadUnlessKernelTls(ssl_);
  if (SSL_accept(ssl_) != 1) return TlsError("TLS handshake");
  return "";
}

std::string Connection::HandshakeAsClient(SSL_CTX* context, const std::string& server_name) {
  ssl_ = SSL_new(context);
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) return TlsError("SSL_new");
  ReadAheadUnlessKernelTls(ssl_);
  in6_addr ip;
  const bool is_ip = inet_pton(AF_INET, server_name.c_str(), &ip) == 1 ||
                     inet_pton(AF_INET6, server_name.c_str(), &ip) == 1;
  X509_VERIFY_PARAM* check = SSL_get0_param(ssl_);
  if (is_ip) {
    if (X509_VERIFY_PARAM_set1_ip_asc(check, server_name.c_str()) != 1) {
      return TlsError("the server's address");
    }
  } else if (SSL_set_tlsext_host_name(ssl_, server_name.c_str()) != 1 ||
             SSL_set1_host(ssl_, server_name.c_str()) != 1) {
    return TlsError("the server's name");
  }
  if (SSL_connect(ssl_) != 1) {
    const long verify = SSL_get_verify_result(ssl_);
    std::string error = TlsError("TLS handshake");
    if (verify != X509_V_OK)
      error += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
    return error;
  }
  return "";
}

bool Connection::SendAll(const char* data, size_t size) {
  while (size > 0) {
    ssize_t n;
    if (ssl_ != nullptr) {
      const int chunk = int(std::min<size_t>(size, 1 << 30));
      n = SSL_write(ssl_, data, chunk);
      if (n <= 0) {
        SetErrnoFrom(ssl_, int(n));
        return false;
      }
    } else {
      n = send(fd_, data, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
    }
    data += n;
    size -= size_t(n);
  }
  return true;
}

size_t Connection::ReceiveAll(char* data, size_t size) {
  size_t got = 0;
  while (got < size) {
    ssize_t n;
    if (ssl_ != nullptr) {
      n = SSL_read(ssl_, data + got, int(std::min<size_t>(size - got, 1 << 30)));
      if (n <= 0) {
        SetErrnoFrom(ssl_, int(n));
        break;
      }
    } else {
      n = recv(fd_, data + got, size - got, MSG_WAITALL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = 0;
        break;
      }
    }
    got += size_t(n);
  }
  return got;
}

bool Connection::ReceiveFrame(Frame* frame) {
  char header[kFrameHeaderBytes];
  if (ReceiveAll(header, sizeof header) != sizeof header) return false;
  frame->code = uint32_t(GetLittleEndian(header, 4));
  const uint32_t message_bytes = uint32_t(GetLittleEndian(header + 4, 4));
  frame->value = GetLittleEndian(header + 8, 8);
  if (message_bytes > kMaxFrameMessageBytes) return false;
  frame->message.resize(message_bytes);
  return ReceiveAll(frame->message.data(), message_bytes) == message_bytes;
}

int Connection::Release() {
  if (ssl_ != nullptr) SSL_free(std::exchange(ssl_, nullptr));
  return std::exchange(fd_, -1);
}

void Connection::ShutdownSend() {
  if (ssl_ != nullptr) (void)SSL_shutdown(ssl_);
  shutdown(fd_, SHUT_WR);
}

}  // namespace hgemm::bulk
