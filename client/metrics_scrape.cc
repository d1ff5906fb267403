#include "client/metrics_scrape.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>

namespace hgemm {
namespace {

// The family a sample name belongs to, given the TYPEs seen: histogram samples are
// name_bucket, name_sum and name_count.
std::string FamilyOf(const std::string& sample, const std::map<std::string, std::string>& types,
                     std::string* suffix) {
  suffix->clear();
  if (types.count(sample)) return sample;
  for (const char* s : {"_bucket", "_sum", "_count"}) {
    const std::string sfx = s;
    if (sample.size() > sfx.size() &&
        sample.compare(sample.size() - sfx.size(), sfx.size(), sfx) == 0) {
      std::string base = sample.substr(0, sample.size() - sfx.size());
      auto it = types.find(base);
      if (it != types.end() &&
          (it->second == "histogram" || (it->second == "summary" && sfx != "_bucket"))) {
        *suffix = sfx;
        return base;
      }
    }
  }
  return "";
}

// Closes the socket it holds when it goes.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  const int fd_;
};

// A socket connected to host:port (any address family getaddrinfo gives), or -1 and why.
int ConnectTcp(const std::string& host, int port, std::chrono::milliseconds timeout,
               std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    *error = host + ": " + gai_strerror(rc);
    return -1;
  }
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  int fd = -1;
  *error = host + ": no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // Also bounds connect() on Linux.
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      *error = host + ":" + std::to_string(port) + ": " + std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

}  // namespace

double Scrape::Get(const std::string& series) const {
  auto it = samples.find(series);
  return it == samples.end() ? NAN : it->second;
}

std::map<std::string, double> Scrape::Series(const std::string& name) const {
  std::map<std::string, double> out;
  for (const auto& [key, value] : samples) {
    if (key == name || key.rfind(name + "{", 0) == 0) out[key] = value;
  }
  return out;
}

bool ParseValue(const std::string& text, double* value) {
  if (text == "+Inf") return *value = INFINITY, true;
  if (text == "-Inf") return *value = -INFINITY, true;
  if (text == "NaN") return *value = NAN, true;
  static const std::regex number(R"([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)");
  if (!std::regex_match(text, number)) return false;
  *value = std::strtod(text.c_str(), nullptr);
  return true;
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
            if (e == 'n')
              value += '\n';
            else if (e == '\\' || e == '"')
              value += e;
            else
              ok = false;
            i += 2;
          } else {
            value += line[i++];
          }
        }
        if (i >= line.size()) {
          ok = false;
          break;
        }
        ++i;                                                   // the closing quote
        if (!labels.emplace(label, value).second) ok = false;  // a label given twice
        if (i < line.size() && line[i] == ',')
          ++i;
        else if (i < line.size() && line[i] != '}')
          ok = false;
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

std::string ParseHttpUrl(const std::string& url, std::string* host, int* port, std::string* path) {
  static const std::regex form(R"(http://(\[[0-9a-fA-F:.]+\]|[^/:\[\]]+)(:(\d{1,5}))?(/.*)?)");
  std::smatch m;
  if (!std::regex_match(url, m, form)) return "not an http://HOST[:PORT][/PATH] URL: " + url;
  *host = m[1].str();
  if (host->front() == '[') *host = host->substr(1, host->size() - 2);
  *port = m[3].matched ? std::stoi(m[3].str()) : 80;
  if (*port < 1 || *port > 65535) return "port out of range in " + url;
  *path = m[4].matched ? m[4].str() : "/";
  return "";
}

int HttpGet(const std::string& host, int port, const std::string& path, std::string* body,
            std::chrono::milliseconds timeout, std::string* error) {
  body->clear();
  std::string why;
  if (error == nullptr) error = &why;
  Socket socket(ConnectTcp(host, port, timeout, error));
  if (socket.fd() < 0) return -1;
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    ssize_t w = write(socket.fd(), request.data() + sent, request.size() - sent);
    if (w <= 0) {
      *error = "writing the request: " + std::string(std::strerror(errno));
      return -1;
    }
    sent += w;
  }
  std::string response;
  char buffer[65536];
  ssize_t r;
  while ((r = read(socket.fd(), buffer, sizeof buffer)) > 0) response.append(buffer, r);
  if (r < 0) {
    *error = "reading the answer: " + std::string(std::strerror(errno));
    return -1;
  }
  const size_t end = response.find("\r\n\r\n");
  if (end == std::string::npos || response.rfind("HTTP/1.", 0) != 0) {
    *error = "not an HTTP answer";
    return -1;
  }
  const std::string headers = response.substr(0, end);
  *body = response.substr(end + 4);
  std::smatch length;
  if (std::regex_search(headers, length, std::regex(R"(\r\n[Cc]ontent-[Ll]ength: *(\d+))")) &&
      std::stoul(length[1]) != body->size()) {
    *error = "the body is not as long as Content-Length says";
    return -2;
  }
  return std::atoi(response.c_str() + response.find(' ') + 1);
}

}  // namespace hgemm
