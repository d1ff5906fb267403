#include "client/cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace hgemm::cli {
namespace {

std::string Elements(const char* name, uint64_t rows, uint64_t cols, uint64_t limit) {
  const uint64_t elements = rows * cols;  // two uint32 values: cannot wrap
  if (limit == 0 || elements <= limit) return "";
  return fmt::format(
      "{} is {}x{} = {} elements; the server takes at most {} "
      "(max_elements_per_matrix)",
      name, rows, cols, elements, limit);
}

std::string Bytes(std::optional<uint64_t> bytes) {
  return bytes ? fmt::format("{}", *bytes) : std::string("more than 2^64");
}

}  // namespace

std::string CheckMatrixDims(const std::string& what, int64_t rows, int64_t cols) {
  for (auto [value, name] : {std::pair{rows, "rows"}, std::pair{cols, "cols"}}) {
    if (value < 1 || uint64_t(value) > UINT32_MAX) {
      return fmt::format("{} has {} {}; a GEMM dimension must be in [1, {}]", what, value, name,
                         UINT32_MAX);
    }
  }
  return "";
}

std::optional<uint64_t> MatrixBytes(uint64_t rows, uint64_t cols) {
  uint64_t elements = 0, bytes = 0;
  if (__builtin_mul_overflow(rows, cols, &elements) ||
      __builtin_mul_overflow(elements, 2, &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

std::optional<uint64_t> CheckedAdd(std::optional<uint64_t> a, std::optional<uint64_t> b) {
  uint64_t sum = 0;
  if (!a || !b || __builtin_add_overflow(*a, *b, &sum)) return std::nullopt;
  return sum;
}

std::string CheckLimits(const GemmDims& d, const v1::Limits& limits, const Plan& plan) {
  const uint64_t max_elements = limits.max_elements_per_matrix();
  for (std::string e : {Elements("A (m x k)", d.m, d.k, max_elements),
                        Elements("B (k x n)", d.k, d.n, max_elements),
                        Elements("C (m x n)", d.m, d.n, max_elements)}) {
    if (!e.empty()) return e;
  }
  const std::optional<uint64_t> a = MatrixBytes(d.m, d.k), b = MatrixBytes(d.k, d.n),
                                c = MatrixBytes(d.m, d.n);
  const std::optional<uint64_t> gemm = CheckedAdd(CheckedAdd(a, b), c);
  if (limits.max_queued_bytes() != 0 && (!gemm || *gemm > limits.max_queued_bytes())) {
    return fmt::format(
        "A + B + C of {}x{}x{} take {} bytes; the server takes at most {} per GEMM "
        "(max_queued_bytes)",
        d.m, d.n, d.k, Bytes(gemm), limits.max_queued_bytes());
  }
  if (plan.unary && limits.max_message_bytes() != 0) {
    const std::optional<uint64_t> sent = CheckedAdd(
        CheckedAdd(plan.resident_a ? 0 : a, plan.resident_b ? 0 : b), kUnaryOverheadBytes);
    if (!sent || *sent > limits.max_message_bytes()) {
      return fmt::format(
          "a unary request with A ({} bytes) and B ({} bytes) is over the server's "
          "largest message, {} bytes (max_message_bytes); use --mode=stream",
          plan.resident_a ? "0" : Bytes(a), plan.resident_b ? "0" : Bytes(b),
          limits.max_message_bytes());
    }
  }
  const uint64_t quota = limits.resident_quota_bytes();
  if (quota != 0 && (plan.resident_a || plan.resident_b || plan.keep_c)) {
    for (auto [on, name, bytes] :
         {std::tuple{plan.resident_a, "A (m x k)", a}, std::tuple{plan.resident_b, "B (k x n)", b},
          std::tuple{plan.keep_c, "C (m x n)", c}}) {
      if (on && (!bytes || *bytes > quota)) {
        return fmt::format(
            "resident {} takes {} bytes; the server's quota per client is {} "
            "(resident_quota_bytes)",
            name, Bytes(bytes), quota);
      }
    }
    // Uploaded A and B, the kept C of this run and, when repeated, that of the previous run.
    const std::optional<uint64_t> kept_c = !plan.keep_c    ? std::optional<uint64_t>(0)
                                           : plan.repeated ? CheckedAdd(c, c)
                                                           : c;
    const std::optional<uint64_t> held =
        CheckedAdd(CheckedAdd(plan.resident_a ? a : 0, plan.resident_b ? b : 0), kept_c);
    if (!held || *held > quota) {
      return fmt::format(
          "resident operands of {}x{}x{} take {} bytes at once; the server's quota "
          "per client is {} (resident_quota_bytes)",
          d.m, d.n, d.k, Bytes(held), quota);
    }
  }
  return "";
}

std::string ParseGroup(const std::string& text, std::vector<GemmDims>* group) {
  std::vector<GemmDims> parsed;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    GemmDims dims;
    if (std::string e = ParseGemmDims(item, &dims); !e.empty()) {
      return fmt::format("--group: problem {} ('{}'): {}", parsed.size(), item.substr(0, 64), e);
    }
    parsed.push_back(dims);
  }
  if (parsed.empty() || text.back() == ',') {
    return "--group: give one MxNxK per problem, comma-separated (no empty problem)";
  }
  *group = std::move(parsed);
  return "";
}

std::string CheckGroupLimits(const std::vector<GemmDims>& group, bool c_fp32, bool c_input,
                             const v1::Limits& limits) {
  if (limits.max_group_problems() == 0) {
    return "the server takes no grouped GEMMs (a server from before them: "
           "limits.max_group_problems is 0)";
  }
  if (group.size() > limits.max_group_problems()) {
    return fmt::format("a group of {} problems; the server takes at most {} (max_group_problems)",
                       group.size(), limits.max_group_problems());
  }
  std::optional<uint64_t> a = 0, b = 0, c = 0;  // fp16/bf16 bytes (2 per element) of each
  for (const GemmDims& d : group) {
    a = CheckedAdd(a, MatrixBytes(d.m, d.k));
    b = CheckedAdd(b, MatrixBytes(d.k, d.n));
    c = CheckedAdd(c, MatrixBytes(d.m, d.n));
  }
  const uint64_t max_elements = limits.max_elements_per_matrix();
  for (auto [name, bytes] : {std::pair{"A", a}, std::pair{"B", b}, std::pair{"C", c}}) {
    if (max_elements != 0 && (!bytes || *bytes / 2 > max_elements)) {
      return fmt::format(
          "the group's {} matrices have {} elements together; the server takes at "
          "most {} (max_elements_per_matrix)",
          name, bytes ? fmt::format("{}", *bytes / 2) : "more than 2^63", max_elements);
    }
  }
  const std::optional<uint64_t> c_bytes = c_fp32 ? CheckedAdd(c, c) : c;
  const std::optional<uint64_t> sent = CheckedAdd(CheckedAdd(a, b), c_input ? c_bytes : 0);
  const std::optional<uint64_t> gemm = CheckedAdd(sent, c_bytes);
  if (limits.max_queued_bytes() != 0 && (!gemm || *gemm > limits.max_queued_bytes())) {
    return fmt::format(
        "the group's operands and results take {} bytes; the server takes at most "
        "{} per GEMM (max_queued_bytes)",
        Bytes(gemm), limits.max_queued_bytes());
  }
  const std::optional<uint64_t> message = CheckedAdd(sent, kUnaryOverheadBytes);
  if (limits.max_message_bytes() != 0 && (!message || *message > limits.max_message_bytes())) {
    return fmt::format(
        "the group's operands take {} bytes in one unary request; the server's "
        "largest message is {} bytes (max_message_bytes)",
        Bytes(sent), limits.max_message_bytes());
  }
  return "";
}

std::string ParseHandleList(const std::string& text, std::vector<std::string>* handles) {
  handles->clear();
  std::set<std::string> seen;
  std::stringstream in(text);
  for (std::string handle; std::getline(in, handle, ',');) {
    if (handle.empty()) return "--release: empty handle in the list";
    if (!seen.insert(handle).second) {
      return fmt::format("--release: handle '{}' given twice", handle.substr(0, 40));
    }
    handles->push_back(handle);
  }
  if (handles->empty()) return "--release: no handle given";
  return "";
}

std::string FormatMatrixList(const v1::ListMatricesResponse& list) {
  // An administrator's list names each matrix's owner: first column then.
  const bool owners = std::any_of(list.matrices().begin(), list.matrices().end(),
                                  [](const v1::MatrixInfo& m) { return !m.owner().empty(); });
  auto owner = [owners](const std::string& name) {
    return owners ? fmt::format("{:<16} ", name) : std::string();
  };
  std::string out =
      owner("owner") + fmt::format("{:<34} {:>13} {:>12} {:>6} {:>9} {:>9} {:>10}  {}\n", "handle",
                                   "shape", "bytes", "device", "age_s", "idle_s", "expires_s",
                                   "label");
  for (const v1::MatrixInfo& m : list.matrices()) {
    // TTL counts from the last use: the matrix goes when idle reaches ttl.
    const std::string expires =
        m.ttl_seconds() > 0
            ? fmt::format("{:.1f}", std::max(0.0, m.ttl_seconds() - m.idle_seconds()))
            : std::string("never");
    out += owner(m.owner()) +
           fmt::format("{:<34} {:>13} {:>12} {:>6} {:>9.1f} {:>9.1f} {:>10}  {}\n", m.handle(),
                       fmt::format("{}x{}", m.rows(), m.cols()), m.bytes(), m.device_id(),
                       m.age_seconds(), m.idle_seconds(), expires, m.label());
  }
  out += fmt::format("{} matrices, {} bytes of this client's quota of {}\n", list.matrices_size(),
                     list.client_bytes(), list.quota_bytes());
  return out;
}

WireBytes RequestWireBytes(const v1::GemmRequest& request, uint64_t c_element_bytes) {
  WireBytes bytes;
  bytes.up = request.a().size() + request.b().size() + request.c_in().size();
  if (!request.keep_c_resident() && !request.has_c_region()) {
    bytes.down =
        c_element_bytes * request.m() * request.n() * std::max<uint32_t>(request.batch(), 1);
  }
  return bytes;
}

}  // namespace hgemm::cli
