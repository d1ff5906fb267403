// The server's log lines: text (spdlog's pattern) or JSON (one object per line, for log
// shippers), structured fields on the lines that describe a call, and the W3C trace context a
// client may send with one.
//
// A JSON line is {"time": "2026-01-02T03:04:05.123456Z", "level": "info", "message": "...",
// <fields>...}, every value a string; bytes that are not UTF-8 become U+FFFD, so every line
// parses whatever a client put into a field. In text, fields follow the message as key=value.
//
// Thread safety: Install() once at start, before other threads log; Log() and
// ValidTraceparent() from any thread.
#ifndef HGEMM_SERVER_CORE_LOGGING_H_
#define HGEMM_SERVER_CORE_LOGGING_H_

#include <spdlog/formatter.h>
#include <spdlog/spdlog.h>

#include <initializer_list>
#include <memory>
#include <string_view>

namespace hgemm::logging {

enum class Format { kText, kJson };

// "text" or "json". Returns false for anything else.
bool ParseFormat(std::string_view name, Format* format);

// Formats every line of spdlog's default logger as `format`. The server binary also routes
// gRPC's own messages through that logger (server/grpc_logging.h).
void Install(Format format);

// The formatter Install(kJson) gives the default logger; for a sink added later (tests).
std::unique_ptr<spdlog::formatter> MakeJsonFormatter();

// One structured field of a log line. `value` may hold any bytes (a client's request id):
// text escapes them, JSON encodes them, and both cut it at kMaxFieldBytes.
struct Field {
  std::string_view key;
  std::string_view value;
  // False: text lines leave the field out because their message already says it.
  bool in_text = true;
};
inline constexpr size_t kMaxFieldBytes = 1024;

// Logs `message` at `level` through the default logger with `fields`. JSON lines carry every
// field, empty ones too (a fixed schema per kind of line); text lines end in key=value for
// the non-empty ones, the value in double quotes with \" \\ \xHH escapes when it is not a
// plain token.
// In JSON the line goes to the default logger's sinks directly (as that logger would send it),
// with the fields encoded in its message.
void Log(spdlog::level::level_enum level, std::string_view message,
         std::initializer_list<Field> fields);

// `value` if it is a well-formed W3C traceparent of version 00 (55 characters
// "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", lowercase hex, neither id all
// zeros), else "": a malformed header from a client is ignored, never logged.
std::string_view ValidTraceparent(std::string_view value);

}  // namespace hgemm::logging

#endif  // HGEMM_SERVER_CORE_LOGGING_H_
