#include "server/auth/server_tls.h"

#include <fmt/format.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace hgemm {
namespace {

struct OpensslFree {
  void operator()(BIO* b) const { BIO_free(b); }
  void operator()(X509* x) const { X509_free(x); }
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
template <typename T>
using Owned = std::unique_ptr<T, OpensslFree>;

Owned<BIO> MemoryBio(std::string_view pem) {
  return Owned<BIO>(BIO_new_mem_buf(pem.data(), int(pem.size())));
}

// Every certificate in `pem`, in order.
std::vector<Owned<X509>> ReadCertificates(std::string_view pem) {
  std::vector<Owned<X509>> certs;
  Owned<BIO> bio = MemoryBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) certs.emplace_back(x);
  ERR_clear_error();  // the read that ended the loop
  return certs;
}

std::string NotAfter(const X509* cert) {
  Owned<BIO> out(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(out.get(), X509_get0_notAfter(cert));
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, size);
}

}  // namespace

std::string CheckKeyPair(std::string_view cert_pem, std::string_view key_pem,
                         const std::string& cert_name, const std::string& key_name) {
  const std::vector<Owned<X509>> chain = ReadCertificates(cert_pem);
  if (chain.empty()) return cert_name + ": no PEM certificate (-----BEGIN CERTIFICATE-----) in it";
  if (X509_cmp_current_time(X509_get0_notAfter(chain[0].get())) < 0) {
    return fmt::format("{}: the certificate expired ({})", cert_name, NotAfter(chain[0].get()));
  }
  Owned<BIO> bio = MemoryBio(key_pem);
  Owned<EVP_PKEY> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (!key) return key_name + ": no PEM private key in it (or it is encrypted)";
  if (X509_check_private_key(chain[0].get(), key.get()) != 1) {
    ERR_clear_error();
    return fmt::format("{}: the private key does not belong to the certificate in {}", key_name,
                       cert_name);
  }
  return "";
}

std::string CheckCaBundle(std::string_view pem, const std::string& name) {
  if (ReadCertificates(pem).empty()) {
    return name + ": no PEM certificate (-----BEGIN CERTIFICATE-----) in it";
  }
  return "";
}

ServerTls::StagedFile::~StagedFile() {
  if (fd_ >= 0) close(fd_);
}

bool ServerTls::StagedFile::Write(std::string_view contents, std::string* error) {
  const int fd = memfd_create("hgemm-tls", MFD_CLOEXEC);
  if (fd < 0) {
    *error = std::string("memfd_create: ") + std::strerror(errno);
    return false;
  }
  for (size_t done = 0; done < contents.size();) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = std::string("writing a staged TLS file: ") + std::strerror(errno);
      close(fd);
      return false;
    }
    done += n;
  }
  if (fd_ < 0) {
    fd_ = fd;
    return true;
  }
  // The path's file is swapped whole: a reader sees the old version or the new one.
  const bool swapped = dup2(fd, fd_) >= 0;
  if (!swapped) *error = std::string("staging a TLS file: dup2: ") + std::strerror(errno);
  close(fd);
  return swapped;
}

std::string ServerTls::StagedFile::path() const { return fmt::format("/proc/self/fd/{}", fd_); }

ServerTls::~ServerTls() = default;

std::unique_ptr<ServerTls> ServerTls::Start(const TlsOptions& options, std::string* error) {
  std::unique_ptr<ServerTls> tls(new ServerTls());
  std::vector<std::string> paths = {options.cert_path, options.key_path};
  const bool mtls = !options.client_ca_path.empty();
  tls->has_client_ca_ = mtls;
  if (mtls) paths.push_back(options.client_ca_path);
  tls->watch_ = FileWatch::Start(
      paths, options.refresh_period,
      [t = tls.get(), options, mtls](const std::vector<std::string>& pem) -> std::string {
        if (std::string e = CheckKeyPair(pem[0], pem[1], options.cert_path, options.key_path);
            !e.empty()) {
          return e;
        }
        if (mtls) {
          if (std::string e = CheckCaBundle(pem[2], options.client_ca_path); !e.empty()) return e;
        }
        std::string e;
        if (!t->key_.Write(pem[1], &e) || !t->cert_.Write(pem[0], &e) ||
            (mtls && !t->client_ca_.Write(pem[2], &e))) {
          return e;
        }
        if (t->staged_) spdlog::info("TLS: {} changed; new handshakes use it", options.cert_path);
        t->staged_ = true;
        return "";
      },
      error);
  if (!tls->watch_) return nullptr;

  const unsigned refresh_s =
      std::max<unsigned>(1, unsigned((options.refresh_period.count() + 999) / 1000));
  tls->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls->key_.path(), tls->cert_.path(), mtls ? tls->client_ca_.path() : "", refresh_s);
  grpc::experimental::TlsServerCredentialsOptions credentials(tls->provider_);
  credentials.watch_identity_key_cert_pairs();
  if (mtls) {
    credentials.watch_root_certs();
    credentials.set_cert_request_type(
        options.client_certificates == ClientCertificates::kRequire
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  tls->credentials_ = grpc::experimental::TlsServerCredentials(credentials);
  return tls;
}

}  // namespace hgemm
