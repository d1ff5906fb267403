#include "server/core/logging.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/sinks/sink.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace hgemm::logging {
namespace {

std::atomic<bool> json_lines{false};

// The logger name of the messages Log() hands to the sinks in JSON: their payload is the line's
// members ("message":...,"rpc":...) already encoded, for JsonFormatter to wrap. Carried in the
// message itself, so sinks that format later (ringbuffer, async) still get them.
constexpr char kEncodedMembers[] = "hgemm.json_members";

// `"message":"...","key":"value",...`: the members of a line, without the braces.
std::string EncodeMembers(std::string_view message, std::initializer_list<Field> fields) {
  nlohmann::ordered_json members;
  members["message"] = std::string(message);
  for (const Field& f : fields)
    members[std::string(f.key)] = std::string(f.value.substr(0, kMaxFieldBytes));
  const std::string object =
      members.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  return object.substr(1, object.size() - 2);
}

std::string Timestamp(std::chrono::system_clock::time_point time) {
  const auto seconds = std::chrono::floor<std::chrono::seconds>(time);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(time - seconds).count();
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06d}Z",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(seconds)), micros);
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    const std::string members =
        std::string_view(msg.logger_name.data(), msg.logger_name.size()) == kEncodedMembers
            ? std::string(payload)
            : EncodeMembers(payload, {});
    const std::string line = fmt::format(R"({{"time":"{}","level":"{}",{}}})", Timestamp(msg.time),
                                         std::string_view(level.data(), level.size()), members);
    dest.append(line.data(), line.data() + line.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

bool PlainToken(std::string_view value) {
  return !value.empty() && std::all_of(value.begin(), value.end(), [](unsigned char c) {
    return c > 0x20 && c < 0x7f && c != '"' && c != '=' && c != '\\';
  });
}

void AppendTextValue(std::string_view value, std::string* out) {
  value = value.substr(0, kMaxFieldBytes);
  if (PlainToken(value)) {
    out->append(value);
    return;
  }
  *out += '"';
  for (unsigned char c : value) {
    if (c == '"' || c == '\\') {
      *out += '\\';
      *out += char(c);
    } else if (c >= 0x20 && c < 0x7f) {
      *out += char(c);
    } else {
      *out += fmt::format("\\x{:02x}", c);
    }
  }
  *out += '"';
}

bool LowerHex(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool AllZeros(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c == '0'; });
}

}  // namespace

bool ParseFormat(std::string_view name, Format* format) {
  if (name == "text") return *format = Format::kText, true;
  if (name == "json") return *format = Format::kJson, true;
  return false;
}

void Install(Format format) {
  json_lines = format == Format::kJson;
  if (format == Format::kJson) {
    spdlog::default_logger()->set_formatter(MakeJsonFormatter());
  }
}

std::unique_ptr<spdlog::formatter> MakeJsonFormatter() { return std::make_unique<JsonFormatter>(); }

void Log(spdlog::level::level_enum level, std::string_view message,
         std::initializer_list<Field> fields) {
  spdlog::logger* logger = spdlog::default_logger_raw();
  if (logger == nullptr || !logger->should_log(level)) return;
  if (json_lines) {
    const std::string members = EncodeMembers(message, fields);
    const spdlog::details::log_msg msg(kEncodedMembers, level,
                                       spdlog::string_view_t(members.data(), members.size()));
    try {
      for (const spdlog::sink_ptr& sink : logger->sinks()) {
        if (sink->should_log(level)) sink->log(msg);
      }
      if (level >= logger->flush_level()) logger->flush();
    } catch (
        const std::exception& e) {  // as spdlog's own logger does: a log line never fails a call
      std::fprintf(stderr, "logging: %s\n", e.what());
    }
    return;
  }
  std::string line(message);
  for (const Field& f : fields) {
    if (!f.in_text || f.value.empty()) continue;
    line += ' ';
    line += f.key;
    line += '=';
    AppendTextValue(f.value, &line);
  }
  logger->log(level, spdlog::string_view_t(line.data(), line.size()));
}

std::string_view ValidTraceparent(std::string_view value) {
  // version "-" trace-id "-" parent-id "-" flags
  if (value.size() != 55 || value[2] != '-' || value[35] != '-' || value[52] != '-') return {};
  const std::string_view version = value.substr(0, 2), trace_id = value.substr(3, 32),
                         parent_id = value.substr(36, 16), flags = value.substr(53, 2);
  if (version != "00" || !LowerHex(trace_id) || !LowerHex(parent_id) || !LowerHex(flags)) return {};
  if (AllZeros(trace_id) || AllZeros(parent_id)) return {};
  return value;
}

}  // namespace hgemm::logging
