// /metrics end to end: a real HgemmServer on 127.0.0.1 (CPU backend) with metrics_listen, a
// known mix of calls through the real client library, then a real HTTP GET of /metrics (a
// small socket client, HTTP/1.0) whose text must pass a strict parser of the Prometheus text
// format (0.0.4, client/metrics_scrape.h) and show exactly those counts. Also: refused calls
// are logged at info, and the endpoint keeps answering while GEMMs run.
#include "server/metrics/metrics.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "client/metrics_scrape.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/memfd.h"
#include "server/testing/test_requests.h"
#include "server/transport/metrics_http.h"

namespace hgemm {
namespace {

std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// ---- HTTP (client/metrics_scrape.h)
// ----------------------------------------------------------------------------------

// GET `path` from 127.0.0.1:`port`.
int HttpGet(int port, const std::string& path, std::string* body) {
  return hgemm::HttpGet("127.0.0.1", port, path, body);
}

// ---- The server ----------------------------------------------------------------------------

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(server_->metrics_port(), 0);
    client_ = std::make_unique<GemmClient>(Connect("127.0.0.1:" + std::to_string(server_->port())));
  }

  Scrape ScrapeMetrics() {
    std::string body;
    const int code = HttpGet(server_->metrics_port(), "/metrics", &body);
    EXPECT_EQ(code, 200) << body;
    Scrape s = ParseExposition(body);
    EXPECT_TRUE(s.errors.empty()) << Join(s.errors) << "\n" << body;
    return s;
  }

  std::mt19937_64 rng_{20261203};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(MetricsTest, CountsExactlyTheCallsMade) {
  int64_t gemm_received = 0, gemm_sent = 0;
  // Two OK unary GEMMs.
  for (auto [m, n, k] : {std::tuple{7u, 5u, 3u}, {33u, 17u, 9u}}) {
    v1::GemmRequest r = RandomRequest(m, n, k, rng_);
    v1::GemmResponse response;
    ASSERT_TRUE(client_->Gemm(r, &response).ok());
    gemm_received += r.a().size() + r.b().size();
    gemm_sent += response.c().size();
  }
  // One refused: n = 0.
  v1::GemmRequest zero = RandomRequest(4, 4, 4, rng_);
  zero.set_n(0);
  v1::GemmResponse response;
  ASSERT_EQ(client_->Gemm(zero, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  gemm_received += zero.a().size() + zero.b().size();
  // A stream: two OK GEMMs and one refused at its header (unknown kernel).
  v1::GemmRequest s1 = RandomRequest(16, 8, 4, rng_), s2 = RandomRequest(5, 6, 7, rng_),
                  bad = RandomRequest(4, 4, 4, rng_);
  bad.mutable_options()->set_kernel("warp_drive");
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&s1, &bad, &s2}, &results).ok());
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].status.ok()) << results[0].status.error_message();
  EXPECT_EQ(results[1].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(results[2].status.ok()) << results[2].status.error_message();
  v1::ListKernelsResponse kernels;
  ASSERT_TRUE(client_->ListKernels(&kernels).ok());
  // A resident matrix: one upload, still held.
  const std::vector<uint16_t> data = RandomHalfMatrix(12 * 10, rng_);
  v1::MatrixInfo info;
  ASSERT_TRUE(
      client_
          ->UploadMatrix(12, 10,
                         std::string(reinterpret_cast<const char*>(data.data()), 2 * data.size()),
                         &info)
          .ok());

  Scrape s = ScrapeMetrics();
  const std::map<std::string, double> expected = {
      {R"(hgemm_requests_total{code="OK",rpc="Gemm"})", 2},
      {R"(hgemm_requests_total{code="INVALID_ARGUMENT",rpc="Gemm"})", 1},
      {R"(hgemm_requests_total{code="OK",rpc="GemmStream"})", 2},
      {R"(hgemm_requests_total{code="INVALID_ARGUMENT",rpc="GemmStream"})", 1},
      {R"(hgemm_requests_total{code="OK",rpc="ListKernels"})", 1},
      {R"(hgemm_requests_total{code="OK",rpc="UploadMatrix"})", 1},
  };
  EXPECT_EQ(s.Series("hgemm_requests_total"), expected);
  EXPECT_EQ(s.types["hgemm_requests_total"], "counter");
  EXPECT_EQ(s.Series("hgemm_stream_calls_total"),
            (std::map<std::string, double>{{R"(hgemm_stream_calls_total{code="OK"})", 1}}));
  // Four GEMMs ran (two unary, two streamed), each observed once per stage.
  EXPECT_EQ(s.types["hgemm_gemm_stage_seconds"], "histogram");
  for (const char* stage :
       {"queue_wait", "host_to_device", "kernel", "device_to_host", "server_total"}) {
    EXPECT_EQ(
        s.Get(
            std::string(
                R"(hgemm_gemm_stage_seconds_count{backend="cpu",kernel="openblas_sgemm",stage=")") +
            stage + "\"}"),
        4)
        << stage;
    std::vector<double> bounds;
    for (const auto& [series, value] : s.Series("hgemm_gemm_stage_seconds_bucket")) {
      if (series.find(std::string("stage=\"") + stage + "\"") == std::string::npos) continue;
      std::smatch le;
      ASSERT_TRUE(std::regex_search(series, le, std::regex(R"re(le="([^"]+)")re"))) << series;
      double bound;
      ASSERT_TRUE(ParseValue(le[1], &bound)) << series;
      bounds.push_back(bound);
    }
    std::sort(bounds.begin(), bounds.end());
    ASSERT_GE(bounds.size(), 3u) << stage;
    EXPECT_NEAR(bounds.front(), 10e-6, 1e-12) << "the first bucket is 10 µs";
    EXPECT_EQ(bounds[bounds.size() - 2], 60) << "the last finite bucket is 60 s";
    EXPECT_EQ(bounds.back(), INFINITY);
  }
  EXPECT_GT(s.Get(R"(hgemm_gemm_stage_seconds_sum{backend="cpu",kernel="openblas_sgemm",)"
                  R"(stage="server_total"})"),
            0);
  EXPECT_EQ(s.Get(R"(hgemm_received_bytes_total{rpc="Gemm"})"), double(gemm_received));
  EXPECT_EQ(s.Get(R"(hgemm_sent_bytes_total{rpc="Gemm"})"), double(gemm_sent));
  EXPECT_EQ(s.Get(R"(hgemm_received_bytes_total{rpc="UploadMatrix"})"), 2.0 * data.size());
  // The refused streamed GEMM's chunks are dropped before they are counted; the two that ran
  // had all of theirs.
  EXPECT_EQ(s.Get(R"(hgemm_received_bytes_total{rpc="GemmStream"})"),
            double(s1.a().size() + s1.b().size() + s2.a().size() + s2.b().size()));
  EXPECT_EQ(s.Get(R"(hgemm_sent_bytes_total{rpc="GemmStream"})"), 2.0 * (16 * 8 + 5 * 6));
  EXPECT_EQ(s.Get(std::string(R"(hgemm_build_info{backend="cpu",version=")") + kVersion + "\"}"),
            1);
  EXPECT_EQ(s.Get("hgemm_queued_gemms"), 0);
  EXPECT_EQ(s.Get("hgemm_running_gemms"), 0);
  EXPECT_EQ(s.Get("hgemm_admitted_bytes"), 0);
  EXPECT_EQ(s.Get("hgemm_upload_queue_writes"), 0);
  ASSERT_TRUE(s.Has("hgemm_shared_regions_staged"));
  EXPECT_EQ(s.Get("hgemm_shared_regions_staged"), 0);
  const std::string device = std::to_string(server_->backend().Devices()[0].id);
  EXPECT_EQ(s.Get(R"(hgemm_resident_matrices{device=")" + device + "\"}"), 1);
  EXPECT_EQ(s.Get(R"(hgemm_resident_bytes{device=")" + device + "\"}"), 2.0 * 12 * 10);
  EXPECT_GT(s.Get(R"(hgemm_kernel_tflops{backend="cpu",kernel="openblas_sgemm"})"), 0);

  // Released: the gauges follow; the scrape itself changes no counter.
  ASSERT_TRUE(client_->ReleaseMatrix(info.handle()).ok());
  Scrape after = ScrapeMetrics();
  EXPECT_EQ(after.Get(R"(hgemm_resident_matrices{device=")" + device + "\"}"), 0);
  EXPECT_EQ(after.Get(R"(hgemm_requests_total{code="OK",rpc="ReleaseMatrix"})"), 1);
  EXPECT_EQ(after.Get(R"(hgemm_requests_total{code="OK",rpc="Gemm"})"), 2);
}

// Other paths and junk are refused, and the server (Debian's civetweb died on a 404 here)
// goes on answering.
TEST_F(MetricsTest, OnlyMetricsIsServed) {
  std::string body;
  EXPECT_EQ(HttpGet(server_->metrics_port(), "/metrics", &body), 200);
  EXPECT_EQ(HttpGet(server_->metrics_port(), "/", &body), 404);
  EXPECT_EQ(HttpGet(server_->metrics_port(), "/metrics/x", &body), 404);
  EXPECT_EQ(HttpGet(server_->metrics_port(), "/metrics?x=1", &body), 200);
  EXPECT_NE(body.find("hgemm_build_info"), std::string::npos);
  EXPECT_EQ(HttpGet(server_->metrics_port(), "/metrics", &body), 200);
}

TEST(MetricsHttp, RespondsByMethodAndPath) {
  ServiceMetrics metrics("1.2.3", "cpu", {}, nullptr);
  auto status = [&](const std::string& request) {
    const std::string r = MetricsHttpServer::Respond(request, metrics);
    return r.substr(0, r.find("\r\n"));
  };
  EXPECT_EQ(status("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
  EXPECT_EQ(status("HEAD /metrics HTTP/1.0\r\n\r\n"), "HTTP/1.1 200 OK");
  EXPECT_EQ(status("POST /metrics HTTP/1.0\r\n\r\n"), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(status("GET /other HTTP/1.0\r\n\r\n"), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(status("GARBAGE\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status(""), "HTTP/1.1 400 Bad Request");
  const std::string ok = MetricsHttpServer::Respond("GET /metrics HTTP/1.0\r\n\r\n", metrics);
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  const std::string body = ok.substr(ok.find("\r\n\r\n") + 4);
  Scrape s = ParseExposition(body);
  EXPECT_TRUE(s.errors.empty()) << Join(s.errors);
  EXPECT_EQ(s.Get(R"(hgemm_build_info{backend="cpu",version="1.2.3"})"), 1);
  const std::string head = MetricsHttpServer::Respond("HEAD /metrics HTTP/1.0\r\n\r\n", metrics);
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "") << "HEAD has no body";
}

TEST_F(MetricsTest, EndpointAnswersWhileGemmsRun) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      v1::GemmRequest r = RandomRequest(64, 64, 64, rng);
      while (!stop) {
        v1::GemmResponse response;
        if (client_->Gemm(r, &response).ok()) ok++;
      }
    });
  }
  double last = 0;
  for (int i = 0; i < 20; ++i) {
    Scrape s = ScrapeMetrics();
    const double count = s.Get(R"(hgemm_requests_total{code="OK",rpc="Gemm"})");
    if (!std::isnan(count)) {
      EXPECT_GE(count, last) << "a counter went down";
      last = count;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop = true;
  for (std::thread& c : clients) c.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(ScrapeMetrics().Get(R"(hgemm_requests_total{code="OK",rpc="Gemm"})"), ok.load());
}

TEST_F(MetricsTest, RefusedCallsAreLoggedAtInfo) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  spdlog::default_logger()->sinks().push_back(sink);
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::info);
  v1::GemmRequest zero = RandomRequest(4, 4, 4, rng_);
  zero.set_n(0);
  zero.mutable_options()->set_request_id("req-7");
  v1::GemmResponse response;
  CallOptions traced;
  traced.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  EXPECT_EQ(client_->Gemm(zero, &response, traced).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::GemmRequest good = RandomRequest(4, 4, 4, rng_);
  ASSERT_TRUE(client_->Gemm(good, &response).ok());
  spdlog::default_logger()->sinks().pop_back();
  spdlog::set_level(level);
  std::vector<std::string> lines = sink->last_formatted();
  std::vector<std::string> refusals;
  for (const std::string& l : lines) {
    if (l.find("Gemm ") != std::string::npos && l.find("[info]") != std::string::npos) {
      refusals.push_back(l);
    }
  }
  ASSERT_EQ(refusals.size(), 1u) << Join(lines);
  EXPECT_NE(refusals[0].find("Gemm INVALID_ARGUMENT reason=\"n:"), std::string::npos)
      << refusals[0];
  EXPECT_NE(refusals[0].find(" request_id=req-7 "), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find(" peer=ipv4:127.0.0.1:"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find(" traceparent=" + traced.traceparent), std::string::npos)
      << refusals[0];
}

// Matrix bytes by transport (tcp, unix, shm) and the shared-memory regions per owner, with a
// server serving TCP and a Unix socket with shared memory on.
TEST(MetricsShm, BytesByTransportAndRegionsPerOwner) {
  char dir[] = "/tmp/hgemm_metrics_shm_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string unix_target = std::string("unix:") + dir + "/hgemm.sock";
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.more_listen_addresses = {unix_target};
  options.metrics_listen = "127.0.0.1:0";
  options.service.regions.allow_shared_memory = true;
  auto server = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
  ASSERT_NE(server, nullptr);
  GemmClient tcp(Connect("127.0.0.1:" + std::to_string(server->port())));
  GemmClient unix_client(Connect(unix_target));
  std::mt19937_64 rng(31);
  const uint32_t m = 24, n = 16, k = 40;
  const int64_t a_bytes = 2 * m * k, b_bytes = 2 * k * n, c_bytes = 2 * m * n;
  v1::GemmResponse response;
  ASSERT_TRUE(tcp.Gemm(RandomRequest(m, n, k, rng), &response).ok());
  ASSERT_TRUE(unix_client.Gemm(RandomRequest(m, n, k, rng), &response).ok());
  ASSERT_TRUE(unix_client.Gemm(RandomRequest(m, n, k, rng), &response).ok());

  // One GEMM with A, B and C in a region of alice's; 17 more owners with one region each.
  const CallOptions alice{.client_id = "alice"};
  TestMemfd region(4096);
  ASSERT_GE(region.fd(), 0);
  v1::RegionInfo info;
  ASSERT_TRUE(unix_client.RegisterRegion(region.path(), 4096, "", &info, alice).ok());
  v1::GemmRequest shared = RandomRequest(m, n, k, rng);
  shared.mutable_a_region()->set_region(info.region());
  shared.mutable_b_region()->set_region(info.region());
  shared.mutable_b_region()->set_offset(a_bytes);
  shared.mutable_c_region()->set_region(info.region());
  shared.mutable_c_region()->set_offset(a_bytes + b_bytes);
  grpc::Status s = unix_client.Gemm(shared, &response, alice);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<std::unique_ptr<TestMemfd>> others;
  for (int i = 0; i < 17; ++i) {
    others.push_back(std::make_unique<TestMemfd>(4096 * (i + 2)));
    ASSERT_TRUE(unix_client
                    .RegisterRegion(others.back()->path(), 4096 * (i + 2), "", &info,
                                    {.client_id = fmt::format("c{:02}", i)})
                    .ok());
  }

  std::string body;
  ASSERT_EQ(HttpGet(server->metrics_port(), "/metrics", &body), 200);
  const Scrape scrape = ParseExposition(body);
  EXPECT_TRUE(scrape.errors.empty()) << Join(scrape.errors);
  auto bytes = [&](const char* transport, const char* direction) {
    return scrape.Get(fmt::format(R"(hgemm_transport_bytes_total{{direction="{}",transport="{}"}})",
                                  direction, transport));
  };
  EXPECT_EQ(bytes("tcp", "received"), a_bytes + b_bytes);
  EXPECT_EQ(bytes("tcp", "sent"), c_bytes);
  EXPECT_EQ(bytes("unix", "received"), 2 * (a_bytes + b_bytes));  // not the shared GEMM's
  EXPECT_EQ(bytes("unix", "sent"), 2 * c_bytes);
  EXPECT_EQ(bytes("shm", "received"), a_bytes + b_bytes);
  EXPECT_EQ(bytes("shm", "sent"), c_bytes);
  // The 16 largest owners by name (c01..c16), the other two summed (alice's 4096, c00's 8192).
  const auto regions = scrape.Series("hgemm_shared_regions");
  EXPECT_EQ(regions.size(), 17u) << body;
  // Over the Unix socket an x-client-id names a client within the caller's uid.
  const std::string c16 = fmt::format("uid:{}/id:c16", getuid());
  EXPECT_EQ(scrape.Get(fmt::format(R"(hgemm_shared_regions{{principal="{}"}})", c16)), 1);
  EXPECT_EQ(scrape.Get(fmt::format(R"(hgemm_shared_region_bytes{{principal="{}"}})", c16)),
            4096 * 18);
  EXPECT_EQ(scrape.Get(R"(hgemm_shared_regions{principal="other"})"), 2);
  EXPECT_EQ(scrape.Get(R"(hgemm_shared_region_bytes{principal="other"})"), 4096 + 8192);
  EXPECT_FALSE(
      scrape.Has(fmt::format(R"(hgemm_shared_regions{{principal="uid:{}/id:alice"}})", getuid())));

  // Unregistered (info is c16's region): the owner's series goes.
  ASSERT_TRUE(unix_client.UnregisterRegion(info.region(), {.client_id = "c16"}).ok());
  ASSERT_EQ(HttpGet(server->metrics_port(), "/metrics", &body), 200);
  EXPECT_FALSE(ParseExposition(body).Has(R"(hgemm_shared_regions{principal="id:c16"})"));
  server.reset();
  std::filesystem::remove_all(dir);
}

TEST(MetricsServer, OffWhenMetricsListenIsEmpty) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  std::unique_ptr<HgemmServer> server = HgemmServer::Start(options, MakeCpuBackend({.workers = 1}));
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->metrics_port(), 0);
}

TEST(MetricsServer, StartFailsWhenTheMetricsPortIsTaken) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  EXPECT_EQ(HgemmServer::Start(options, MakeCpuBackend({.workers = 1})), nullptr);
  close(fd);
}

}  // namespace
}  // namespace hgemm
