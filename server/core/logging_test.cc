// The log formats: every JSON line parses (nlohmann::json, strict) whatever bytes a field holds,
// text fields are escaped so that a client's string cannot start a line of its own, and the
// traceparent check takes the W3C form and nothing else.
#include "server/core/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hgemm::logging {
namespace {

// Captures the default logger's lines in `format` for the life of the object.
class CapturedLog {
 public:
  explicit CapturedLog(Format format)
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16)) {
    Install(format);
    if (format == Format::kJson) sink_->set_formatter(MakeJsonFormatter());
    spdlog::default_logger()->sinks().push_back(sink_);
    level_ = spdlog::get_level();
    spdlog::set_level(spdlog::level::debug);
  }
  ~CapturedLog() {
    spdlog::default_logger()->sinks().pop_back();
    spdlog::set_level(level_);
    Install(Format::kText);
  }
  std::vector<std::string> Lines() const { return sink_->last_formatted(); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

TEST(Logging, ParsesFormatNames) {
  Format f;
  EXPECT_TRUE(ParseFormat("json", &f));
  EXPECT_EQ(f, Format::kJson);
  EXPECT_TRUE(ParseFormat("text", &f));
  EXPECT_EQ(f, Format::kText);
  EXPECT_FALSE(ParseFormat("JSON", &f));
  EXPECT_FALSE(ParseFormat("", &f));
}

TEST(Logging, JsonLinesCarryTimeLevelMessageAndFields) {
  std::vector<std::string> lines;
  {
    CapturedLog log(Format::kJson);
    const std::string hostile = "id\"\n{\"level\":\"error\"}\x01\xff\xc3";
    Log(spdlog::level::info, "Gemm INVALID_ARGUMENT",
        {{"rpc", "Gemm", false}, {"request_id", hostile}, {"principal", ""}});
    spdlog::warn("plain line with a \"quote\" and \x02");
    lines = log.Lines();
  }
  ASSERT_EQ(lines.size(), 2u);
  for (const std::string& line : lines) {
    ASSERT_EQ(line.back(), '\n');
    EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line each: " << line;
  }
  const nlohmann::json call = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(call["level"], "info");
  EXPECT_EQ(call["message"], "Gemm INVALID_ARGUMENT");
  EXPECT_EQ(call["rpc"], "Gemm") << "in_text=false fields are still in JSON";
  EXPECT_EQ(call["principal"], "") << "empty fields keep the schema";
  const std::string id = call["request_id"];
  EXPECT_EQ(id.substr(0, 4), "id\"\n") << "quotes and newlines are encoded, not cut";
  EXPECT_NE(id.find("\xef\xbf\xbd"), std::string::npos) << "invalid UTF-8 becomes U+FFFD";
  // 2026-01-02T03:04:05.123456Z
  const std::string time = call["time"];
  EXPECT_EQ(time.size(), 27u) << time;
  EXPECT_EQ(time.back(), 'Z');
  EXPECT_EQ(time[10], 'T');
  const nlohmann::json plain = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(plain["level"], "warning");
  EXPECT_EQ(plain["message"], "plain line with a \"quote\" and \x02");
  EXPECT_EQ(plain.size(), 3u);
}

TEST(Logging, JsonFieldsAreCut) {
  std::vector<std::string> lines;
  {
    CapturedLog log(Format::kJson);
    Log(spdlog::level::info, "long", {{"reason", std::string(5000, 'x')}});
    lines = log.Lines();
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["reason"].get<std::string>().size(), kMaxFieldBytes);
}

TEST(Logging, TextFieldsFollowTheMessageEscaped) {
  std::vector<std::string> lines;
  {
    CapturedLog log(Format::kText);
    Log(spdlog::level::info, "Gemm INVALID_ARGUMENT",
        {{"rpc", "Gemm", false},
         {"reason", "n: must be at least 1"},
         {"request_id", "req-7"},
         {"principal", ""},
         {"peer", "evil\n[info] forged line \"x\"=\\"}});
    lines = log.Lines();
  }
  ASSERT_EQ(lines.size(), 1u);
  const std::string& line = lines[0];
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
  EXPECT_NE(line.find("Gemm INVALID_ARGUMENT reason=\"n: must be at least 1\" request_id=req-7 "
                      "peer=\"evil\\x0a[info] forged line \\\"x\\\"=\\\\\""),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("rpc="), std::string::npos) << "in_text=false is left out of text";
  EXPECT_EQ(line.find("principal"), std::string::npos) << "empty fields are left out of text";
}

TEST(Logging, FilteredLevelsAreNotFormatted) {
  std::vector<std::string> lines;
  {
    CapturedLog log(Format::kJson);
    spdlog::set_level(spdlog::level::info);
    Log(spdlog::level::debug, "per-GEMM line", {{"request_id", "x"}});
    lines = log.Lines();
  }
  EXPECT_TRUE(lines.empty());
}

TEST(Traceparent, AcceptsTheW3cForm) {
  const std::string valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  EXPECT_EQ(ValidTraceparent(valid), valid);
  EXPECT_EQ(ValidTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
}

TEST(Traceparent, RejectsEverythingElse) {
  for (const std::string& bad : std::vector<std::string>{
           std::string(""),
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0"),    // 54 chars
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011"),  // 56 chars
           std::string("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),   // version
           std::string("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
           std::string("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),   // upper case
           std::string("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),   // zero trace
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),   // zero parent
           std::string("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),   // separator
           std::string("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01"),   // not hex
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\n"),  // newline
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736\n[info] forged-line-01"),
       }) {
    EXPECT_EQ(ValidTraceparent(bad), "") << bad;
  }
}

}  // namespace
}  // namespace hgemm::logging
