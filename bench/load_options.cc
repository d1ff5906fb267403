#include "bench/load_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <sstream>

namespace hgemm::bench {

std::string ParseShapes(const std::string& text, std::vector<Shape>* shapes) {
  shapes->clear();
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    Shape s;
    const size_t colon = item.find(':');
    if (std::string e = ParseGemmDims(std::string_view(item).substr(0, colon), &s); !e.empty()) {
      return fmt::format("shape '{}': {} (and an optional :WEIGHT)", item, e);
    }
    if (colon != std::string::npos) {
      const std::string weight = item.substr(colon + 1);
      const bool digits =
          !weight.empty() && weight.size() <= 9 &&
          std::all_of(weight.begin(), weight.end(), [](char c) { return c >= '0' && c <= '9'; });
      s.weight = digits ? std::stoi(weight) : 0;  // at most 9 digits: stoi cannot throw
      if (s.weight < 1) return fmt::format("shape '{}': weight must be a whole number ≥ 1", item);
    }
    shapes->push_back(s);
  }
  return shapes->empty() ? "no shapes" : "";
}

std::string ParseIntList(const std::string& text, std::vector<int>* values) {
  values->clear();
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!std::regex_match(item, std::regex(R"(\d+)")) || std::stoll(item) < 1 ||
        std::stoll(item) > 100000) {
      return fmt::format("'{}': expected a whole number in [1, 100000]", item);
    }
    values->push_back(std::stoi(item));
  }
  return values->empty() ? "empty list" : "";
}

std::string ParseDoubleList(const std::string& text, std::vector<double>* values) {
  values->clear();
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v > 0)) {
      return fmt::format("'{}': expected a positive number", item);
    }
    values->push_back(v);
  }
  return values->empty() ? "empty list" : "";
}

const char* ModeName(Mode mode) { return mode == Mode::kUnary ? "unary" : "stream"; }
const char* TargetName(Target target) { return target == Target::kService ? "service" : "echo"; }

const char* TransportName(Transport transport) {
  return transport == Transport::kShm ? "shm" : transport == Transport::kRing ? "ring" : "grpc";
}

const char* ResidentName(Resident resident) {
  switch (resident) {
    case Resident::kB:
      return "b";
    case Resident::kAll:
      return "all";
    default:
      return "none";
  }
}

bool ParseResident(const std::string& text, Resident* resident) {
  if (text == "none")
    *resident = Resident::kNone;
  else if (text == "b")
    *resident = Resident::kB;
  else if (text == "all")
    *resident = Resident::kAll;
  else
    return false;
  return true;
}

int64_t SentBytes(const Shape& shape, Resident resident) {
  switch (resident) {
    case Resident::kB:
      return shape.ABytes();
    case Resident::kAll:
      return 0;
    default:
      return shape.RequestBytes();
  }
}

int64_t ReceivedBytes(const Shape& shape, Resident resident) {
  return resident == Resident::kAll ? 0 : shape.ReplyBytes();
}

}  // namespace hgemm::bench
