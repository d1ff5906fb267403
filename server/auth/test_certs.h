// Test helpers: certificates made at test time by tools/make_test_certs.sh (Debian's openssl;
// see its header for the names), and small file utilities for rotation tests.
// Thread safety: MakeTestCerts() is not; call it from the test's main thread.
#ifndef HGEMM_SERVER_AUTH_TEST_CERTS_H_
#define HGEMM_SERVER_AUTH_TEST_CERTS_H_

#include <string>

namespace hgemm::testing {

// A fresh directory under $TEST_TMPDIR holding the test certificates; aborts the test binary
// if they can't be made. REQUIRES: //tools:make_test_certs.sh in the test's data.
std::string MakeTestCerts();

// Replaces `path` with `contents` (written aside, then renamed over, as a Secret update does).
void ReplaceFile(const std::string& path, const std::string& contents);
std::string ReadFileOrDie(const std::string& path);

// A tokens-file line for `principal` with `token` ("PRINCIPAL SHA256_HEX [admin]").
std::string TokenLine(const std::string& principal, const std::string& token, bool admin = false);

}  // namespace hgemm::testing

#endif  // HGEMM_SERVER_AUTH_TEST_CERTS_H_
