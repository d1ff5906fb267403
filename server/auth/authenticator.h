// Authenticator: who a gRPC call comes from (the transport side of authentication; the tokens
// themselves are in TokenTable).
//
// Off (no --auth_tokens_file, no --auth_principal_from_cert), callers are told apart by what
// they say: the "x-client-id" metadata value, else their address. On, a call is from the
// principal whose token it sends as "authorization: Bearer TOKEN" or, with
// principal_from_cert, the principal named by its verified client certificate (its first
// subject alternative name, else its common name); a call with neither is UNAUTHENTICATED.
// Calls over the server's own Unix sockets (UnixPeers: the kernel's SO_PEERCRED) are more:
// a uid outside allowed_uids is PERMISSION_DENIED whatever else it sends, and the peer's uid
// is the principal "uid:N" of a call that sends no token (on); off, it is "uid:N", or
// "uid:N/id:X" for a call sending x-client-id X: one uid's callers may name themselves apart,
// but never as another uid, and their quotas are the uid's
// (RegionStore counts "A/B" against account A).
// Tokens are never logged nor echoed in a status.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_AUTH_AUTHENTICATOR_H_
#define HGEMM_SERVER_AUTH_AUTHENTICATOR_H_

#include <absl/status/status.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/server_context.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/auth/token_table.h"
#include "server/auth/unix_peers.h"

namespace hgemm {

struct AuthOptions {
  // The tokens file (see TokenTable); "": no tokens.
  std::string tokens_file;
  // A verified mTLS client certificate names the principal (SAN, else CN).
  bool principal_from_cert = false;
  // Server reflection needs a principal too (TLS ports only: see server/server.cc).
  bool protect_reflection = false;
  // How often the tokens file is looked at.
  std::chrono::milliseconds refresh_period{1000};
  // The uids that may call over the server's own Unix sockets (--allowed_uids); empty: any.
  std::vector<uid_t> allowed_uids;
};

class Authenticator {
 public:
  // Authentication off.
  Authenticator() = default;

  // On as `options` says, Unix peers known by `unix_peers` (null: none; else it must outlive
  // the Authenticator). nullptr with *error ("PATH: line N: ...") if the tokens file is bad.
  static std::unique_ptr<Authenticator> Open(const AuthOptions& options,
                                             const UnixPeers* unix_peers, std::string* error);

  // Token or certificate authentication is on (Unix peers alone do not turn it on).
  bool enabled() const { return tokens_ != nullptr || principal_from_cert_; }

  // The caller of `context`: OK with *caller set, else UNAUTHENTICATED saying what is missing.
  absl::Status Identify(const grpc::ServerContextBase& context, Principal* caller) const;

  // The kernel's word on the caller of `context` when it came over one of the server's own
  // Unix sockets; nullopt for any other call.
  std::optional<PeerCredentials> UnixPeer(const grpc::ServerContextBase& context) const;

  // Identify() with authentication on, from a call's metadata and its peer's credentials
  // (`auth` may be null: plaintext).
  absl::Status FromCredentials(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                               const grpc::AuthContext* auth, Principal* caller) const;

 private:
  std::unique_ptr<TokenTable> tokens_;  // null: no tokens file
  bool principal_from_cert_ = false;
  const UnixPeers* unix_peers_ = nullptr;
  std::vector<uid_t> allowed_uids_;
};

// The caller's self-declared identity (authentication off): "id:" + the "x-client-id" metadata
// value, else the peer's address without its port.
std::string ClientIdentity(const grpc::ServerContextBase& context);

// The principal of a Unix peer's uid: "uid:1000".
std::string UidPrincipal(uid_t uid);

}  // namespace hgemm

#endif  // HGEMM_SERVER_AUTH_AUTHENTICATOR_H_
