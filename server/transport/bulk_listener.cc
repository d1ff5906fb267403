#include "server/transport/bulk_listener.h"

#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "proto/bulk_wire.h"
#include "server/core/status.h"
#include "server/core/thread_name.h"
#include "server/session/part_session.h"
#include "server/transport/tcp_listen.h"

namespace hgemm {
namespace {

constexpr int kPollMs = 100;  // how often the acceptor looks at stopping_

void SetTimeout(int fd, int option, std::chrono::milliseconds timeout) {
  timeval tv{timeout.count() / 1000, suseconds_t(timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

bool SendStatus(bulk::Connection& lane, const absl::Status& s, uint64_t value = 0) {
  const std::string frame = bulk::EncodeFrame({uint32_t(s.code()), status::Message(s), value});
  return lane.SendAll(frame.data(), frame.size());
}

using TlsContext = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;

// A server context from the files of `tls` as they are now; null and *error if they fail.
TlsContext NewServerContext(const BulkListenerOptions::Tls& tls, std::string* error) {
  TlsContext context(SSL_CTX_new(TLS_server_method()), &SSL_CTX_free);
  SSL_CTX* c = context.get();
  if (c == nullptr || SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION) != 1 ||
      SSL_CTX_use_certificate_chain_file(c, tls.cert_path.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(c, tls.key_path.c_str(), SSL_FILETYPE_PEM) != 1) {
    *error = "the server's certificate or key";
    return TlsContext(nullptr, &SSL_CTX_free);
  }
  SSL_CTX_set_options(c, SSL_OP_ENABLE_KTLS);
  // AES-128-GCM first (OpenSSL's default prefers AES-256): 10 AES rounds per block, not 14.
  SSL_CTX_set_ciphersuites(
      c, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_options(c, SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (!tls.client_ca_path.empty()) {
    if (SSL_CTX_load_verify_locations(c, tls.client_ca_path.c_str(), nullptr) != 1) {
      *error = "the client CA bundle";
      return TlsContext(nullptr, &SSL_CTX_free);
    }
    SSL_CTX_set_client_CA_list(c, SSL_load_client_CA_file(tls.client_ca_path.c_str()));
    SSL_CTX_set_verify(
        c, SSL_VERIFY_PEER | (tls.require_client_certificate ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
        nullptr);
  }
  return context;
}

// Why a receive stopped short of what it asked for.
absl::Status ShortReceive(const char* what, std::chrono::milliseconds idle_timeout) {
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    return status::Idle(
        fmt::format("bulk channel: no bytes of the {} for {} ms; the lane was "
                    "dropped",
                    what, idle_timeout.count()));
  }
  return status::InvalidArgument(what, "the connection ended before all of it came");
}

// A PUT lane as the transport of its PartSession: the session asks for reads (StartRead) and
// ends the part (Finish) from its own threads; the lane's thread does the reads it asked for.
class PutLane final : public PartTransport {
 public:
  PutLane(GemmCoreInterface& core, const BulkTicket& ticket, std::chrono::milliseconds idle)
      : session_(core, this, ticket.owner, std::chrono::duration_cast<std::chrono::seconds>(idle)) {
  }

  void StartRead() override {
    std::lock_guard<std::mutex> lock(mu_);
    read_wanted_ = true;
    changed_.notify_all();
  }

  void Finish(const absl::Status& status, int64_t missing_bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    missing_bytes_ = missing_bytes;
    finished_ = true;
    changed_.notify_all();
  }

  // Claims the ticket's part (the session's header); if that fails, its status. Else sends
  // the go-ahead frame and feeds the session the part's bytes from `fd` until it finishes:
  // its status, and in *missing_bytes the upload's bytes still missing.
  absl::Status Run(bulk::Connection& lane, const BulkTicket& ticket, HostBufferPool& pool,
                   int64_t chunk_bytes, int64_t* missing_bytes) {
    PartMessage header{PartSpec{ticket.handle, uint64_t(ticket.offset), uint64_t(ticket.length)}};
    session_.OnRead(header);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return status_;
    }
    if (!SendStatus(lane, absl::OkStatus())) session_.OnReadsDone();
    int64_t received = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return read_wanted_ || finished_; });
        if (finished_) break;
        read_wanted_ = false;
      }
      if (received == ticket.length) {
        session_.OnReadsDone();
        continue;
      }
      const int64_t size = std::min(chunk_bytes, ticket.length - received);
      auto buffer =
          std::shared_ptr<std::string>(new std::string(pool.Take(size)), [&pool](std::string* b) {
            pool.Give(std::move(*b));
            delete b;
          });
      const size_t got = lane.ReceiveAll(buffer->data(), size_t(size));
      if (got != size_t(size)) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          session_.ExpireIdle(Clock::now());
        } else {
          session_.OnReadsDone();  // the session says how many bytes of the part came
        }
        continue;
      }
      received += size;
      PartMessage chunk{WireBytes({std::string_view(buffer->data(), size_t(size))}, buffer)};
      session_.OnRead(chunk);
    }
    std::lock_guard<std::mutex> lock(mu_);
    *missing_bytes = missing_bytes_;
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool read_wanted_ = false;   // guarded by mu_
  bool finished_ = false;      // guarded by mu_
  absl::Status status_;        // guarded by mu_
  int64_t missing_bytes_ = 0;  // guarded by mu_
  PartSession session_;        // last: it calls back into the members above
};

}  // namespace

std::unique_ptr<BulkListener> BulkListener::Start(BulkListenerOptions options,
                                                  GemmCoreInterface* core, BulkGrants* grants,
                                                  ServiceMetrics* metrics, std::string* error) {
  int port = 0;
  const int fd = ListenTcp(options.address, 128, &port, error);
  if (fd < 0) return nullptr;
  return std::unique_ptr<BulkListener>(
      new BulkListener(std::move(options), core, grants, metrics, fd, port));
}

BulkListener::BulkListener(BulkListenerOptions options, GemmCoreInterface* core, BulkGrants* grants,
                           ServiceMetrics* metrics, int fd, int port)
    : options_(std::move(options)),
      core_(core),
      grants_(grants),
      metrics_(metrics),
      listen_fd_(fd),
      port_(port),
      acceptor_([this] { AcceptLoop(); }) {}

BulkListener::~BulkListener() {
  stopping_ = true;
  acceptor_.join();
  close(listen_fd_);
  std::unique_lock<std::mutex> lock(mu_);
  for (int fd : lanes_) shutdown(fd, SHUT_RDWR);  // their reads and writes fail now
  lane_ended_.wait(lock, [&] { return lanes_.empty(); });
}

void BulkListener::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMs) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (int(lanes_.size()) >= options_.max_connections && !idle_.empty()) {
      // A connection kept idle between lanes makes room: its thread stops before it claims
      // anything (Resume), so its client just connects again.
      const int kept = *idle_.begin();
      idle_.erase(idle_.begin());
      evicted_.insert(kept);
      shutdown(kept, SHUT_RDWR);
    } else if (int(lanes_.size()) >= options_.max_connections) {
      spdlog::warn("bulk channel: {} connections open (the most); one more refused", lanes_.size());
      // Best effort, without waiting: the frame, then the hello if it came (closing on unread
      // bytes would reset the connection and lose the frame).
      // Plaintext only: a TLS client then sees its handshake fail and connects again.
      if (options_.tls.cert_path.empty()) {
        bulk::Connection refused(fd);
        SetTimeout(fd, SO_SNDTIMEO, std::chrono::milliseconds(100));
        SendStatus(refused, status::QueueFull(fmt::format(
                                "bulk channel: {} connections open, the most this server serves",
                                lanes_.size())));
        char hello[bulk::kHelloBytes];
        (void)recv(fd, hello, sizeof hello, MSG_DONTWAIT);
      } else {
        close(fd);
      }
      continue;
    }
    lanes_.insert(fd);
    // Detached: the destructor waits for lanes_ to empty, which is the thread's last act.
    std::thread([this, fd] { Serve(fd); }).detach();
  }
}

bool BulkListener::Resume(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.erase(fd);
  return evicted_.erase(fd) == 0;
}

void BulkListener::Serve(int fd) {
  NameThisThread("hgemm-bulk");
  bulk::Connection lane(fd);  // released below: `fd` is closed once lanes_ forgot it
  try {
    SetTimeout(fd, SO_RCVTIMEO, options_.hello_timeout);
    SetTimeout(fd, SO_SNDTIMEO, options_.idle_timeout);
    std::string error;
    if (!options_.tls.cert_path.empty()) {
      TlsContext context = NewServerContext(options_.tls, &error);
      if (context) error = lane.HandshakeAsServer(context.get());
    }
    if (!error.empty()) {
      spdlog::info("bulk channel: TLS refused: {}", error);
    } else {
      // One lane after another while each ends whole: a client keeps its connections (and
      // their TLS sessions) for its next transfers.
      for (bool first = true; !stopping_ && ServeLane(lane, first); first = false) {
        SetTimeout(fd, SO_RCVTIMEO, options_.hello_timeout);
      }
    }
  } catch (...) {
    status::LogCurrentException("bulk channel");
  }
  lane.Release();
  std::lock_guard<std::mutex> lock(mu_);
  lanes_.erase(fd);
  close(fd);
  lane_ended_.notify_all();
}

bool BulkListener::ServeLane(bulk::Connection& lane, bool first) {
  char hello[bulk::kHelloBytes];
  if (!first) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.insert(lane.fd());
  }
  const size_t got = lane.ReceiveAll(hello, sizeof hello);
  // A kept connection that ends, says nothing for hello_timeout, or was evicted for a new
  // one between lanes is done, its hello (if one came) unclaimed.
  if (!first && (!Resume(lane.fd()) || got == 0)) return false;
  BulkTicket ticket;
  absl::Status s;
  if (got != sizeof hello) {
    s = ShortReceive("hello", options_.hello_timeout);
  } else if (std::string_view(hello, bulk::kMagicBytes) !=
             std::string_view(bulk::kHelloMagic, bulk::kMagicBytes)) {
    s = status::InvalidArgument("hello", "does not start with \"HGBULK01\"");
  } else {
    s = grants_->Claim(std::string_view(hello + bulk::kMagicBytes, bulk::kCapabilityBytes),
                       Clock::now(), &ticket);
  }
  if (!s.ok()) {
    spdlog::info("bulk channel: connection refused: {}", status::Message(s));
    SendStatus(lane, s);
    return false;
  }
  SetTimeout(lane.fd(), SO_RCVTIMEO, options_.idle_timeout);
  return ticket.direction == BulkDirection::kGet ? ServeGet(lane, ticket) : ServePut(lane, ticket);
}

bool BulkListener::ServeGet(bulk::Connection& lane, const BulkTicket& ticket) {
  ResidentMatrix m;
  absl::Status s = core_->LookupMatrix(ticket.owner, ticket.handle, "handle", &m);
  if (s.ok()) s = CheckByteRange(m, uint64_t(ticket.offset), uint64_t(ticket.length));
  if (!SendStatus(lane, s) || !s.ok()) return false;
  HostBufferPool& pool = core_->host_buffers();
  std::string piece = pool.Take(std::min(options_.chunk_bytes, ticket.length));
  int64_t at = 0;
  while (at < ticket.length) {
    const int64_t size = std::min(options_.chunk_bytes, ticket.length - at);
    s = core_->ReadMatrix(*m.buffer, ticket.offset + at, size, piece.data());
    if (!s.ok()) {
      // No frame can follow bytes: the client sees the lane end short.
      spdlog::error("bulk channel: reading matrix {}: {}", ticket.handle, status::Message(s));
      break;
    }
    if (!lane.SendAll(piece.data(), size_t(size))) break;
    at += size;
  }
  pool.Give(std::move(piece));
  if (metrics_ != nullptr) metrics_->AddTransportBytes(DataPath::kBulk, /*sent=*/true, at);
  spdlog::debug("bulk GET {} bytes [{}, {}) of {} for '{}': {}", ticket.length, ticket.offset,
                ticket.offset + ticket.length, ticket.handle, ticket.owner,
                at == ticket.length ? "sent" : fmt::format("cut after {}", at));
  return at == ticket.length;
}

bool BulkListener::ServePut(bulk::Connection& lane, const BulkTicket& ticket) {
  PutLane part(*core_, ticket, options_.idle_timeout);
  int64_t missing = 0;
  const absl::Status s =
      part.Run(lane, ticket, core_->host_buffers(), options_.chunk_bytes, &missing);
  if (metrics_ != nullptr && s.ok()) {
    metrics_->AddTransportBytes(DataPath::kBulk, /*sent=*/false, ticket.length);
  }
  spdlog::debug("bulk PUT {} bytes [{}, {}) of {} for '{}': {}", ticket.length, ticket.offset,
                ticket.offset + ticket.length, ticket.handle, ticket.owner,
                s.ok() ? "landed" : status::Message(s));
  if (!SendStatus(lane, s, s.ok() ? uint64_t(missing) : 0)) return false;
  if (s.ok()) return true;
  // A client told to stop mid-part is still sending: closing on its unread bytes would reset
  // the connection and lose the frame. Read what it sends (at most the lane's bytes) first.
  lane.ShutdownSend();
  std::string sink(64 << 10, '\0');
  for (int64_t left = ticket.length; left > 0;) {
    const size_t want = size_t(std::min<int64_t>(left, int64_t(sink.size())));
    const size_t got = lane.ReceiveAll(sink.data(), want);
    left -= int64_t(got);
    if (got < want) break;
  }
  return false;
}

}  // namespace hgemm
