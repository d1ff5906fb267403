// Reading a server's Prometheus metrics: a small HTTP/1.0 GET client for http:// URLs (plain
// sockets, one request per connection, as Prometheus scrapes) and a strict reader of the text
// exposition format 0.0.4 that both parses and checks it. Used by hgemm_load --metrics_url and
// by the tests of /metrics.
// Thread safety: free functions without shared state; a Scrape is a plain value.
#ifndef HGEMM_CLIENT_METRICS_SCRAPE_H_
#define HGEMM_CLIENT_METRICS_SCRAPE_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace hgemm {

// The samples of one scrape: "name{l1="v1",l2="v2"}" (labels sorted by name) → value.
struct Scrape {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;  // family name → counter, gauge, histogram, ...
  std::vector<std::string> errors;           // empty: the text is well formed

  // The value of one series, NaN if absent.
  double Get(const std::string& series) const;
  bool Has(const std::string& series) const { return samples.count(series) > 0; }
  // Every series of metric `name` (exact name, any labels).
  std::map<std::string, double> Series(const std::string& name) const;
};

// Parses `text` (the body of GET /metrics). Everything the format forbids is reported in
// errors (with its line): missing or repeated TYPE, samples outside their family's block, bad
// names, labels, values or timestamps, duplicate series, negative counters, histograms whose
// buckets are not cumulative, lack +Inf or disagree with _count. What parses is in samples.
Scrape ParseExposition(const std::string& text);

// A sample value: a number, "+Inf", "-Inf" or "NaN". False if it is none of these.
bool ParseValue(const std::string& text, double* value);

// "http://HOST:PORT/PATH" (PORT default 80, PATH default /; [v6] hosts). Returns "" or what
// is wrong (https is not spoken).
std::string ParseHttpUrl(const std::string& url, std::string* host, int* port, std::string* path);

// GET `path` from HOST:PORT over HTTP/1.0, each connect, write and read bounded by `timeout`.
// Returns the status code and the body in *body; -1 if no HTTP answer came (why in *error, if
// given), -2 if the body is not as long as the server's Content-Length said.
int HttpGet(const std::string& host, int port, const std::string& path, std::string* body,
            std::chrono::milliseconds timeout = std::chrono::seconds(10),
            std::string* error = nullptr);

}  // namespace hgemm

#endif  // HGEMM_CLIENT_METRICS_SCRAPE_H_
