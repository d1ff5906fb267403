// ServerTls: the TLS credentials of the gRPC port, from PEM files that are re-read on change.
//
// gRPC's FileWatcherCertificateProvider reloads certificates by itself, but it hands a broken
// file (a half-written Secret, a key of another certificate) straight to the TLS stack, which
// then fails every handshake. So the files the operator names are watched here (FileWatch),
// each version is checked with OpenSSL (the key parses and matches the certificate, which has
// not expired; the client CA bundle parses), and only a good version is copied into in-memory
// files (memfd) that gRPC's provider watches. A bad version is logged and the last good one
// keeps serving; at start it stops the server with the file's name and the problem.
// Thread safety: credentials() may be called from any thread.
#ifndef HGEMM_SERVER_AUTH_SERVER_TLS_H_
#define HGEMM_SERVER_AUTH_SERVER_TLS_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "server/auth/file_watch.h"

namespace hgemm {

// With a client CA (mTLS):
enum class ClientCertificates {
  kRequest,  // asked for; a client without one is let in, one with a bad one is not
  kRequire,  // a verified client certificate is needed to connect
};

struct TlsOptions {
  std::string cert_path;       // PEM: the server's certificate (chain)
  std::string key_path;        // PEM: its private key
  std::string client_ca_path;  // PEM: CAs of client certificates; "" for no mTLS
  ClientCertificates client_certificates = ClientCertificates::kRequest;  // with client_ca_path
  // How often the files are looked at (gRPC's reload is rounded up to whole seconds).
  std::chrono::milliseconds refresh_period{1000};
};

// Checks a certificate (chain) and its private key: "" if they are a usable pair, else the
// problem; messages name the files as `cert_name` and `key_name`.
std::string CheckKeyPair(std::string_view cert_pem, std::string_view key_pem,
                         const std::string& cert_name, const std::string& key_name);
// Checks a bundle of CA certificates: "" or the problem, naming it `name`.
std::string CheckCaBundle(std::string_view pem, const std::string& name);

class ServerTls {
 public:
  // Checks and stages the files. nullptr with *error ("PATH: problem") if they are not good.
  static std::unique_ptr<ServerTls> Start(const TlsOptions& options, std::string* error);
  ~ServerTls();

  // For ServerBuilder::AddListeningPort; serves the last good files.
  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  // Paths of the last good files, for TLS stacks other than gRPC's (the bulk channel's
  // OpenSSL); each file is replaced whole when a new good version comes. client_ca_path() is
  // "" without mTLS.
  std::string cert_path() const { return cert_.path(); }
  std::string key_path() const { return key_.path(); }
  std::string client_ca_path() const { return has_client_ca_ ? client_ca_.path() : ""; }

 private:
  // An in-memory file under a fixed path (/proc/self/fd/N) whose contents are replaced whole.
  class StagedFile {
   public:
    ~StagedFile();
    bool Write(std::string_view contents, std::string* error);
    std::string path() const;

   private:
    int fd_ = -1;
  };

  ServerTls() = default;

  StagedFile cert_, key_, client_ca_;
  bool has_client_ca_ = false;
  bool staged_ = false;  // touched only by the watch's apply: later versions are reloads
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<FileWatch> watch_;  // last: it writes the staged files until destroyed
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_AUTH_SERVER_TLS_H_
