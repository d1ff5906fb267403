// TokenTable: the bearer tokens the server accepts, from a tokens file (--auth_tokens_file)
// that holds their SHA-256 hashes, never the tokens:
//
//   # PRINCIPAL  SHA256_HEX_OF_TOKEN                                               [admin]
//   alice        2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90
//   ops          81b637d8fcd2c6da6359e6963113a1170de795e4b725b84d1e0b4cfd9ec58ce9  admin
//
// `#` starts a comment; blank lines are skipped. A principal may have several tokens (one line
// each: rotation without a gap); a token (hash) may appear once. `admin` principals may list and
// release every principal's resident matrices. The file is re-read when it changes (FileWatch);
// a malformed version keeps the last good table in force and is logged.
// Thread safety: all methods are thread-safe.
#ifndef HGEMM_SERVER_AUTH_TOKEN_TABLE_H_
#define HGEMM_SERVER_AUTH_TOKEN_TABLE_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/auth/file_watch.h"

namespace hgemm {

// Who a call comes from, once authenticated.
struct Principal {
  std::string name;
  bool admin = false;
};

struct TokenEntry {
  std::string principal;
  std::array<uint8_t, 32> sha256{};
  bool admin = false;
};

// SHA-256 of `data`.
std::array<uint8_t, 32> Sha256(std::string_view data);

// Parses a tokens file: "" with *entries filled, else "line N: what is wrong".
std::string ParseTokenFile(std::string_view text, std::vector<TokenEntry>* entries);

class TokenTable {
 public:
  // Reads `path` now, then every `period`. nullptr with *error ("PATH: line N: ...", or why it
  // can't be read) if the file is not a good tokens file now.
  static std::unique_ptr<TokenTable> Open(const std::string& path, std::chrono::milliseconds period,
                                          std::string* error);

  // A table of `entries`, never re-read (tests).
  explicit TokenTable(std::vector<TokenEntry> entries);

  // The principal whose token `token` is, or nothing. Compares the token's hash with every
  // entry in constant time, whether or not an earlier one matched.
  std::optional<Principal> Authenticate(std::string_view token) const;

  // True if some line of `principal` says admin (for principals taken from certificates).
  bool IsAdmin(const std::string& principal) const;

 private:
  std::shared_ptr<const std::vector<TokenEntry>> Entries() const;

  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<TokenEntry>> entries_;  // guarded by mu_; replaced whole
  bool read_once_ = false;            // guarded by mu_; later reads are reloads
  std::unique_ptr<FileWatch> watch_;  // last: it calls into the above until destroyed
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_AUTH_TOKEN_TABLE_H_
