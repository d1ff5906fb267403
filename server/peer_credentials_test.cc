// Unix-socket callers known by the kernel (SO_PEERCRED, server/auth/unix_peers.h): the
// --allowed_uids list and the uid as principal, against a real HgemmServer (CPU backend)
// serving TCP and a Unix socket of its own, with the real client library.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/auth/test_certs.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;
using testing::ReplaceFile;
using testing::TokenLine;

class PeerCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/hgemm_peercred_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    unix_ = "unix:" + dir_ + "/hgemm.sock";
    me_ = "uid:" + std::to_string(getuid());
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start(ServerOptions options) {
    options.listen_address = "127.0.0.1:0";
    options.more_listen_addresses = {unix_};
    server_ = HgemmServer::Start(std::move(options), MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    tcp_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  // A tokens file where this process's uid is an administrator (to see owners) and alice is not.
  std::string TokensFile() {
    const std::string path = dir_ + "/tokens";
    ReplaceFile(path,
                TokenLine(me_, "unused-token", /*admin=*/true) + TokenLine("alice", "alice-token"));
    return path;
  }

  static GemmClient Client(const std::string& target, const std::string& token = "") {
    ConnectOptions connect;
    connect.token = token;
    connect.private_subchannels = true;
    return GemmClient(Connect(target, connect));
  }

  grpc::Status Upload(const GemmClient& client, const CallOptions& call = {}) {
    v1::MatrixInfo info;
    return client.UploadMatrix(8, 8, HalfBytes(RandomHalfMatrix(64, rng_)), &info, 0, "", call);
  }

  // The owners of every resident matrix, as an administrator sees them.
  std::vector<std::string> Owners(const GemmClient& admin) {
    v1::ListMatricesResponse list;
    EXPECT_TRUE(admin.ListMatrices(&list).ok());
    std::vector<std::string> owners;
    for (const auto& m : list.matrices()) owners.push_back(m.owner());
    std::sort(owners.begin(), owners.end());
    return owners;
  }

  std::string dir_, unix_, tcp_, me_;
  std::unique_ptr<HgemmServer> server_;
  std::mt19937_64 rng_{31};
};

TEST_F(PeerCredentialsTest, AllowedUidsAdmitOnlyThoseOnTheUnixSocket) {
  ServerOptions others_only;
  others_only.auth.allowed_uids = {getuid() + 1};
  Start(others_only);
  v1::ServerInfo info;
  grpc::Status s = Client(unix_).GetServerInfo(&info, {.timeout = 10s});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("uid " + std::to_string(getuid())), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("--allowed_uids"), std::string::npos) << s.error_message();
  EXPECT_TRUE(Client(tcp_).GetServerInfo(&info, {.timeout = 10s}).ok());  // TCP: not its business

  server_.reset();
  ServerOptions me_too;
  me_too.auth.allowed_uids = {getuid() + 1, getuid()};
  Start(me_too);
  EXPECT_TRUE(Client(unix_).GetServerInfo(&info, {.timeout = 10s}).ok());
}

TEST_F(PeerCredentialsTest, TheUidIsThePrincipalOfAUnixCallWithoutAToken) {
  ServerOptions options;
  options.auth.tokens_file = TokensFile();
  Start(options);
  const GemmClient admin = Client(unix_);  // no token: "uid:<mine>", an administrator
  ASSERT_TRUE(Upload(admin).ok());
  ASSERT_TRUE(Upload(Client(unix_, "alice-token")).ok());  // a token still names its principal
  EXPECT_EQ(Owners(admin), (std::vector<std::string>{"alice", me_}));
  // A wrong token is refused, not replaced by the uid; over TCP the uid is unknown.
  EXPECT_EQ(Upload(Client(unix_, "wrong-token")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Upload(Client(tcp_)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(PeerCredentialsTest, WithoutAuthenticationTheUidNamesClientsWithoutAnId) {
  Start(ServerOptions{});
  const GemmClient unix_client = Client(unix_);
  ASSERT_TRUE(Upload(unix_client).ok());
  v1::ListMatricesResponse list;
  ASSERT_TRUE(unix_client.ListMatrices(&list).ok());
  EXPECT_EQ(list.matrices_size(), 1);
  // An x-client-id is still taken as said (authentication off), and is another client.
  ASSERT_TRUE(unix_client.ListMatrices(&list, {.client_id = me_}).ok());
  EXPECT_EQ(list.matrices_size(), 0);
  ASSERT_TRUE(Client(tcp_).ListMatrices(&list).ok());
  EXPECT_EQ(list.matrices_size(), 0);
}

// Over the Unix socket an x-client-id names a client within the caller's uid: the same id over
// TCP (or from another uid) is another principal, and cannot reach its matrices.
TEST_F(PeerCredentialsTest, AnIdOverTheUnixSocketIsNamedWithinTheUid) {
  Start(ServerOptions{});
  const GemmClient unix_client = Client(unix_), tcp_client = Client(tcp_);
  ASSERT_TRUE(Upload(unix_client, {.client_id = "alice"}).ok());
  v1::ListMatricesResponse list;
  ASSERT_TRUE(unix_client.ListMatrices(&list, {.client_id = "alice"}).ok());
  EXPECT_EQ(list.matrices_size(), 1);
  ASSERT_TRUE(tcp_client.ListMatrices(&list, {.client_id = "alice"}).ok());
  EXPECT_EQ(list.matrices_size(), 0);
  ASSERT_TRUE(unix_client.ListMatrices(&list).ok());  // the uid itself is another client too
  EXPECT_EQ(list.matrices_size(), 0);
}

// With TLS on TCP the Unix socket is still the server's own: the kernel names its callers
// (uid principal, --allowed_uids), in plaintext, while TCP keeps TLS.
TEST_F(PeerCredentialsTest, TlsOnTcpKeepsTheKernelsWordOnTheUnixSocket) {
  const std::string certs = testing::MakeTestCerts();
  ServerOptions options;
  options.tls.cert_path = certs + "/server.pem";
  options.tls.key_path = certs + "/server.key";
  options.auth.tokens_file = TokensFile();
  options.auth.allowed_uids = {getuid()};
  Start(options);
  const GemmClient admin = Client(unix_);  // no token: "uid:<mine>", an administrator
  ASSERT_TRUE(Upload(admin).ok());
  EXPECT_EQ(Owners(admin), (std::vector<std::string>{me_}));
  v1::ServerInfo info;
  EXPECT_FALSE(Client(tcp_).GetServerInfo(&info, {.timeout = 10s}).ok());  // TCP wants TLS
  ConnectOptions tls;
  tls.tls_ca = certs + "/ca.pem";
  tls.tls_server_name = "localhost";
  tls.token = "alice-token";
  EXPECT_TRUE(GemmClient(Connect(tcp_, tls)).GetServerInfo(&info, {.timeout = 10s}).ok());
}

}  // namespace
}  // namespace hgemm
