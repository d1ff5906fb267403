#include "server/auth/token_table.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <map>
#include <sstream>

namespace hgemm {
namespace {

bool ParseHex(std::string_view hex, std::array<uint8_t, 32>* out) {
  if (hex.size() != 2 * out->size()) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out->size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = uint8_t(hi << 4 | lo);
  }
  return true;
}

}  // namespace

std::array<uint8_t, 32> Sha256(std::string_view data) {
  std::array<uint8_t, 32> digest{};
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest.data(), &size, EVP_sha256(), nullptr);
  return digest;
}

std::string ParseTokenFile(std::string_view text, std::vector<TokenEntry>* entries) {
  entries->clear();
  std::map<std::array<uint8_t, 32>, int> line_of_hash;
  std::istringstream in{std::string(text)};
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string w; fields >> w;) words.push_back(w);
    if (words.empty()) continue;
    if (words.size() < 2 || words.size() > 3) {
      return fmt::format("line {}: expected PRINCIPAL SHA256_HEX [admin], found {} field(s)",
                         line_number, words.size());
    }
    TokenEntry entry;
    entry.principal = words[0];
    if (!ParseHex(words[1], &entry.sha256)) {
      return fmt::format(
          "line {}: the hash of {}'s token is not 64 hex digits (SHA-256; the "
          "file holds hashes, never tokens)",
          line_number, words[0]);
    }
    if (words.size() == 3) {
      if (words[2] != "admin") {
        return fmt::format("line {}: third field {} is not \"admin\"", line_number, words[2]);
      }
      entry.admin = true;
    }
    if (auto [it, fresh] = line_of_hash.emplace(entry.sha256, line_number); !fresh) {
      return fmt::format("line {}: the same token hash as line {}", line_number, it->second);
    }
    entries->push_back(std::move(entry));
  }
  return "";
}

TokenTable::TokenTable(std::vector<TokenEntry> entries)
    : entries_(std::make_shared<const std::vector<TokenEntry>>(std::move(entries))) {}

std::unique_ptr<TokenTable> TokenTable::Open(const std::string& path,
                                             std::chrono::milliseconds period, std::string* error) {
  auto table = std::make_unique<TokenTable>(std::vector<TokenEntry>{});
  table->watch_ = FileWatch::Start(
      {path}, period,
      [t = table.get(), path](const std::vector<std::string>& contents) -> std::string {
        auto entries = std::make_shared<std::vector<TokenEntry>>();
        if (std::string e = ParseTokenFile(contents[0], entries.get()); !e.empty()) {
          return path + ": " + e;
        }
        std::lock_guard<std::mutex> lock(t->mu_);
        if (t->read_once_) spdlog::info("{}: reloaded, {} token(s)", path, entries->size());
        t->read_once_ = true;
        t->entries_ = std::move(entries);
        return "";
      },
      error);
  if (!table->watch_) return nullptr;
  return table;
}

std::shared_ptr<const std::vector<TokenEntry>> TokenTable::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

std::optional<Principal> TokenTable::Authenticate(std::string_view token) const {
  const std::array<uint8_t, 32> digest = Sha256(token);
  const std::shared_ptr<const std::vector<TokenEntry>> entries = Entries();
  const TokenEntry* match = nullptr;
  for (const TokenEntry& e : *entries) {
    const bool equal = CRYPTO_memcmp(e.sha256.data(), digest.data(), digest.size()) == 0;
    if (equal) match = &e;
  }
  if (match == nullptr) return std::nullopt;
  return Principal{match->principal, match->admin};
}

bool TokenTable::IsAdmin(const std::string& principal) const {
  const std::shared_ptr<const std::vector<TokenEntry>> entries = Entries();
  for (const TokenEntry& e : *entries) {
    if (e.admin && e.principal == principal) return true;
  }
  return false;
}

}  // namespace hgemm
