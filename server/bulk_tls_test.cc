// The bulk channel under TLS (proto/hgemm.proto, "Bulk channel"): a real HgemmServer on
// 127.0.0.1 with --tls_cert (and mutual TLS) and --bulk_listen, certificates made at test time.
// Lanes are TLS with the gRPC port's certificate; a client that does not trust it, a plaintext
// peer, and (under mTLS) a lane without a client certificate are all refused, and the server
// keeps serving.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>

#include "client/bulk_lane.h"
#include "client/gemm_client.h"
#include "client/metrics_scrape.h"
#include "proto/bulk_wire.h"
#include "server/auth/test_certs.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;

class BulkTlsTest : public ::testing::Test {
 protected:
  void SetUp() override { certs_ = testing::MakeTestCerts(); }

  std::string Path(const std::string& name) const { return certs_ + "/" + name; }

  void Start(bool mutual) {
    ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.tls.cert_path = Path("server.pem");
    o.tls.key_path = Path("server.key");
    if (mutual) {
      o.tls.client_ca_path = Path("ca.pem");
      o.tls.client_certificates = ClientCertificates::kRequire;
    }
    o.bulk.address = "127.0.0.1:0";
    o.bulk.hello_timeout = 500ms;
    server_ = HgemmServer::Start(std::move(o), MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
  }

  std::string Target() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  ConnectOptions Trusting(bool with_certificate) const {
    ConnectOptions c{.tls_ca = Path("ca.pem")};
    if (with_certificate) {
      c.tls_cert = Path("client-alice.pem");
      c.tls_key = Path("client-alice.key");
    }
    return c;
  }

  CallOptions Parts() const {
    return {.client_id = "alice", .parallel_parts = 3, .parallel_min_bytes = 0};
  }

  double Metric(const std::string& series) {
    std::string body;
    EXPECT_EQ(HttpGet("127.0.0.1", server_->metrics_port(), "/metrics", &body), 200);
    const Scrape scrape = ParseExposition(body);
    return scrape.Has(series) ? scrape.Get(series) : 0;
  }

  // A GET lane of a fresh 64-byte matrix of `client`'s principal.
  v1::BulkLane GetLane(const GemmClient& client, std::string* bytes) {
    *bytes = std::string(64, '\x5a');
    v1::MatrixInfo info;
    EXPECT_TRUE(client.UploadMatrix(4, 8, *bytes, &info, 0, "", Parts()).ok());
    auto stub = v1::GemmService::NewStub(Connect(Target(), Trusting(mutual_)));
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", "alice");
    v1::BulkRequest r;
    r.set_handle(info.handle());
    r.set_direction(v1::BULK_GET);
    r.set_length(64);
    r.set_lanes(1);
    v1::BulkGrant grant;
    EXPECT_TRUE(stub->OpenBulk(&context, r, &grant).ok());
    return grant.lanes(0);
  }

  BulkEndpoint Endpoint(const BulkTls& tls) const {
    std::string error;
    BulkEndpoint e{"127.0.0.1", uint32_t(server_->bulk_port()), NewBulkTlsContext(tls, &error)};
    EXPECT_TRUE(e.tls) << error;
    return e;
  }

  void ExpectRunOverBulk(const GemmClient& client) {
    const std::string received =
        "hgemm_transport_bytes_total{direction=\"received\",transport=\"bulk\"}";
    const std::string sent = "hgemm_transport_bytes_total{direction=\"sent\",transport=\"bulk\"}";
    const double received_before = Metric(received), sent_before = Metric(sent);
    std::mt19937_64 rng(20261207);
    v1::GemmRequest r = RandomRequest(130, 70, 90, rng);
    v1::GemmResponse response;
    grpc::Status s = client.Run(r, &response, Parts());
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc);
    EXPECT_TRUE(client.OffersBulk(""));
    // A, B and C went over the lanes.
    EXPECT_EQ(Metric(received) - received_before, 2.0 * (130 * 90 + 90 * 70));
    EXPECT_EQ(Metric(sent) - sent_before, 2.0 * 130 * 70);
  }

  std::string certs_;
  bool mutual_ = false;
  std::unique_ptr<HgemmServer> server_;
};

TEST_F(BulkTlsTest, RunSendsPartsOverTlsLanes) {
  Start(/*mutual=*/false);
  ExpectRunOverBulk(GemmClient(Target(), Trusting(false)));
}

TEST_F(BulkTlsTest, ALaneThatDoesNotTrustTheServerIsRefusedByTheClient) {
  Start(/*mutual=*/false);
  const GemmClient client(Target(), Trusting(false));
  std::string bytes;
  const v1::BulkLane lane = GetLane(client, &bytes);
  std::string into(64, '\0');
  grpc::Status s =
      GetOverLane(Endpoint({.ca_path = Path("other-ca.pem")}), lane, into.data(), 2000ms);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("certificate"), std::string::npos) << s.error_message();
  // The capability was never presented: it still works, over a lane that trusts the server.
  s = GetOverLane(Endpoint({.ca_path = Path("ca.pem")}), lane, into.data(), 2000ms);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(into, bytes);
}

TEST_F(BulkTlsTest, APlaintextHelloGetsNoAnswer) {
  Start(/*mutual=*/false);
  const GemmClient client(Target(), Trusting(false));
  std::string bytes;
  const v1::BulkLane lane = GetLane(client, &bytes);
  BulkEndpoint plain{"127.0.0.1", uint32_t(server_->bulk_port())};
  std::string into(64, '\0');
  grpc::Status s = GetOverLane(plain, lane, into.data(), 2000ms);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(into, bytes);
  ExpectRunOverBulk(client);  // and the server goes on
}

TEST_F(BulkTlsTest, MutualTlsLanesNeedTheClientCertificate) {
  mutual_ = true;
  Start(/*mutual=*/true);
  const GemmClient client(Target(), Trusting(true));
  std::string bytes;
  const v1::BulkLane lane = GetLane(client, &bytes);
  std::string into(64, '\0');
  grpc::Status s = GetOverLane(Endpoint({.ca_path = Path("ca.pem")}), lane, into.data(), 2000ms);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  s = GetOverLane(Endpoint({.ca_path = Path("ca.pem"),
                            .cert_path = Path("client-other.pem"),
                            .key_path = Path("client-other.key")}),
                  lane, into.data(), 2000ms);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  s = GetOverLane(Endpoint({.ca_path = Path("ca.pem"),
                            .cert_path = Path("client-alice.pem"),
                            .key_path = Path("client-alice.key")}),
                  lane, into.data(), 2000ms);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(into, bytes);
  ExpectRunOverBulk(client);
}

}  // namespace
}  // namespace hgemm
