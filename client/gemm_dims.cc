#include "client/gemm_dims.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace hgemm {
namespace {

// Parses one decimal dimension without std::stoul (which throws) and without wrapping.
std::string ParseDim(std::string_view text, const char* name, uint32_t* value) {
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return fmt::format("{} = '{}' is not a whole number", name, text.substr(0, 32));
  }
  uint64_t v = 0;
  for (char c : text) {
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, uint64_t(c - '0'), &v)) {
      return fmt::format("{} = {} is over {}, the largest uint32", name, text.substr(0, 32),
                         UINT32_MAX);
    }
  }
  if (v == 0) return fmt::format("{} must be at least 1", name);
  if (v > UINT32_MAX) {
    return fmt::format("{} = {} is over {}, the largest uint32", name, v, UINT32_MAX);
  }
  *value = static_cast<uint32_t>(v);
  return "";
}

}  // namespace

std::string GemmDims::Name() const { return fmt::format("{}x{}x{}", m, n, k); }

std::string ParseGemmDims(std::string_view text, GemmDims* dims) {
  std::vector<std::string_view> parts;
  for (size_t begin = 0;;) {
    const size_t x = text.find('x', begin);
    parts.push_back(text.substr(begin, x == std::string_view::npos ? x : x - begin));
    if (x == std::string_view::npos) break;
    begin = x + 1;
  }
  if (parts.size() != 3) {
    return "expected MxNxK, e.g. 512x256x1024";
  }
  GemmDims d;
  for (auto [part, name, value] : {std::tuple{parts[0], "m", &d.m}, std::tuple{parts[1], "n", &d.n},
                                   std::tuple{parts[2], "k", &d.k}}) {
    if (std::string e = ParseDim(part, name, value); !e.empty()) return e;
  }
  *dims = d;
  return "";
}

}  // namespace hgemm
