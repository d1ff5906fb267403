// The checks of certificate files (real certificates from tools/make_test_certs.sh); the TLS
// handshakes themselves are tested end to end in server/security_test.cc.
#include "server/auth/server_tls.h"

#include <gtest/gtest.h>

#include "server/auth/test_certs.h"

namespace hgemm {
namespace {

using testing::ReadFileOrDie;

class ServerTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new std::string(testing::MakeTestCerts()); }
  std::string Pem(const std::string& name) { return ReadFileOrDie(*dir_ + "/" + name); }
  static std::string* dir_;
};
std::string* ServerTlsTest::dir_ = nullptr;

TEST_F(ServerTlsTest, GoodPairPasses) {
  EXPECT_EQ(CheckKeyPair(Pem("server.pem"), Pem("server.key"), "c", "k"), "");
  EXPECT_EQ(CheckCaBundle(Pem("ca.pem") + Pem("other-ca.pem"), "ca"), "");
}

TEST_F(ServerTlsTest, ProblemsNameTheFile) {
  EXPECT_EQ(CheckKeyPair("garbage", Pem("server.key"), "cert.pem", "key.pem"),
            "cert.pem: no PEM certificate (-----BEGIN CERTIFICATE-----) in it");
  EXPECT_EQ(CheckKeyPair(Pem("server.pem"), Pem("server.pem"), "cert.pem", "key.pem"),
            "key.pem: no PEM private key in it (or it is encrypted)");
  EXPECT_EQ(CheckKeyPair(Pem("server.pem"), Pem("other-server.key"), "cert.pem", "key.pem"),
            "key.pem: the private key does not belong to the certificate in cert.pem");
  EXPECT_EQ(CheckKeyPair(Pem("client-expired.pem"), Pem("client-expired.key"), "cert.pem", "k")
                .rfind("cert.pem: the certificate expired (", 0),
            0u);
  EXPECT_EQ(CheckCaBundle("", "ca.pem"),
            "ca.pem: no PEM certificate (-----BEGIN CERTIFICATE-----) in it");
}

TEST_F(ServerTlsTest, StartRefusesBadFiles) {
  std::string error;
  TlsOptions options{.cert_path = *dir_ + "/server.pem", .key_path = *dir_ + "/ca.key"};
  EXPECT_EQ(ServerTls::Start(options, &error), nullptr);
  EXPECT_NE(error.find("ca.key: the private key does not belong"), std::string::npos) << error;
  options.key_path = *dir_ + "/nope.key";
  EXPECT_EQ(ServerTls::Start(options, &error), nullptr);
  EXPECT_NE(error.find("nope.key: cannot open"), std::string::npos) << error;
  options.key_path = *dir_ + "/server.key";
  options.client_ca_path = *dir_ + "/server.key";
  EXPECT_EQ(ServerTls::Start(options, &error), nullptr);
  EXPECT_NE(error.find("server.key: no PEM certificate"), std::string::npos) << error;
  options.client_ca_path = *dir_ + "/ca.pem";
  EXPECT_NE(ServerTls::Start(options, &error), nullptr) << error;
}

}  // namespace
}  // namespace hgemm
