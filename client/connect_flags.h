// ConnectFlags: the command-line flags with which a client binary reaches the server over TLS,
// mutual TLS and with a token (--tls, --tls_ca, --tls_cert, --tls_key, --tls_server_name,
// --token, --token_file, $HGEMM_TOKEN), and gRPC channel arguments (--grpc_arg): defined once
// for hgemm_client and hgemm_load, turned into the ConnectOptions that every channel is made
// with.
// Thread safety: none; used while parsing the command line.
#ifndef HGEMM_CLIENT_CONNECT_FLAGS_H_
#define HGEMM_CLIENT_CONNECT_FLAGS_H_

#include <CLI/CLI.hpp>

#include <string>

#include "client/gemm_client.h"

namespace hgemm {

class ConnectFlags {
 public:
  // Registers the flags on `app`, which must outlive this object's Apply().
  void Add(CLI::App* app);

  // After parsing: fills *options' TLS settings and token (--token, else the contents of
  // --token_file, else $HGEMM_TOKEN, as the Python client). "" on success, else the problem (an
  // unreadable file, a certificate without its key).
  std::string Apply(ConnectOptions* options) const;

 private:
  ConnectOptions parsed_;
  std::string token_file_;
};

}  // namespace hgemm

#endif  // HGEMM_CLIENT_CONNECT_FLAGS_H_
