#include "client/connect_flags.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace hgemm {

void ConnectFlags::Add(CLI::App* app) {
  app->add_flag("--tls", parsed_.tls, "TLS, checking the server against the system's CAs");
  app->add_option("--tls_ca", parsed_.tls_ca,
                  "TLS, checking the server's certificate against this PEM CA bundle")
      ->envname("HGEMM_TLS_CA");
  app->add_option("--tls_cert", parsed_.tls_cert,
                  "PEM client certificate (mutual TLS; with --tls_key)")
      ->envname("HGEMM_TLS_CERT");
  app->add_option("--tls_key", parsed_.tls_key, "PEM private key of --tls_cert")
      ->envname("HGEMM_TLS_KEY");
  app->add_option("--tls_server_name", parsed_.tls_server_name,
                  "name the server's certificate must carry, if not the --server host");
  app->add_option("--token", parsed_.token,
                  "bearer token sent as \"authorization: Bearer TOKEN\" (prefer --token_file or "
                  "HGEMM_TOKEN: command lines are visible to other users)");
  app->add_option("--token_file", token_file_,
                  "file holding the bearer token (surrounding whitespace ignored); used when "
                  "--token is not given");
  AddGrpcArgFlag(app, &parsed_.grpc_args);
}

std::string ConnectFlags::Apply(ConnectOptions* options) const {
  const bool private_subchannels = options->private_subchannels;
  *options = parsed_;
  options->private_subchannels = private_subchannels;
  // Checked here so that a bad path is a clear message, not an exception from Connect.
  if (parsed_.tls_cert.empty() != parsed_.tls_key.empty())
    return "--tls_cert and --tls_key go together";
  for (auto [flag, path] :
       {std::pair{"--tls_ca", &parsed_.tls_ca}, std::pair{"--tls_cert", &parsed_.tls_cert},
        std::pair{"--tls_key", &parsed_.tls_key}}) {
    if (!path->empty() && !std::ifstream(*path)) {
      return std::string(flag) + " " + *path + ": cannot read: " + std::strerror(errno);
    }
  }
  // As the Python client: --token, else --token_file, else $HGEMM_TOKEN.
  if (!options->token.empty()) return "";
  if (token_file_.empty()) {
    if (const char* env = std::getenv("HGEMM_TOKEN")) options->token = env;
    return "";
  }
  std::ifstream in(token_file_);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad())
    return "--token_file " + token_file_ + ": cannot read: " + std::strerror(errno);
  std::string token = std::move(text).str();
  const size_t begin = token.find_first_not_of(" \t\r\n");
  const size_t end = token.find_last_not_of(" \t\r\n");
  if (begin == std::string::npos) return "--token_file " + token_file_ + ": empty";
  options->token = token.substr(begin, end - begin + 1);
  return "";
}

}  // namespace hgemm
