// The load generator's core against a real HgemmServer (CPU backend) and EchoServer on
// 127.0.0.1: short bounded runs whose counts and percentiles must be consistent. No timing
// thresholds: only relations that hold on any machine.
#include "bench/hgemm_load.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <sstream>

#include "bench/echo_service.h"
#include "bench/load_report.h"
#include "bench/server_metrics.h"
#include "bench/stats.h"
#include "client/gemm_client.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/child_process.h"

namespace hgemm::bench {
namespace {

TEST(HgemmLoad, ParsesShapesWithWeights) {
  std::vector<Shape> shapes;
  ASSERT_EQ(ParseShapes("256x128x64,8x8x8:3", &shapes), "");
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_EQ(shapes[0].Name(), "256x128x64");
  EXPECT_EQ(shapes[0].RequestBytes(), 2 * (256 * 64 + 64 * 128));
  EXPECT_EQ(shapes[0].ReplyBytes(), 2 * 256 * 128);
  EXPECT_EQ(shapes[1].weight, 3);
  EXPECT_NE(ParseShapes("256x256", &shapes), "");
  EXPECT_NE(ParseShapes("0x1x1", &shapes), "");
  EXPECT_NE(ParseShapes("", &shapes), "");
  std::vector<int> levels;
  EXPECT_EQ(ParseIntList("1,2,64", &levels), "");
  EXPECT_EQ(levels, (std::vector<int>{1, 2, 64}));
  EXPECT_NE(ParseIntList("1,x", &levels), "");
  EXPECT_NE(ParseIntList("0", &levels), "");
}

TEST(HgemmLoad, ResidentModesCountOnlyTheBytesOnTheWire) {
  Resident r = Resident::kNone;
  EXPECT_TRUE(ParseResident("b", &r));
  EXPECT_EQ(r, Resident::kB);
  EXPECT_TRUE(ParseResident("all", &r));
  EXPECT_EQ(r, Resident::kAll);
  EXPECT_TRUE(ParseResident("none", &r));
  EXPECT_EQ(r, Resident::kNone);
  EXPECT_FALSE(ParseResident("a", &r));
  EXPECT_STREQ(ResidentName(Resident::kAll), "all");
  const Shape s{{.m = 128, .n = 64, .k = 32}};
  EXPECT_EQ(SentBytes(s, Resident::kNone), s.RequestBytes());
  EXPECT_EQ(ReceivedBytes(s, Resident::kNone), s.ReplyBytes());
  EXPECT_EQ(SentBytes(s, Resident::kB), 2 * 128 * 32);
  EXPECT_EQ(ReceivedBytes(s, Resident::kB), 2 * 128 * 64);
  EXPECT_EQ(SentBytes(s, Resident::kAll), 0);
  EXPECT_EQ(ReceivedBytes(s, Resident::kAll), 0);
}

// The server's counts around a point: a ring's GEMMs are its entries (not Gemm calls), and
// batched launches give the GEMMs per launch that a ring point's batch column shows.
TEST(HgemmLoad, ServerMetricsCountRingEntriesAndLaunches) {
  Scrape before, after;
  before.samples = {{"hgemm_requests_total{code=\"OK\",rpc=\"Gemm\"}", 5},
                    {"hgemm_ring_entries_total{code=\"OK\"}", 100},
                    {"hgemm_gemm_stage_seconds_count{stage=\"server_total\"}", 105},
                    {"hgemm_gemm_stage_seconds_sum{stage=\"server_total\"}", 1},
                    {"hgemm_batch_members_count", 3},
                    {"hgemm_batch_members_sum", 9}};
  after = before;
  after.samples["hgemm_requests_total{code=\"OK\",rpc=\"Gemm\"}"] = 7;  // another client's
  after.samples["hgemm_ring_entries_total{code=\"OK\"}"] = 110;
  after.samples["hgemm_ring_entries_total{code=\"DEADLINE_EXCEEDED\"}"] = 1;
  after.samples["hgemm_gemm_stage_seconds_count{stage=\"server_total\"}"] = 117;
  after.samples["hgemm_gemm_stage_seconds_sum{stage=\"server_total\"}"] = 1.012;
  after.samples["hgemm_batch_members_count"] = 5;  // two launches ran 4 and 4 GEMMs
  after.samples["hgemm_batch_members_sum"] = 17;
  const ServerMetricsDelta ring = DiffServerMetrics(before, after, "ring", 11);
  EXPECT_EQ(ring.requests, 11);
  EXPECT_EQ(ring.ok_requests, 10);
  EXPECT_TRUE(ring.Agrees());
  EXPECT_EQ(ring.gemms, 12);
  EXPECT_NEAR(ring.total_ms, 1.0, 1e-9);
  EXPECT_EQ(ring.batches, 2);
  EXPECT_EQ(ring.batched_gemms, 8);
  // Over its 10 OK entries: 2 launches of 4, 2 alone.
  EXPECT_DOUBLE_EQ(ring.GemmsPerLaunch(), 10.0 / 4);
  const ServerMetricsDelta gemm = DiffServerMetrics(before, after, "Gemm", 2);
  EXPECT_EQ(gemm.requests, 2);
  EXPECT_DOUBLE_EQ(gemm.GemmsPerLaunch(), 12.0 / 6);  // over the 12 timed GEMMs
  EXPECT_NE(FormatServerMetricsRow(ring).find("2 batched launches ran 8 of the GEMMs: 2.50 "
                                              "GEMMs per launch"),
            std::string::npos)
      << FormatServerMetricsRow(ring);
  EXPECT_DOUBLE_EQ((ServerMetricsDelta{.rpc = "Gemm", .gemms = 4}.GemmsPerLaunch()), 1);
  EXPECT_DOUBLE_EQ(ServerMetricsDelta{}.GemmsPerLaunch(), 0);

  // The batch column: a ring point's from /metrics, any other's from the answers.
  PointResult p;
  p.transport = Transport::kRing;
  p.stats.push_back(PointStats{.shape = "8x8x8", .requests = 1});
  p.stats[0].server.count = 1;
  p.stats[0].server.batch_size = 3;
  auto batch_column = [](const std::string& row) {
    const std::string before_bar = row.substr(0, row.rfind('|'));
    return before_bar.substr(before_bar.find_last_not_of(' ', before_bar.size() - 1) - 4, 5);
  };
  EXPECT_EQ(batch_column(FormatTableRows(p, nullptr)), "  3.0");
  p.server_metrics = ring;
  EXPECT_EQ(batch_column(FormatTableRows(p, nullptr)), "  2.5");
  p.transport = Transport::kShm;
  EXPECT_EQ(batch_column(FormatTableRows(p, nullptr)), "  3.0");
}

TEST(HgemmLoad, PercentileIsNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 100), 100);
  EXPECT_EQ(Percentile({7}, 50), 7);
  EXPECT_EQ(Percentile({1, 2}, 1), 1);
}

// Relations every PointStats must satisfy.
void ExpectConsistent(const PointStats& s, Target target = Target::kService,
                      Resident resident = Resident::kNone) {
  SCOPED_TRACE(s.shape);
  if (s.requests == 0) return;
  EXPECT_LE(s.min_ms, s.p50_ms);
  EXPECT_LE(s.p50_ms, s.p90_ms);
  EXPECT_LE(s.p90_ms, s.p99_ms);
  EXPECT_LE(s.p99_ms, s.max_ms);
  EXPECT_LE(s.min_ms, s.mean_ms);
  EXPECT_LE(s.mean_ms, s.max_ms);
  EXPECT_GT(s.seconds, 0);
  EXPECT_NEAR(s.requests_per_s * s.seconds, s.requests, 1e-6 * s.requests);
  if (target == Target::kService) {
    EXPECT_GT(s.gflops, 0);
  } else {
    EXPECT_EQ(s.gflops, 0);
  }
  if (resident == Resident::kAll) {
    EXPECT_EQ(s.payload_gb_per_s, 0);  // only handles cross the wire
  } else {
    EXPECT_GT(s.payload_gb_per_s, 0);
  }
}

class HgemmLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.service.stream_chunk_bytes = 4 << 10;  // several result chunks per GEMM
    options.metrics_listen = "127.0.0.1:0";
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    metrics_url_ = "http://127.0.0.1:" + std::to_string(server_->metrics_port()) + "/metrics";
    echo_ = EchoServer::Start({.listen_address = "127.0.0.1:0"});
    ASSERT_NE(echo_, nullptr);
    service_target_ = "127.0.0.1:" + std::to_string(server_->port());
    echo_target_ = "127.0.0.1:" + std::to_string(echo_->port());
  }

 public:
  // A short run of `mode` (HgemmLoadShmTest's too).
  static LoadOptions ShortRun(Mode mode) {
    LoadOptions o;
    EXPECT_EQ(ParseShapes("32x24x40,64x64x64:2", &o.shapes), "");
    o.mode = mode;
    o.warmup_s = 0.1;
    o.window_s = 0.2;
    o.min_window_requests = 3;
    o.max_windows = 4;
    o.max_point_s = 5;
    o.call_timeout_s = 20;
    o.chunk_bytes = 2 << 10;  // several operand chunks per GEMM
    o.reply_chunk_bytes = 4 << 10;
    return o;
  }

 protected:
  // Runs one point per target and checks counts, percentiles and the shape breakdown.
  void RunBothTargets(LoadGenerator& generator, int concurrency) {
    for (Target target : {Target::kService, Target::kEcho}) {
      SCOPED_TRACE(TargetName(target));
      const std::string address = target == Target::kService ? service_target_ : echo_target_;
      PointResult p = generator.RunPoint(target, address, concurrency);
      EXPECT_EQ(p.concurrency, concurrency);
      EXPECT_GE(p.windows, 1);
      EXPECT_LE(p.windows, generator.options().max_windows);
      EXPECT_TRUE(p.error_codes.empty()) << p.first_error;
      ASSERT_EQ(p.stats.size(), 3u);  // the mix, then each shape
      EXPECT_EQ(p.stats[0].shape, "mix");
      EXPECT_GT(p.stats[0].requests, 0);
      EXPECT_EQ(p.stats[0].errors, 0);
      EXPECT_EQ(p.stats[1].requests + p.stats[2].requests, p.stats[0].requests);
      for (const PointStats& s : p.stats) ExpectConsistent(s, target);
      if (target == Target::kService) {
        EXPECT_EQ(p.stats[0].server.count, p.stats[0].requests);
        EXPECT_GE(p.stats[0].server.total_ms, 0);
      } else {
        EXPECT_EQ(p.stats[0].server.count, 0);
      }
      echo_result_ = target == Target::kEcho ? p : echo_result_;
      service_result_ = target == Target::kService ? p : service_result_;
    }
  }

  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<EchoServer> echo_;
  std::string service_target_, echo_target_, metrics_url_;
  PointResult service_result_, echo_result_;
};

TEST_F(HgemmLoadTest, VerifyPassesAgainstTheCpuBackend) {
  for (Mode mode : {Mode::kUnary, Mode::kStream}) {
    LoadGenerator generator(ShortRun(mode));
    VerifyResult v = generator.Verify(service_target_, 2);
    EXPECT_EQ(v.checked, 4);
    EXPECT_EQ(v.failed, 0) << testing::PrintToString(v.lines);
    EXPECT_EQ(v.lines.size(), 4u);
  }
}

TEST_F(HgemmLoadTest, ParallelPartsAreVerifiedAndMeasured) {
  LoadOptions o = ShortRun(Mode::kUnary);
  o.parallel_parts = 3;
  LoadGenerator generator(o);
  VerifyResult v = generator.Verify(service_target_, 2);
  EXPECT_EQ(v.checked, 4);
  EXPECT_EQ(v.failed, 0) << testing::PrintToString(v.lines);
  PointResult p = generator.RunPoint(Target::kService, service_target_, 2);
  EXPECT_TRUE(p.error_codes.empty()) << p.first_error;
  EXPECT_GT(p.stats[0].requests, 0);
  EXPECT_EQ(p.parallel_parts, 3);
  EXPECT_NE(FormatTableRows(p, nullptr).find("parts3"), std::string::npos);
  generator.SetParallelParts(1);
  EXPECT_NE(FormatTableRows(generator.RunPoint(Target::kService, service_target_, 1), nullptr)
                .find("unary"),
            std::string::npos);
}

TEST_F(HgemmLoadTest, UnaryClosedLoopWithBaseline) {
  LoadGenerator generator(ShortRun(Mode::kUnary));
  RunBothTargets(generator, 2);

  std::ostringstream csv;
  WriteCsvHeader(csv);
  WriteCsvRows(csv, service_result_, &echo_result_, "test device", "cpu");
  WriteCsvRows(csv, echo_result_, nullptr, "test device", "cpu");
  std::vector<std::string> lines;
  std::istringstream in(csv.str());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + 3u + 3u);
  auto columns = [](const std::string& line) {
    int n = 1;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) ++n;
    }
    return n;
  };
  for (const std::string& line : lines) EXPECT_EQ(columns(line), columns(lines[0])) << line;
  // The service rows carry the ratio to the echo baseline.
  EXPECT_NE(lines[1].find(",service,unary,none,2,"), std::string::npos);
  EXPECT_NE(FormatTableRows(service_result_, &echo_result_).find("mix"), std::string::npos);
}

TEST_F(HgemmLoadTest, StreamClosedLoopSharesChannels) {
  LoadOptions o = ShortRun(Mode::kStream);
  o.workers_per_channel = 2;  // 3 workers → 2 channels
  LoadGenerator generator(o);
  RunBothTargets(generator, 3);
}

TEST_F(HgemmLoadTest, OpenLoopRateIsBounded) {
  LoadOptions o = ShortRun(Mode::kUnary);
  LoadGenerator generator(o);
  PointResult p = generator.RunPoint(Target::kService, service_target_, 4, /*rate_per_s=*/40);
  EXPECT_EQ(p.rate_per_s, 40);
  EXPECT_TRUE(p.error_codes.empty()) << p.first_error;
  ASSERT_FALSE(p.stats.empty());
  EXPECT_GT(p.stats[0].requests, 0);
  // Calls are scheduled at 40/s from the start: never more than that were sent.
  EXPECT_LE(p.warmup_requests + p.stats[0].requests, int64_t(40 * p.elapsed_s) + 1);
  ExpectConsistent(p.stats[0]);
}

// Resident B (A sent, C returned) and resident A, B and C (only handles on the wire), unary and
// stream: the guard checks C (downloaded for kept Cs), points run without errors, the payload
// counts only the bytes sent and received, and nothing stays resident afterwards.
TEST_F(HgemmLoadTest, ResidentOperandsUnaryAndStream) {
  for (Mode mode : {Mode::kUnary, Mode::kStream}) {
    for (Resident resident : {Resident::kB, Resident::kAll}) {
      SCOPED_TRACE(std::string(ModeName(mode)) + " resident " + ResidentName(resident));
      LoadOptions o = ShortRun(mode);
      o.resident = resident;
      o.client_id = std::string("hgemm_load_test-") + ModeName(mode) + "-" + ResidentName(resident);
      o.max_windows = 2;
      LoadGenerator generator(o);
      EXPECT_EQ(generator.options().client_id, o.client_id);

      VerifyResult v = generator.Verify(service_target_, 1);
      EXPECT_EQ(v.checked, 2);
      EXPECT_EQ(v.failed, 0) << testing::PrintToString(v.lines);
      EXPECT_LE(v.max_error, kServiceTolerance.fp32_acc);

      PointResult p = generator.RunPoint(Target::kService, service_target_, 2);
      EXPECT_EQ(p.resident, resident);
      EXPECT_TRUE(p.error_codes.empty()) << p.first_error;
      ASSERT_EQ(p.stats.size(), 3u);
      EXPECT_GT(p.stats[0].requests, 0);
      EXPECT_EQ(p.stats[0].server.count, p.stats[0].requests);
      // Every call said the launch it ran in (alone, or with the other worker's on one B).
      EXPECT_GE(p.stats[0].server.batch_size, 1);
      EXPECT_LE(p.stats[0].server.batch_size, 2);
      for (size_t i = 0; i < p.stats.size(); ++i) {
        const PointStats& s = p.stats[i];
        ExpectConsistent(s, Target::kService, resident);
        if (i == 0) continue;
        const Shape& shape = o.shapes[i - 1];
        const double bytes = double(s.requests) *
                             double(SentBytes(shape, resident) + ReceivedBytes(shape, resident));
        EXPECT_NEAR(s.payload_gb_per_s * s.seconds * 1e9, bytes, 1e-6 * bytes + 1e-9);
      }
      const std::string table = FormatTableRows(p, nullptr);
      EXPECT_NE(table.find(std::string(" ") + ResidentName(resident) + " "), std::string::npos)
          << table;

      // The echo baseline carries the same bytes: A only, or nothing at all.
      PointResult e = generator.RunPoint(Target::kEcho, echo_target_, 2);
      EXPECT_TRUE(e.error_codes.empty()) << e.first_error;
      ASSERT_FALSE(e.stats.empty());
      EXPECT_GT(e.stats[0].requests, 0);
      for (const PointStats& s : e.stats) ExpectConsistent(s, Target::kEcho, resident);

      std::ostringstream csv;
      WriteCsvHeader(csv);
      WriteCsvRows(csv, p, &e, "test device", "cpu");
      EXPECT_NE(csv.str().find(",resident,"), std::string::npos);
      const std::string row =
          std::string(",service,") + ModeName(mode) + "," + ResidentName(resident) + ",2,";
      EXPECT_NE(csv.str().find(row), std::string::npos) << csv.str();

      // Uploaded operands and kept Cs were all released.
      GemmClient client(LoadGenerator::MakeChannel(service_target_));
      CallOptions call;
      call.client_id = o.client_id;
      v1::ListMatricesResponse listed;
      ASSERT_TRUE(client.ListMatrices(&listed, call).ok());
      EXPECT_EQ(listed.matrices_size(), 0) << listed.DebugString();
      EXPECT_EQ(listed.client_bytes(), 0u);
    }
  }
}

// Three replicas (servers with an advertised address) behind one multi-address target: the
// resident modes keep each shape's operands on one replica and reach them there, unary and
// stream; the guard's results are correct and everything is released on every replica.
TEST(HgemmLoadReplicas, ResidentModesOverThreeReplicas) {
  std::vector<std::unique_ptr<HgemmServer>> replicas;
  std::vector<std::string> addresses;
  std::string target;
  for (int i = 0; i < 3; ++i) {
    addresses.push_back("127.0.0.1:" + std::to_string(subprocess::FreePort()));
    ServerOptions options;
    options.listen_address = addresses.back();
    options.service.resident.replica = addresses.back();
    replicas.push_back(HgemmServer::Start(options, MakeCpuBackend({.workers = 1})));
    ASSERT_NE(replicas.back(), nullptr);
    target += (i == 0 ? "ipv4:" : ",") + addresses.back();
  }
  for (Mode mode : {Mode::kUnary, Mode::kStream}) {
    SCOPED_TRACE(ModeName(mode));
    LoadOptions o;
    ASSERT_EQ(ParseShapes("16x24x8,24x16x32,32x8x16,8x32x24,40x8x8,8x8x40", &o.shapes), "");
    o.mode = mode;
    o.resident = Resident::kAll;
    o.client_id = std::string("replicas-") + ModeName(mode);
    o.warmup_s = 0.1;
    o.window_s = 0.2;
    o.min_window_requests = 3;
    o.max_windows = 2;
    o.max_point_s = 5;
    o.call_timeout_s = 20;
    LoadGenerator generator(o);
    VerifyResult v = generator.Verify(target, 1);
    EXPECT_EQ(v.checked, 6);
    EXPECT_EQ(v.failed, 0) << testing::PrintToString(v.lines);
    PointResult p = generator.RunPoint(Target::kService, target, 3);
    EXPECT_TRUE(p.error_codes.empty()) << p.first_error;
    EXPECT_GT(p.stats[0].requests, 0);
    EXPECT_FALSE(p.upload_replicas.empty());
    for (const std::string& replica : p.upload_replicas) {
      EXPECT_NE(std::find(addresses.begin(), addresses.end(), replica), addresses.end()) << replica;
    }
    GemmClient client(target);
    for (const std::string& replica : addresses) {
      CallOptions call;
      call.client_id = o.client_id;
      call.replica = replica;
      v1::ListMatricesResponse listed;
      ASSERT_TRUE(client.ListMatrices(&listed, call).ok());
      EXPECT_EQ(listed.matrices_size(), 0) << replica << ": " << listed.DebugString();
    }
  }
}

// An upload the server refuses (over the client's quota): the point and the guard report it as
// an error and measure nothing.
TEST_F(HgemmLoadTest, ResidentUploadFailureIsReported) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.service.resident.quota_bytes_per_client = 1024;  // less than any B of the mix
  auto small = HgemmServer::Start(options, MakeCpuBackend({.workers = 1}));
  ASSERT_NE(small, nullptr);
  LoadOptions o = ShortRun(Mode::kUnary);
  o.resident = Resident::kB;
  LoadGenerator generator(o);
  const std::string address = "127.0.0.1:" + std::to_string(small->port());
  PointResult p = generator.RunPoint(Target::kService, address, 1);
  EXPECT_FALSE(p.error_codes.empty());
  EXPECT_NE(p.first_error.find("UploadMatrix"), std::string::npos) << p.first_error;
  ASSERT_FALSE(p.stats.empty());
  EXPECT_EQ(p.stats[0].requests, 0);
  VerifyResult v = generator.Verify(address, 1);
  EXPECT_GT(v.failed, 0);
}

TEST_F(HgemmLoadTest, NoServerEndsWithErrorsCounted) {
  LoadOptions o = ShortRun(Mode::kUnary);
  o.max_point_s = 1;
  o.call_timeout_s = 1;
  LoadGenerator generator(o);
  const std::string nowhere = "127.0.0.1:" + std::to_string(echo_->port());
  echo_->Shutdown();
  PointResult p = generator.RunPoint(Target::kEcho, nowhere, 2);
  ASSERT_FALSE(p.stats.empty());
  EXPECT_EQ(p.stats[0].requests, 0);
  EXPECT_FALSE(p.error_codes.empty());
  EXPECT_FALSE(p.first_error.empty());
  EXPECT_FALSE(p.stable);
}

// --metrics_url: the server's /metrics (real HTTP) around a point count exactly the calls the
// point made, and its stage means are those of real GEMMs; the CSV and the table carry them.
TEST_F(HgemmLoadTest, ServerMetricsCountTheCallsOfAPoint) {
  for (Mode mode : {Mode::kUnary, Mode::kStream}) {
    SCOPED_TRACE(ModeName(mode));
    const std::string rpc = mode == Mode::kStream ? "GemmStream" : "Gemm";
    LoadGenerator generator(ShortRun(mode));
    Scrape before, after;
    ASSERT_EQ(ReadServerMetrics(metrics_url_, &before), "");
    PointResult p = generator.RunPoint(Target::kService, service_target_, 3);
    ASSERT_EQ(ReadServerMetrics(metrics_url_, &after), "");
    ASSERT_TRUE(p.error_codes.empty()) << p.first_error;
    EXPECT_GE(p.calls, p.warmup_requests + p.stats[0].requests);
    p.server_metrics = DiffServerMetrics(before, after, rpc, p.calls);
    const ServerMetricsDelta& d = *p.server_metrics;
    EXPECT_EQ(d.rpc, rpc);
    EXPECT_EQ(d.requests, p.calls);
    EXPECT_EQ(d.ok_requests, p.calls);
    EXPECT_EQ(d.gemms, p.calls) << "every call ran one GEMM, each timed once";
    EXPECT_TRUE(d.Agrees());
    EXPECT_GT(d.total_ms, 0);
    EXPECT_GT(d.kernel_ms, 0);
    EXPECT_LE(d.kernel_ms, d.total_ms);
    EXPECT_LE(d.queue_ms, d.total_ms);

    const std::string table = FormatTableRows(p, nullptr);
    EXPECT_NE(table.find(fmt::format("/metrics: {} {} calls ({} OK) = the client's {}", p.calls,
                                     rpc, p.calls, p.calls)),
              std::string::npos)
        << table;
    EXPECT_EQ(table.find("WARNING"), std::string::npos) << table;
    std::ostringstream csv;
    WriteCsvHeader(csv);
    WriteCsvRows(csv, p, nullptr, "test device", "cpu");
    std::istringstream in(csv.str());
    std::string header, first, second;
    std::getline(in, header);
    std::getline(in, first);   // the mix: the point's server counts
    std::getline(in, second);  // one shape of the mix: none
    EXPECT_NE(header.find(",calls,client_cpu_ms,metrics_rpc,metrics_requests,metrics_ok,"
                          "metrics_agree,"),
              std::string::npos);
    // The calls took this process's CPU time; per successful call on the mix's row only.
    EXPECT_GT(p.client_cpu_s, 0);
    EXPECT_NE(first.find(fmt::format(",{},{:.4g},{},{},{},1,{},", p.calls,
                                     1e3 * p.client_cpu_s / double(p.stats[0].requests), rpc,
                                     p.calls, p.calls, p.calls)),
              std::string::npos)
        << first;
    EXPECT_NE(second.find(fmt::format(",{},,", p.calls)), std::string::npos) << second;
    // Its ten metrics columns are empty; server_verify_ms and server_batch_size, the last
    // columns, follow them.
    std::string before_verify = second.substr(0, second.rfind(','));
    before_verify = before_verify.substr(0, before_verify.rfind(','));
    EXPECT_EQ(before_verify.substr(before_verify.size() - 10), ",,,,,,,,,,") << second;
  }
}

// Another client's call during the point: the counts differ, and the table says so.
TEST_F(HgemmLoadTest, ServerMetricsFlagAMismatch) {
  LoadGenerator generator(ShortRun(Mode::kUnary));
  Scrape before, after;
  ASSERT_EQ(ReadServerMetrics(metrics_url_, &before), "");
  PointResult p = generator.RunPoint(Target::kService, service_target_, 2);
  GemmClient other(Connect(service_target_));
  v1::ListKernelsResponse kernels;  // another rpc: not counted
  ASSERT_TRUE(other.ListKernels(&kernels).ok());
  v1::GemmRequest r;
  r.set_m(1);
  r.set_n(1);
  r.set_k(1);
  r.set_a(std::string(2, '\0'));
  r.set_b(std::string(2, '\0'));
  v1::GemmResponse response;
  ASSERT_TRUE(other.Gemm(r, &response).ok());
  ASSERT_EQ(ReadServerMetrics(metrics_url_, &after), "");
  const ServerMetricsDelta d = DiffServerMetrics(before, after, "Gemm", p.calls);
  EXPECT_EQ(d.requests, p.calls + 1);
  EXPECT_FALSE(d.Agrees());
  const std::string row = FormatServerMetricsRow(d);
  EXPECT_NE(row.find("!= the client's"), std::string::npos) << row;
  EXPECT_NE(row.find(fmt::format("WARNING: the server counted {} Gemm calls, the client made {}",
                                 p.calls + 1, p.calls)),
            std::string::npos)
      << row;
}

TEST_F(HgemmLoadTest, ServerMetricsSayWhyTheyCannotBeRead) {
  Scrape s;
  EXPECT_NE(ReadServerMetrics("127.0.0.1:1/metrics", &s).find("not an http://"), std::string::npos);
  const std::string other_path =
      "http://127.0.0.1:" + std::to_string(server_->metrics_port()) + "/other";
  EXPECT_NE(ReadServerMetrics(other_path, &s).find("HTTP status 404"), std::string::npos);
  // The gRPC port speaks HTTP/2 only: no HTTP/1.0 answer.
  EXPECT_NE(ReadServerMetrics("http://" + service_target_ + "/metrics", &s), "");
}

// Through shared memory (--transport=shm): a server with a Unix socket beside TCP.
class HgemmLoadShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/hgemm_load_shm_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    unix_target_ = "unix:" + dir_ + "/hgemm.sock";
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartServer(bool allow_shared_memory, int workers = 2) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.more_listen_addresses = {unix_target_};
    options.metrics_listen = "127.0.0.1:0";
    options.service.regions.allow_shared_memory = allow_shared_memory;
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = workers}));
    ASSERT_NE(server_, nullptr);
    metrics_url_ = "http://127.0.0.1:" + std::to_string(server_->metrics_port()) + "/metrics";
  }
  // The regions of `client_id` on the server.
  int RegionsOf(const std::string& client_id) {
    GemmClient client(Connect(unix_target_));
    v1::ListRegionsResponse regions;
    CallOptions call;
    call.client_id = client_id;
    EXPECT_TRUE(client.ListRegions(&regions, call).ok());
    return regions.regions_size();
  }
  // The resident matrices of `client_id` on the server.
  int MatricesOf(const std::string& client_id) {
    GemmClient client(Connect(unix_target_));
    v1::ListMatricesResponse matrices;
    CallOptions call;
    call.client_id = client_id;
    EXPECT_TRUE(client.ListMatrices(&matrices, call).ok());
    return matrices.matrices_size();
  }

  std::string dir_, unix_target_, metrics_url_;
  std::unique_ptr<HgemmServer> server_;
};

// Unary calls naming regions (shm), and the same through a submission ring per worker (ring).
TEST_F(HgemmLoadShmTest, VerifiesAndRunsAPointThroughSharedMemory) {
  StartServer(/*allow_shared_memory=*/true);
  for (Transport transport : {Transport::kShm, Transport::kRing}) {
    const std::string name = TransportName(transport);
    SCOPED_TRACE(name);
    LoadOptions o = HgemmLoadTest::ShortRun(Mode::kUnary);
    o.client_id = "load-" + name;
    for (bool transpose : {false, true}) {
      o.form.transpose_b = transpose;
      LoadGenerator generator(o);
      VerifyResult v = generator.Verify(unix_target_, 2, transport);
      EXPECT_EQ(v.checked, 4);
      EXPECT_EQ(v.failed, 0) << testing::PrintToString(v.lines);
      ASSERT_FALSE(v.lines.empty());
      EXPECT_NE(v.lines[0].find("shared memory"), std::string::npos) << v.lines[0];
    }
    LoadGenerator generator(o);
    PointResult p = generator.RunPoint(Target::kService, unix_target_, 3, 0, transport);
    EXPECT_EQ(p.transport, transport);
    EXPECT_TRUE(p.error_codes.empty()) << p.first_error;
    ASSERT_EQ(p.stats.size(), 3u);
    EXPECT_GT(p.stats[0].requests, 0);
    EXPECT_EQ(p.stats[0].server.count, p.stats[0].requests);
    for (const PointStats& s : p.stats) ExpectConsistent(s);
    EXPECT_EQ(FormatTableRows(p, nullptr).rfind(name + " ", 0), 0u) << FormatTableRows(p, nullptr);
    std::ostringstream csv;
    WriteCsvRows(csv, p, nullptr, "test device", "cpu");
    EXPECT_NE(csv.str().find(",cpu," + name + ",unary,none,"), std::string::npos) << csv.str();
    // The point's regions, the workers' and their rings' are released.
    EXPECT_EQ(RegionsOf(o.client_id), 0);
  }
}

// --resident=b through shared memory and the ring: B uploaded once per shape (the ring binds
// the second shape's as a matrix slot when a call first names it), A and C in shared memory;
// C is right, the server batches the GEMMs that queue behind its one worker (shm answers say
// so; for the ring, whose completions cannot, /metrics does: the ring's entries are the point's
// calls), and nothing stays registered or resident afterwards.
TEST_F(HgemmLoadShmTest, ResidentBThroughSharedMemoryAndTheRing) {
  StartServer(/*allow_shared_memory=*/true, /*workers=*/1);
  for (Transport transport : {Transport::kShm, Transport::kRing}) {
    const std::string name = TransportName(transport);
    SCOPED_TRACE(name);
    LoadOptions o = HgemmLoadTest::ShortRun(Mode::kUnary);
    o.client_id = "load-b-" + name;
    o.resident = Resident::kB;
    for (bool transpose : {false, true}) {
      o.form.transpose_b = transpose;
      LoadGenerator generator(o);
      VerifyResult v = generator.Verify(unix_target_, 2, transport);
      EXPECT_EQ(v.checked, 4);
      EXPECT_EQ(v.failed, 0) << testing::PrintToString(v.lines);
      ASSERT_FALSE(v.lines.empty());
      EXPECT_NE(v.lines.back().find("A, C in shared memory, B resident"), std::string::npos)
          << v.lines.back();
      EXPECT_EQ(MatricesOf(o.client_id), 0);
    }
    LoadGenerator generator(o);
    // Eight callers queue behind one worker: a shm point shows batches soon (bounded retries,
    // no timing asserted).
    double batch = 0;
    for (int point = 0; point < 10 && batch <= 1; ++point) {
      Scrape before, after;
      ASSERT_EQ(ReadServerMetrics(metrics_url_, &before), "");
      PointResult p = generator.RunPoint(Target::kService, unix_target_, 8, 0, transport);
      ASSERT_EQ(ReadServerMetrics(metrics_url_, &after), "");
      p.server_metrics = DiffServerMetrics(
          before, after, transport == Transport::kRing ? "ring" : "Gemm", p.calls);
      const ServerMetricsDelta& d = *p.server_metrics;
      EXPECT_EQ(d.requests, p.calls);
      EXPECT_EQ(d.ok_requests, p.calls);
      EXPECT_LE(d.batched_gemms, p.calls);
      EXPECT_LE(2 * d.batches, d.batched_gemms);
      EXPECT_EQ(p.resident, Resident::kB);
      EXPECT_TRUE(p.error_codes.empty()) << p.first_error;
      ASSERT_EQ(p.stats.size(), 3u);
      EXPECT_GT(p.stats[0].requests, 0);
      EXPECT_EQ(p.stats[0].server.count, p.stats[0].requests);
      for (const PointStats& s : p.stats) ExpectConsistent(s, Target::kService, Resident::kB);
      std::ostringstream csv;
      WriteCsvRows(csv, p, nullptr, "test device", "cpu");
      EXPECT_NE(csv.str().find(",cpu," + name + ",unary,b,"), std::string::npos) << csv.str();
      EXPECT_EQ(RegionsOf(o.client_id), 0);
      EXPECT_EQ(MatricesOf(o.client_id), 0);
      if (transport == Transport::kRing) {
        EXPECT_EQ(p.stats[0].server.batch_size, 0) << "a ring's completion says no batch size";
        batch = d.GemmsPerLaunch();
        // The table's batch column and the CSV's server_batch_size say the metrics' figure.
        EXPECT_NE(csv.str().find(fmt::format(",{:.4g}\n", batch)), std::string::npos) << csv.str();
      } else {
        batch = p.stats[0].server.batch_size;
      }
      EXPECT_GE(batch, 1);
    }
    EXPECT_GT(batch, 1) << "no batch in ten points";
  }
}

TEST_F(HgemmLoadShmTest, SaysWhySharedMemoryIsRefused) {
  StartServer(/*allow_shared_memory=*/false);
  LoadGenerator generator(HgemmLoadTest::ShortRun(Mode::kUnary));
  PointResult p = generator.RunPoint(Target::kService, unix_target_, 2, 0, Transport::kShm);
  EXPECT_EQ(p.error_codes.count(int(grpc::StatusCode::FAILED_PRECONDITION)), 1u);
  EXPECT_NE(p.first_error.find("--allow_shared_memory"), std::string::npos) << p.first_error;
  LoadGenerator streaming(HgemmLoadTest::ShortRun(Mode::kStream));
  p = streaming.RunPoint(Target::kService, unix_target_, 2, 0, Transport::kShm);
  EXPECT_NE(p.first_error.find("unary"), std::string::npos) << p.first_error;
  LoadOptions all = HgemmLoadTest::ShortRun(Mode::kUnary);
  all.resident = Resident::kAll;
  LoadGenerator all_resident(all);
  p = all_resident.RunPoint(Target::kService, unix_target_, 2, 0, Transport::kRing);
  EXPECT_EQ(p.error_codes.count(int(grpc::StatusCode::INVALID_ARGUMENT)), 1u);
  EXPECT_NE(p.first_error.find("a resident B"), std::string::npos) << p.first_error;
}

}  // namespace
}  // namespace hgemm::bench
