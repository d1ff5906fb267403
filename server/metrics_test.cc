// /metrics end to end: a real HgemmServer on 127.0.0.1 (CPU backend) with metrics_listen, a
// known mix of calls through the real client library, then a real HTTP GET of /metrics (a
// small socket client, HTTP/1.0) whose text must pass a strict parser of the Prometheus text
// format (0.0.4) and show exactly those counts. Also: the parser itself rejects malformed text,
// refused calls are logged at info, and the endpoint keeps answering while GEMMs run.
#include "server/metrics.h"

#include <arpa/inet.h>
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
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "kernels/host/cpu_gemm.h"
#include "server/backend/cpu_backend.h"
#include "server/test_requests.h"
#include "server/metrics_http.h"
#include "server/server.h"
#include "server/status_util.h"

namespace hgemm {
namespace {

// ---- A strict reader of the Prometheus text exposition format -------------------------------

// The samples of one scrape: "name{l1="v1",l2="v2"}" (labels sorted by name) → value.
struct Scrape {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;  // family name → counter, gauge, histogram, ...
  std::vector<std::string> errors;           // empty: the text is well formed

  double Get(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? NAN : it->second;
  }
  bool Has(const std::string& series) const { return samples.count(series) > 0; }
  // Every series of metric `name` (exact name, any labels).
  std::map<std::string, double> Series(const std::string& name) const {
    std::map<std::string, double> out;
    for (const auto& [key, value] : samples) {
      if (key == name || key.rfind(name + "{", 0) == 0) out[key] = value;
    }
    return out;
  }
};

bool ParseValue(const std::string& text, double* value) {
  if (text == "+Inf") return *value = INFINITY, true;
  if (text == "-Inf") return *value = -INFINITY, true;
  if (text == "NaN") return *value = NAN, true;
  static const std::regex number(R"([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)");
  if (!std::regex_match(text, number)) return false;
  *value = std::strtod(text.c_str(), nullptr);
  return true;
}

// The family a sample name belongs to, given the TYPEs seen: histogram samples are
// name_bucket, name_sum and name_count.
std::string FamilyOf(const std::string& sample, const std::map<std::string, std::string>& types,
                     std::string* suffix) {
  suffix->clear();
  if (types.count(sample)) return sample;
  for (const char* s : {"_bucket", "_sum", "_count"}) {
    const std::string sfx = s;
    if (sample.size() > sfx.size() && sample.compare(sample.size() - sfx.size(), sfx.size(), sfx) == 0) {
      std::string base = sample.substr(0, sample.size() - sfx.size());
      auto it = types.find(base);
      if (it != types.end() && (it->second == "histogram" || (it->second == "summary" && sfx != "_bucket"))) {
        *suffix = sfx;
        return base;
      }
    }
  }
  return "";
}

Scrape ParseExposition(const std::string& text) {
  Scrape out;
  auto error = [&](int line, const std::string& what) {
    out.errors.push_back("line " + std::to_string(line) + ": " + what);
  };
  if (text.empty() || text.back() != '\n') error(0, "the text does not end with a newline");
  static const std::regex metric_name(R"([a-zA-Z_:][a-zA-Z0-9_:]*)");
  static const std::regex label_name(R"([a-zA-Z_][a-zA-Z0-9_]*)");
  static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                               "untyped"};
  std::set<std::string> helped, families_with_samples;
  std::string current_family;
  // Histogram checks: per series (labels without le) the bucket values in order.
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // series → (le, value)
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) {
      error(n, "empty line");
      continue;
    }
    if (line[0] == '#') {
      std::istringstream words(line);
      std::string hash, keyword, name;
      words >> hash >> keyword >> name;
      if (hash != "#" || (keyword != "HELP" && keyword != "TYPE")) {
        error(n, "a comment that is neither HELP nor TYPE: " + line);
        continue;
      }
      if (!std::regex_match(name, metric_name)) error(n, "bad metric name " + name);
      if (keyword == "HELP") {
        if (!helped.insert(name).second) error(n, "second HELP for " + name);
        continue;
      }
      std::string type, extra;
      words >> type;
      if (!kTypes.count(type)) error(n, "unknown type " + type);
      if (words >> extra) error(n, "text after the type");
      if (out.types.count(name)) error(n, "second TYPE for " + name);
      if (families_with_samples.count(name)) error(n, "TYPE after the samples of " + name);
      out.types[name] = type;
      current_family = name;
      continue;
    }
    // A sample: name[{labels}] value [timestamp]
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    const std::string name = line.substr(0, i);
    if (!std::regex_match(name, metric_name)) {
      error(n, "bad metric name in " + line);
      continue;
    }
    std::map<std::string, std::string> labels;
    bool ok = true;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (ok && i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) {
          ok = false;
          break;
        }
        const std::string label = line.substr(i, eq - i);
        if (!std::regex_match(label, label_name) || label.rfind("__", 0) == 0) ok = false;
        i = eq + 1;
        if (i >= line.size() || line[i] != '"') {
          ok = false;
          break;
        }
        ++i;
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\') {
            if (i + 1 >= line.size()) {
              ok = false;
              break;
            }
            const char e = line[i + 1];
            if (e == 'n') value += '\n';
            else if (e == '\\' || e == '"') value += e;
            else ok = false;
            i += 2;
          } else {
            value += line[i++];
          }
        }
        if (i >= line.size()) {
          ok = false;
          break;
        }
        ++i;  // the closing quote
        if (!labels.emplace(label, value).second) ok = false;  // a label given twice
        if (i < line.size() && line[i] == ',') ++i;
        else if (i < line.size() && line[i] != '}') ok = false;
      }
      if (i >= line.size() || line[i] != '}') ok = false;
      ++i;
    }
    if (!ok) {
      error(n, "bad labels in " + line);
      continue;
    }
    if (i >= line.size() || line[i] != ' ') {
      error(n, "no value in " + line);
      continue;
    }
    std::istringstream rest(line.substr(i + 1));
    std::string value_text, timestamp, extra;
    rest >> value_text >> timestamp >> extra;
    double value;
    if (!ParseValue(value_text, &value)) {
      error(n, "bad value in " + line);
      continue;
    }
    if (!timestamp.empty() && !std::regex_match(timestamp, std::regex(R"(-?\d+)"))) {
      error(n, "bad timestamp in " + line);
    }
    if (!extra.empty()) error(n, "text after the timestamp in " + line);
    std::string suffix;
    const std::string family = FamilyOf(name, out.types, &suffix);
    if (family.empty()) {
      error(n, "sample of a metric without TYPE: " + name);
      continue;
    }
    if (family != current_family) error(n, "sample of " + family + " outside its family's block");
    families_with_samples.insert(family);
    const std::string& type = out.types[family];
    if (type == "counter" && !(value >= 0)) error(n, "negative or NaN counter " + line);
    if (type == "histogram" && suffix.empty()) error(n, "histogram sample without suffix " + line);
    if (suffix == "_bucket") {
      auto le = labels.find("le");
      double bound;
      if (le == labels.end() || !ParseValue(le->second, &bound)) {
        error(n, "bucket without a valid le: " + line);
      } else {
        auto without_le = labels;
        without_le.erase("le");
        std::string series = family;
        for (const auto& [k, v] : without_le) series += "," + k + "=" + v;
        buckets[series].emplace_back(bound, value);
      }
    } else if (labels.count("le")) {
      error(n, "le on a sample that is not a bucket: " + line);
    }
    std::string key = name;
    if (!labels.empty()) {
      key += "{";
      bool first = true;
      for (const auto& [k, v] : labels) {
        key += (first ? "" : ",") + k + "=\"" + v + "\"";
        first = false;
      }
      key += "}";
    }
    if (!out.samples.emplace(key, value).second) error(n, "duplicate series " + key);
  }
  for (const auto& [series, values] : buckets) {
    for (size_t j = 1; j < values.size(); ++j) {
      if (!(values[j].first > values[j - 1].first)) error(0, series + ": le not increasing");
      if (values[j].second < values[j - 1].second) error(0, series + ": buckets not cumulative");
    }
    if (values.empty() || values.back().first != INFINITY) error(0, series + ": no +Inf bucket");
  }
  // Each histogram series: its +Inf bucket equals its _count.
  for (const auto& [series, values] : buckets) {
    const std::string family = series.substr(0, series.find(','));
    std::string key = family + "_count";
    if (series.size() > family.size()) {
      key += "{";
      std::string rest = series.substr(family.size() + 1);
      std::stringstream parts(rest);
      bool first = true;
      for (std::string part; std::getline(parts, part, ',');) {
        const size_t eq = part.find('=');
        key += (first ? "" : ",") + part.substr(0, eq) + "=\"" + part.substr(eq + 1) + "\"";
        first = false;
      }
      key += "}";
    }
    auto count = out.samples.find(key);
    if (count == out.samples.end()) {
      error(0, "no " + key);
    } else if (!values.empty() && values.back().second != count->second) {
      error(0, key + " differs from its +Inf bucket");
    }
  }
  return out;
}

std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

TEST(ExpositionParser, AcceptsWellFormedText) {
  Scrape s = ParseExposition(
      "# HELP a_total Things.\n# TYPE a_total counter\na_total{code=\"OK\",rpc=\"Gemm\"} 3\n"
      "# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\nh_count 2\n"
      "# TYPE g gauge\ng -1.5e-3 1700000000000\n");
  EXPECT_TRUE(s.errors.empty()) << Join(s.errors);
  EXPECT_EQ(s.Get("a_total{code=\"OK\",rpc=\"Gemm\"}"), 3);
  EXPECT_EQ(s.Get("h_count"), 2);
  EXPECT_EQ(s.Get("g"), -1.5e-3);
}

TEST(ExpositionParser, RejectsMalformedText) {
  for (const char* bad : {
           "a 1\n",                                                    // no TYPE
           "# TYPE a counter\na{x=\"1} 1\n",                           // unterminated value
           "# TYPE a counter\na{x=1} 1\n",                             // unquoted value
           "# TYPE a counter\na{x=\"1\",x=\"2\"} 1\n",                 // label twice
           "# TYPE a counter\na 1\na 2\n",                             // duplicate series
           "# TYPE a counter\na one\n",                                // bad value
           "# TYPE a counter\na -1\n",                                 // negative counter
           "# TYPE a counter\na 1",                                    // no final newline
           "# TYPE a counter\n\na 1\n",                                // empty line
           "# TYPE a wibble\na 1\n",                                   // unknown type
           "# note\n# TYPE a counter\na 1\n",                          // stray comment
           "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n",
           "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\nh_sum 1\n",  // no +Inf
           "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\nh_sum 1\n",  // count differs
           "# TYPE a counter\n# TYPE b counter\na 1\n",                // a outside its block
           "# TYPE 1a counter\n1a 1\n",                                // bad name
       }) {
    EXPECT_FALSE(ParseExposition(bad).errors.empty()) << bad;
  }
}

// ---- HTTP ----------------------------------------------------------------------------------

// GET `path` from 127.0.0.1:`port` over HTTP/1.0; the status code, the body in `body`.
int HttpGet(int port, const std::string& path, std::string* body) {
  body->clear();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    ssize_t w = write(fd, request.data() + sent, request.size() - sent);
    if (w <= 0) {
      close(fd);
      return -1;
    }
    sent += w;
  }
  std::string response;
  char buffer[65536];
  for (ssize_t r; (r = read(fd, buffer, sizeof buffer)) > 0;) response.append(buffer, r);
  close(fd);
  const size_t end = response.find("\r\n\r\n");
  if (end == std::string::npos || response.rfind("HTTP/1.", 0) != 0) return -1;
  const std::string headers = response.substr(0, end);
  *body = response.substr(end + 4);
  std::smatch length;
  if (std::regex_search(headers, length, std::regex(R"(\r\n[Cc]ontent-[Ll]ength: *(\d+))")) &&
      std::stoul(length[1]) != body->size()) {
    return -2;  // the body is not what the server announced
  }
  return std::atoi(response.c_str() + response.find(' ') + 1);
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
  ASSERT_TRUE(client_->UploadMatrix(12, 10, std::string(reinterpret_cast<const char*>(data.data()),
                                                         2 * data.size()),
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
  for (const char* stage : {"queue_wait", "host_to_device", "kernel", "device_to_host", "server_total"}) {
    EXPECT_EQ(s.Get(std::string(R"(hgemm_gemm_stage_seconds_count{backend="cpu",kernel="openblas_sgemm",stage=")") +
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
  EXPECT_GT(s.Get(R"(hgemm_gemm_stage_seconds_sum{backend="cpu",kernel="openblas_sgemm",stage="server_total"})"),
            0);
  EXPECT_EQ(s.Get(R"(hgemm_received_bytes_total{rpc="Gemm"})"), double(gemm_received));
  EXPECT_EQ(s.Get(R"(hgemm_sent_bytes_total{rpc="Gemm"})"), double(gemm_sent));
  EXPECT_EQ(s.Get(R"(hgemm_received_bytes_total{rpc="UploadMatrix"})"), 2.0 * data.size());
  // The refused streamed GEMM's chunks are dropped before they are counted; the two that ran
  // had all of theirs.
  EXPECT_EQ(s.Get(R"(hgemm_received_bytes_total{rpc="GemmStream"})"),
            double(s1.a().size() + s1.b().size() + s2.a().size() + s2.b().size()));
  EXPECT_EQ(s.Get(R"(hgemm_sent_bytes_total{rpc="GemmStream"})"), 2.0 * (16 * 8 + 5 * 6));
  EXPECT_EQ(s.Get(std::string(R"(hgemm_build_info{backend="cpu",version=")") + kVersion + "\"}"), 1);
  EXPECT_EQ(s.Get("hgemm_queued_gemms"), 0);
  EXPECT_EQ(s.Get("hgemm_running_gemms"), 0);
  EXPECT_EQ(s.Get("hgemm_admitted_bytes"), 0);
  EXPECT_EQ(s.Get("hgemm_upload_queue_writes"), 0);
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
  EXPECT_EQ(client_->Gemm(zero, &response, traced).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
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
  EXPECT_NE(refusals[0].find("Gemm INVALID_ARGUMENT reason=\"n:"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find(" request_id=req-7 "), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find(" peer=ipv4:127.0.0.1:"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find(" traceparent=" + traced.traceparent), std::string::npos) << refusals[0];
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

TEST(StatusCodeName, NamesEveryCode) {
  EXPECT_STREQ(status::CodeName(grpc::StatusCode::OK), "OK");
  EXPECT_STREQ(status::CodeName(grpc::StatusCode::INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(status::CodeName(grpc::StatusCode::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(status::CodeName(grpc::StatusCode::UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_STREQ(status::CodeName(grpc::StatusCode(99)), "UNKNOWN");
  std::set<std::string> names;
  for (int c = 0; c <= 16; ++c) names.insert(status::CodeName(grpc::StatusCode(c)));
  EXPECT_EQ(names.size(), 17u) << "each code has its own name";
}

}  // namespace
}  // namespace hgemm
