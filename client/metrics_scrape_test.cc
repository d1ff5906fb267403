// The reader of the Prometheus text format accepts what the format allows and rejects the
// rest; URLs parse; HttpGet reports a refused connection instead of hanging. (Its use against a
// real /metrics is in server/metrics_test.cc and bench/hgemm_load_test.cc.)
#include "client/metrics_scrape.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace hgemm {
namespace {

TEST(ExpositionParser, AcceptsWellFormedText) {
  Scrape s = ParseExposition(
      "# HELP a_total Things.\n# TYPE a_total counter\na_total{code=\"OK\",rpc=\"Gemm\"} 3\n"
      "# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\nh_count 2\n"
      "# TYPE g gauge\ng -1.5e-3 1700000000000\n");
  EXPECT_TRUE(s.errors.empty()) << ::testing::PrintToString(s.errors);
  EXPECT_EQ(s.Get("a_total{code=\"OK\",rpc=\"Gemm\"}"), 3);
  EXPECT_EQ(s.Get("h_count"), 2);
  EXPECT_EQ(s.Get("g"), -1.5e-3);
}

TEST(ExpositionParser, RejectsMalformedText) {
  for (const char* bad : {
           "a 1\n",                                     // no TYPE
           "# TYPE a counter\na{x=\"1} 1\n",            // unterminated value
           "# TYPE a counter\na{x=1} 1\n",              // unquoted value
           "# TYPE a counter\na{x=\"1\",x=\"2\"} 1\n",  // label twice
           "# TYPE a counter\na 1\na 2\n",              // duplicate series
           "# TYPE a counter\na one\n",                 // bad value
           "# TYPE a counter\na -1\n",                  // negative counter
           "# TYPE a counter\na 1",                     // no final newline
           "# TYPE a counter\n\na 1\n",                 // empty line
           "# TYPE a wibble\na 1\n",                    // unknown type
           "# note\n# TYPE a counter\na 1\n",           // stray comment
           "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum "
           "1\n",
           "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\nh_sum 1\n",     // no +Inf
           "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\nh_sum 1\n",  // count differs
           "# TYPE a counter\n# TYPE b counter\na 1\n",  // a outside its block
           "# TYPE 1a counter\n1a 1\n",                  // bad name
       }) {
    EXPECT_FALSE(ParseExposition(bad).errors.empty()) << bad;
  }
}

TEST(HttpUrl, ParsesHostPortAndPath) {
  std::string host, path;
  int port = 0;
  EXPECT_EQ(ParseHttpUrl("http://127.0.0.1:9090/metrics", &host, &port, &path), "");
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 9090);
  EXPECT_EQ(path, "/metrics");
  EXPECT_EQ(ParseHttpUrl("http://hgemm.example", &host, &port, &path), "");
  EXPECT_EQ(host, "hgemm.example");
  EXPECT_EQ(port, 80);
  EXPECT_EQ(path, "/");
  EXPECT_EQ(ParseHttpUrl("http://[::1]:8080/metrics?x=1", &host, &port, &path), "");
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 8080);
  EXPECT_EQ(path, "/metrics?x=1");
  for (const char* bad : {"https://h:1/metrics", "127.0.0.1:9090/metrics", "http://",
                          "http://h:99999/", "http://h:x/", "http://[::1/"}) {
    EXPECT_NE(ParseHttpUrl(bad, &host, &port, &path), "") << bad;
  }
}

TEST(HttpGet, SaysWhyWhenNothingListens) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);  // a port that was free a moment ago
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  std::string body, error;
  EXPECT_EQ(HttpGet("127.0.0.1", ntohs(addr.sin_port), "/metrics", &body, std::chrono::seconds(5),
                    &error),
            -1);
  EXPECT_NE(error.find("refused"), std::string::npos) << error;
}

}  // namespace
}  // namespace hgemm
