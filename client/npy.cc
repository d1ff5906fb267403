#include "client/npy.h"

#include <fmt/format.h>

#include <fstream>
#include <regex>

namespace hgemm {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

// Reads the header of `in` (opened on `path`): rows and cols into *matrix, the stream left at
// the first data byte.
std::string ReadHeader(const std::string& path, std::ifstream& in, HalfMatrix* matrix) {
  if (!in) return fmt::format("{}: cannot open", path);
  char preamble[8];
  if (!in.read(preamble, 8) || std::string(preamble, 6) != std::string(kMagic, 6)) {
    return fmt::format("{}: not a .npy file", path);
  }
  uint32_t header_len = 0;
  unsigned char len_bytes[4] = {0, 0, 0, 0};
  const int len_size = preamble[6] == 1 ? 2 : 4;  // version 1.0: uint16, later: uint32
  if (!in.read(reinterpret_cast<char*>(len_bytes), len_size))
    return fmt::format("{}: truncated", path);
  for (int i = len_size - 1; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) return fmt::format("{}: truncated header", path);

  std::smatch match;
  if (!std::regex_search(header, std::regex(R"('descr':\s*'[<|]f2')"))) {
    return fmt::format("{}: dtype must be float16 ('<f2'), header is {}", path, header);
  }
  if (std::regex_search(header, std::regex(R"('fortran_order':\s*True)"))) {
    return fmt::format("{}: Fortran order is not supported; save a C-contiguous array", path);
  }
  if (!std::regex_search(header, match, std::regex(R"('shape':\s*\((\d+),\s*(\d+),?\s*\))"))) {
    return fmt::format("{}: shape must be 2-D, header is {}", path, header);
  }
  const std::string rows = match[1], cols = match[2];
  if (rows.size() > 18 || cols.size() > 18) {  // std::stoll would throw
    return fmt::format("{}: shape ({}, {}) is too large", path, rows.substr(0, 24),
                       cols.substr(0, 24));
  }
  matrix->rows = std::stoll(rows);
  matrix->cols = std::stoll(cols);
  return "";
}

}  // namespace

std::string ReadNpyShape(const std::string& path, HalfMatrix* matrix) {
  std::ifstream in(path, std::ios::binary);
  matrix->data.clear();
  return ReadHeader(path, in, matrix);
}

std::string ReadNpy(const std::string& path, HalfMatrix* matrix) {
  std::ifstream in(path, std::ios::binary);
  if (std::string e = ReadHeader(path, in, matrix); !e.empty()) return e;
  int64_t elements = 0, bytes = 0;
  if (__builtin_mul_overflow(matrix->rows, matrix->cols, &elements) ||
      __builtin_mul_overflow(elements, int64_t{2}, &bytes)) {
    return fmt::format("{}: shape ({}, {}) is too large", path, matrix->rows, matrix->cols);
  }
  const std::streampos data_start = in.tellg();
  in.seekg(0, std::ios::end);
  const int64_t available = int64_t(in.tellg() - data_start);
  in.seekg(data_start);
  if (available < bytes) {
    return fmt::format("{}: holds fewer than {}x{} values ({} data bytes, {} needed)", path,
                       matrix->rows, matrix->cols, available, bytes);
  }
  matrix->data.resize(bytes);
  if (!in.read(matrix->data.data(), matrix->data.size())) {
    return fmt::format("{}: holds fewer than {}x{} values", path, matrix->rows, matrix->cols);
  }
  return "";
}

std::string WriteNpy(const std::string& path, const HalfMatrix& matrix) {
  std::string header = fmt::format(
      "{{'descr': '<f2', 'fortran_order': False, 'shape': ({}, {}), }}", matrix.rows, matrix.cols);
  // Magic, version, length and header together are a multiple of 64 bytes, ending in '\n'.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return fmt::format("{}: cannot create", path);
  out.write(kMagic, 6);
  out.put(1);
  out.put(0);
  out.put(static_cast<char>(header.size() & 0xFF));
  out.put(static_cast<char>(header.size() >> 8));
  out << header;
  out.write(matrix.data.data(), matrix.data.size());
  if (!out) return fmt::format("{}: write failed", path);
  return "";
}

}  // namespace hgemm
