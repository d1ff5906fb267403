// TLS, mutual TLS and token authentication end to end: a real HgemmServer on 127.0.0.1 (CPU
// backend) with certificates made at test time by Debian's openssl (tools/make_test_certs.sh),
// and the real client library.
#include <gtest/gtest.h>

#include <thread>

#include "client/gemm_client.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/auth/test_certs.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;
using testing::ReadFileOrDie;
using testing::ReplaceFile;
using testing::TokenLine;

constexpr char kUnknownHandle[] = "m-00000000000000000000000000000000";

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = testing::MakeTestCerts();
    // The files the server is given, so that they can be rotated under it.
    for (const char* name : {"server.pem", "server.key"}) {
      ReplaceFile(Path(std::string("live-") + name), ReadFileOrDie(Path(name)));
    }
    tokens_ = Path("tokens");
    ReplaceFile(tokens_, "# test principals\n" + TokenLine("alice", "alice-token") +
                             TokenLine("bob", "bob-token") + TokenLine("ops", "ops-token", true));
  }

  std::string Path(const std::string& name) const { return certs_ + "/" + name; }

  ServerOptions Options() const {
    ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.tls.cert_path = Path("live-server.pem");
    o.tls.key_path = Path("live-server.key");
    o.tls.refresh_period = 100ms;
    o.auth.tokens_file = tokens_;
    o.auth.refresh_period = 50ms;
    return o;
  }

  void Start(ServerOptions options) {
    server_ = HgemmServer::Start(std::move(options), MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  // A client trusting the test CA, sending `token`, on a connection of its own (none is
  // shared with an earlier client that saw an older certificate).
  GemmClient Client(const std::string& token, ConnectOptions connect = {}) const {
    if (connect.tls_ca.empty()) connect.tls_ca = Path("ca.pem");
    connect.token = token;
    connect.private_subchannels = true;
    return GemmClient(Connect(target_, connect));
  }

  static grpc::StatusCode Info(const GemmClient& client) {
    v1::ServerInfo info;
    return client.GetServerInfo(&info, {.timeout = 10s}).error_code();
  }

  v1::MatrixInfo Upload(const GemmClient& client, const CallOptions& call = {}) {
    v1::MatrixInfo info;
    grpc::Status s =
        client.UploadMatrix(16, 16, HalfBytes(RandomHalfMatrix(256, rng_)), &info, 0, "", call);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info;
  }

  // `s`'s message with `handle` written as the never-issued kUnknownHandle.
  static std::string AsUnknown(const grpc::Status& s, const std::string& handle) {
    std::string message = s.error_message();
    if (size_t at = message.find(handle); at != std::string::npos) {
      message.replace(at, handle.size(), kUnknownHandle);
    }
    return message;
  }

  std::string certs_, tokens_, target_;
  std::unique_ptr<HgemmServer> server_;
  std::mt19937_64 rng_{14};
};

TEST_F(SecurityTest, TlsWorksAndPlaintextIsRefused) {
  Start(Options());
  EXPECT_EQ(Info(Client("alice-token")), grpc::StatusCode::OK);
  GemmClient plaintext(Connect(target_));
  v1::ServerInfo info;
  EXPECT_EQ(plaintext.GetServerInfo(&info, {.timeout = 3s}).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A server certificate the client's CA did not issue.
  EXPECT_EQ(Info(Client("alice-token", {.tls_ca = Path("other-ca.pem")})),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MissingWrongAndRevokedTokensAreUnauthenticated) {
  Start(Options());
  const GemmClient none = Client(""), wrong = Client("alice-token-"), bob = Client("bob-token");
  for (const GemmClient* client : {&none, &wrong}) {
    v1::GemmRequest r = RandomRequest(4, 4, 4, rng_);
    v1::GemmResponse response;
    EXPECT_EQ(client->Gemm(r, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    std::vector<StreamedGemm> streamed;
    EXPECT_EQ(client->GemmStream({&r}, &streamed).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Info(*client), grpc::StatusCode::UNAUTHENTICATED);
    v1::ListKernelsResponse kernels;
    EXPECT_EQ(client->ListKernels(&kernels).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    v1::MatrixInfo info;
    EXPECT_EQ(client->UploadMatrix(4, 4, HalfBytes(RandomHalfMatrix(16, rng_)), &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListMatricesResponse list;
    EXPECT_EQ(client->ListMatrices(&list).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(client->ReleaseMatrix(kUnknownHandle).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    std::string data;
    EXPECT_EQ(client->DownloadMatrix(kUnknownHandle, &data).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  v1::ListKernelsResponse kernels;
  EXPECT_NE(none.ListKernels(&kernels).error_message().find("authorization: Bearer TOKEN"),
            std::string::npos);
  EXPECT_EQ(wrong.ListKernels(&kernels).error_message(),
            "the token is not accepted");  // the token is not echoed

  // Health needs no token.
  auto health = grpc::health::v1::Health::NewStub(Connect(target_, {.tls_ca = Path("ca.pem")}));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse serving;
  EXPECT_TRUE(health->Check(&context, {}, &serving).ok());

  // bob's line removed: his token stops working without a restart.
  EXPECT_EQ(Info(bob), grpc::StatusCode::OK);
  ReplaceFile(tokens_, TokenLine("alice", "alice-token"));
  while (Info(bob) == grpc::StatusCode::OK) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(Info(bob), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Info(Client("alice-token")), grpc::StatusCode::OK);
}

TEST_F(SecurityTest, APrincipalCannotReachAnothersMatrices) {
  Start(Options());
  const GemmClient alice = Client("alice-token"), bob = Client("bob-token");
  const v1::MatrixInfo m = Upload(alice);
  // x-client-id is not honoured with authentication on: claiming to be alice changes nothing.
  const CallOptions as_alice{.client_id = "alice"};

  v1::GemmRequest r = RandomRequest(16, 16, 16, rng_);
  v1::GemmResponse response;
  for (const std::string& handle : {m.handle(), std::string(kUnknownHandle)}) {
    r.set_b_handle(handle);
    const grpc::Status used = bob.Gemm(r, &response, as_alice);
    EXPECT_EQ(used.error_code(), grpc::StatusCode::NOT_FOUND);
    r.set_b_handle(kUnknownHandle);
    EXPECT_EQ(AsUnknown(used, m.handle()), bob.Gemm(r, &response).error_message());

    std::string data;
    const grpc::Status downloaded = bob.DownloadMatrix(handle, &data, as_alice);
    EXPECT_EQ(downloaded.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(AsUnknown(downloaded, m.handle()),
              bob.DownloadMatrix(kUnknownHandle, &data).error_message());

    const grpc::Status released = bob.ReleaseMatrix(handle, as_alice);
    EXPECT_EQ(released.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(AsUnknown(released, m.handle()), bob.ReleaseMatrix(kUnknownHandle).error_message());
  }
  // A stream naming it fails that GEMM the same way.
  r.set_b_handle(m.handle());
  std::vector<StreamedGemm> streamed;
  ASSERT_TRUE(bob.GemmStream({&r}, &streamed).ok());
  EXPECT_EQ(streamed[0].status.error_code(), grpc::StatusCode::NOT_FOUND);

  v1::ListMatricesResponse list;
  ASSERT_TRUE(bob.ListMatrices(&list, as_alice).ok());
  EXPECT_EQ(list.matrices_size(), 0);
  EXPECT_EQ(list.client_bytes(), 0u);

  // All of that left alice's matrix alone.
  ASSERT_TRUE(alice.ListMatrices(&list).ok());
  ASSERT_EQ(list.matrices_size(), 1);
  EXPECT_EQ(list.matrices(0).owner(), "");  // owners are shown to administrators only
  r.set_b_handle(m.handle());
  EXPECT_TRUE(alice.Gemm(r, &response).ok());
}

TEST_F(SecurityTest, AdminListsAndReleasesEveryonesMatrices) {
  Start(Options());
  const GemmClient alice = Client("alice-token"), bob = Client("bob-token"),
                   ops = Client("ops-token");
  const v1::MatrixInfo a = Upload(alice), b = Upload(bob);
  v1::ListMatricesResponse list;
  ASSERT_TRUE(ops.ListMatrices(&list).ok());
  std::map<std::string, std::string> owners;
  for (const v1::MatrixInfo& m : list.matrices()) owners[m.handle()] = m.owner();
  EXPECT_EQ(owners,
            (std::map<std::string, std::string>{{a.handle(), "alice"}, {b.handle(), "bob"}}));
  uint64_t freed = 0;
  ASSERT_TRUE(ops.ReleaseMatrix(a.handle(), {}, &freed).ok());
  EXPECT_EQ(freed, a.bytes());
  ASSERT_TRUE(alice.ListMatrices(&list).ok());
  EXPECT_EQ(list.matrices_size(), 0);
  // Releasing is all an administrator may do with others' matrices.
  std::string data;
  EXPECT_EQ(ops.DownloadMatrix(b.handle(), &data).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SecurityTest, MutualTlsAcceptsTheCasClientsOnly) {
  ServerOptions o = Options();
  o.tls.client_ca_path = Path("ca.pem");
  o.tls.client_certificates = ClientCertificates::kRequire;
  Start(o);
  auto with_cert = [&](const std::string& name) {
    return Client("alice-token", {.tls_cert = Path(name + ".pem"), .tls_key = Path(name + ".key")});
  };
  EXPECT_EQ(Info(with_cert("client-alice")), grpc::StatusCode::OK);
  EXPECT_EQ(Info(with_cert("client-bob")), grpc::StatusCode::OK);
  EXPECT_EQ(Info(with_cert("client-expired")), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Info(with_cert("client-other")), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Info(Client("alice-token")), grpc::StatusCode::UNAVAILABLE);  // no certificate
}

TEST_F(SecurityTest, PrincipalFromCertificate) {
  ServerOptions o = Options();
  o.tls.client_ca_path = Path("ca.pem");
  o.tls.client_certificates = ClientCertificates::kRequest;
  o.auth.principal_from_cert = true;
  Start(o);
  auto with_cert = [&](const std::string& name) {
    return Client("", {.tls_cert = Path(name + ".pem"), .tls_key = Path(name + ".key")});
  };
  const GemmClient alice = with_cert("client-alice"), bob = with_cert("client-bob");
  const v1::MatrixInfo m = Upload(alice);  // principal "alice": the certificate's SAN
  v1::ListMatricesResponse list;
  ASSERT_TRUE(bob.ListMatrices(&list).ok());  // principal "bob": its CN (no SAN)
  EXPECT_EQ(list.matrices_size(), 0);
  // The token's principal is alice too: she sees her matrix without a certificate.
  ASSERT_TRUE(Client("alice-token").ListMatrices(&list).ok());
  ASSERT_EQ(list.matrices_size(), 1);
  EXPECT_EQ(list.matrices(0).handle(), m.handle());
  // Neither a certificate nor a token.
  EXPECT_EQ(Info(Client("")), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, RotatedCertificateIsServedWithoutRestart) {
  Start(Options());
  ASSERT_EQ(Info(Client("alice-token")), grpc::StatusCode::OK);
  // A broken rewrite (a key that is not the certificate's) keeps the good pair serving.
  ReplaceFile(Path("live-server.key"), ReadFileOrDie(Path("other-server.key")));
  std::this_thread::sleep_for(500ms);  // five looks at the files
  EXPECT_EQ(Info(Client("alice-token")), grpc::StatusCode::OK);
  // The new pair, from another CA: new connections get it.
  ReplaceFile(Path("live-server.pem"), ReadFileOrDie(Path("other-server.pem")));
  while (Info(Client("alice-token", {.tls_ca = Path("other-ca.pem")})) != grpc::StatusCode::OK) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(Info(Client("alice-token")), grpc::StatusCode::UNAVAILABLE);  // the old CA's
}

TEST_F(SecurityTest, TokenFileRotationAndBadRewrite) {
  Start(Options());
  ReplaceFile(tokens_, "alice not-a-hash\n");  // kept out: alice and bob still work
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(Info(Client("alice-token")), grpc::StatusCode::OK);
  ReplaceFile(tokens_, TokenLine("carol", "carol-token"));
  while (Info(Client("carol-token")) != grpc::StatusCode::OK) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(Info(Client("alice-token")), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, PlaintextWithTokenOnLoopback) {
  ServerOptions o = Options();
  o.tls = {};
  Start(o);
  EXPECT_EQ(Info(GemmClient(Connect(target_, {.token = "alice-token"}))), grpc::StatusCode::OK);
  EXPECT_EQ(Info(GemmClient(Connect(target_))), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, HealthOnlyPortServesHealthAndNothingElse) {
  ServerOptions o = Options();
  o.health_listen = "127.0.0.1:0";
  Start(o);
  ASSERT_NE(server_->health_port(), 0);
  const std::string probe_target = "127.0.0.1:" + std::to_string(server_->health_port());
  auto health = grpc::health::v1::Health::NewStub(Connect(probe_target));  // plaintext
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("hgemm.v1.GemmService");
  grpc::health::v1::HealthCheckResponse response;
  // The backend watcher publishes SERVING shortly after start.
  do {
    grpc::ClientContext context;
    ASSERT_TRUE(health->Check(&context, request, &response).ok());
  } while (response.status() != grpc::health::v1::HealthCheckResponse::SERVING);
  GemmClient service(Connect(probe_target, {.token = "alice-token"}));
  EXPECT_EQ(Info(service), grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecurityTest, ContradictoryOrBadOptionsStopTheStart) {
  ServerOptions o = Options();
  o.tls.key_path.clear();
  EXPECT_EQ(HgemmServer::Start(o, MakeCpuBackend({})), nullptr);
  o = Options();
  o.auth.principal_from_cert = true;  // without client certificates
  EXPECT_EQ(HgemmServer::Start(o, MakeCpuBackend({})), nullptr);
  o = Options();
  o.tls = {};
  o.auth.protect_reflection = true;  // without TLS
  EXPECT_EQ(HgemmServer::Start(o, MakeCpuBackend({})), nullptr);
  o = Options();
  ReplaceFile(tokens_, "alice\n");
  EXPECT_EQ(HgemmServer::Start(o, MakeCpuBackend({})), nullptr);
}

}  // namespace
}  // namespace hgemm
