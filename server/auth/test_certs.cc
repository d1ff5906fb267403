#include "server/auth/test_certs.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "server/auth/token_table.h"

namespace hgemm::testing {

std::string MakeTestCerts() {
  static std::atomic<int> made{0};
  const std::string dir = fmt::format("{}/certs-{}", std::getenv("TEST_TMPDIR"), made++);
  const std::string script =
      std::string(std::getenv("TEST_SRCDIR")) + "/hgemm_serve/tools/make_test_certs.sh";
  if (std::system((script + " " + dir).c_str()) != 0) {
    std::fprintf(stderr, "%s %s failed\n", script.c_str(), dir.c_str());
    std::abort();
  }
  return dir;
}

void ReplaceFile(const std::string& path, const std::string& contents) {
  const std::string aside = path + ".new";
  std::ofstream(aside, std::ios::binary | std::ios::trunc) << contents;
  if (std::rename(aside.c_str(), path.c_str()) != 0) throw std::runtime_error("rename " + aside);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return std::move(out).str();
}

std::string TokenLine(const std::string& principal, const std::string& token, bool admin) {
  std::string hex;
  for (uint8_t byte : Sha256(token)) hex += fmt::format("{:02x}", byte);
  return principal + " " + hex + (admin ? " admin" : "") + "\n";
}

}  // namespace hgemm::testing
