#include "server/auth/authenticator.h"

#include <strings.h>

#include <algorithm>
#include <optional>
#include <string_view>

#include "server/core/status.h"

namespace hgemm {
namespace {

constexpr std::string_view kBearer = "Bearer ";

std::string_view View(grpc::string_ref s) { return std::string_view(s.data(), s.size()); }

}  // namespace

std::string ClientIdentity(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("x-client-id"); it != metadata.end()) {
    return "id:" + std::string(View(it->second));
  }
  std::string peer = context.peer();  // e.g. "ipv4:10.0.0.7:53172"
  return peer.substr(0, peer.rfind(':'));
}

std::string UidPrincipal(uid_t uid) { return "uid:" + std::to_string(uid); }

std::unique_ptr<Authenticator> Authenticator::Open(const AuthOptions& options,
                                                   const UnixPeers* unix_peers,
                                                   std::string* error) {
  auto auth = std::make_unique<Authenticator>();
  auth->principal_from_cert_ = options.principal_from_cert;
  auth->unix_peers_ = unix_peers;
  auth->allowed_uids_ = options.allowed_uids;
  if (!options.tokens_file.empty()) {
    auth->tokens_ = TokenTable::Open(options.tokens_file, options.refresh_period, error);
    if (!auth->tokens_) return nullptr;
  }
  return auth;
}

absl::Status Authenticator::FromCredentials(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
    const grpc::AuthContext* auth, Principal* caller) const {
  if (principal_from_cert_ && auth != nullptr && auth->IsPeerAuthenticated()) {
    const std::vector<grpc::string_ref> identity = auth->GetPeerIdentity();
    if (!identity.empty() && !identity[0].empty()) {
      caller->name = std::string(View(identity[0]));
      caller->admin = tokens_ != nullptr && tokens_->IsAdmin(caller->name);
      return absl::OkStatus();
    }
  }
  const char* wanted = principal_from_cert_ && tokens_ != nullptr
                           ? "a client certificate or \"authorization: Bearer TOKEN\" metadata"
                       : principal_from_cert_ ? "a client certificate"
                                              : "\"authorization: Bearer TOKEN\" metadata";
  auto it = metadata.find("authorization");
  if (tokens_ == nullptr || it == metadata.end()) {
    return status::Unauthenticated(std::string("authentication is required: send ") + wanted);
  }
  const std::string_view value = View(it->second);
  if (value.size() <= kBearer.size() ||
      strncasecmp(value.data(), kBearer.data(), kBearer.size()) != 0) {
    return status::Unauthenticated("the authorization metadata is not \"Bearer TOKEN\"");
  }
  std::optional<Principal> principal = tokens_->Authenticate(value.substr(kBearer.size()));
  if (!principal) {
    return status::Unauthenticated("the token is not accepted");
  }
  *caller = std::move(*principal);
  return absl::OkStatus();
}

std::optional<PeerCredentials> Authenticator::UnixPeer(
    const grpc::ServerContextBase& context) const {
  return unix_peers_ != nullptr ? unix_peers_->Find(context.peer()) : std::nullopt;
}

absl::Status Authenticator::Identify(const grpc::ServerContextBase& context,
                                     Principal* caller) const {
  const std::optional<PeerCredentials> peer = UnixPeer(context);
  if (peer && !allowed_uids_.empty() &&
      std::find(allowed_uids_.begin(), allowed_uids_.end(), peer->uid) == allowed_uids_.end()) {
    return status::PermissionDenied("uid " + std::to_string(peer->uid) +
                                    " may not call over this Unix socket (--allowed_uids)");
  }
  const auto& metadata = context.client_metadata();
  if (!enabled()) {
    // Over a Unix socket the kernel's uid comes first, so that an x-client-id can never name
    // another uid's principal nor escape this uid's quotas (RegionStore's accounts).
    std::string name = ClientIdentity(context);
    if (peer) {
      const bool named = metadata.find("x-client-id") != metadata.end();
      name = named ? UidPrincipal(peer->uid) + "/" + name : UidPrincipal(peer->uid);
    }
    *caller = Principal{std::move(name), false};
    return absl::OkStatus();
  }
  if (peer && metadata.find("authorization") == metadata.end()) {  // the kernel vouches
    const std::string name = UidPrincipal(peer->uid);
    *caller = Principal{name, tokens_ != nullptr && tokens_->IsAdmin(name)};
    return absl::OkStatus();
  }
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return FromCredentials(metadata, auth.get(), caller);
}

}  // namespace hgemm
