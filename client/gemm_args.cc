#include "client/gemm_args.h"

#include <fmt/format.h>

#include <algorithm>

namespace hgemm {

grpc::Status GemmArgs::Check(uint32_t m, uint32_t n, uint32_t k, const OperandBytes& operands,
                             size_t c_capacity, Regions regions) const {
  auto bad = [](const std::string& message) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
  };
  const bool a_in_region = !a_region.region().empty();
  const bool b_in_region = !b_region.region().empty();
  const bool c_in_in_region = !c_in_region.region().empty();
  const bool c_in_a_region = !c_region.region().empty();
  if (regions == Regions::kRefused &&
      (a_in_region || b_in_region || c_in_in_region || c_in_a_region)) {
    return bad("regions: only hgemm_gemm() takes operands or C in shared memory");
  }
  if ((a_in_region && !a_handle.empty()) || (b_in_region && !b_handle.empty())) {
    return bad(a_in_region && !a_handle.empty()
                   ? "a: given both by handle and in a region; pass one"
                   : "b: given both by handle and in a region; pass one");
  }
  if (c_in_in_region && (c_in != nullptr || !c_in_handle.empty())) {
    return bad("c_in: given in a region and as bytes or by handle; pass one");
  }
  if (c_in_a_region && c_capacity != 0) {
    return bad("c: pass NULL and 0 bytes for a C written into a region (c_region)");
  }
  if (dtype != v1::DATA_TYPE_UNSPECIFIED && dtype != v1::DATA_TYPE_FP16 &&
      dtype != v1::DATA_TYPE_BF16) {
    return bad(fmt::format("dtype {} is not HGEMM_DTYPE_DEFAULT, _FP16 or _BF16 (A and B)",
                           static_cast<int>(dtype)));
  }
  if (c_dtype < v1::DATA_TYPE_UNSPECIFIED || c_dtype > v1::DATA_TYPE_FP32) {
    return bad(fmt::format("c_dtype {} is not one of HGEMM_DTYPE_*", static_cast<int>(c_dtype)));
  }
  // An operand by handle or in a region is not passed.
  const bool a_by_handle = !a_handle.empty() || a_in_region;
  const bool b_by_handle = !b_handle.empty() || b_in_region;
  const char* type = dtype == v1::DATA_TYPE_BF16 ? "bf16" : "fp16";
  const char* c_type = c_dtype == v1::DATA_TYPE_FP32 ? "fp32" : type;
  const unsigned c_size = c_dtype == v1::DATA_TYPE_FP32 ? 4 : 2;
  // uint32 dimensions: batch·2·m·k < 2^98 only fits unsigned __int128; 2^64 bytes are never
  // passed.
  const unsigned __int128 gemms = std::max<uint32_t>(batch, 1);
  const unsigned __int128 a_want = gemms * 2 * m * k;
  const unsigned __int128 b_want = gemms * 2 * k * n;
  const unsigned __int128 c_want = gemms * c_size * m * n;
  const auto& [a, a_bytes, b, b_bytes] = operands;
  if (a_by_handle ? a != nullptr || a_bytes != 0 : a_bytes != a_want || (a == nullptr && a_bytes)) {
    return bad(a_by_handle ? "a: pass NULL and 0 bytes for an A given by handle or region"
                           : fmt::format("a_bytes is {}; an {}x{} {} A is {} bytes", a_bytes, m, k,
                                         type, static_cast<uint64_t>(a_want)));
  }
  if (b_by_handle ? b != nullptr || b_bytes != 0 : b_bytes != b_want || (b == nullptr && b_bytes)) {
    return bad(b_by_handle ? "b: pass NULL and 0 bytes for a B given by handle or region"
                           : fmt::format("b_bytes is {}; a {}x{} {} B is {} bytes", b_bytes, k, n,
                                         type, static_cast<uint64_t>(b_want)));
  }
  if (c_in != nullptr || c_in_bytes != 0) {
    if (!c_in_handle.empty()) {
      return bad("c_in: given both as bytes and by handle (c_in_handle); pass one");
    }
    if (c_in == nullptr || c_in_bytes != c_want) {
      return bad(fmt::format("c_in_bytes is {}; a C_in of {} {}x{} {} is {} bytes", c_in_bytes,
                             static_cast<uint64_t>(gemms), m, n, c_type,
                             static_cast<uint64_t>(c_want)));
    }
  }
  if (!c_in_a_region && c_capacity < c_want) {
    return bad(fmt::format("c_capacity is {} bytes; an {}x{} {} C needs {} (nothing was sent)",
                           c_capacity, m, n, c_type, static_cast<uint64_t>(c_want)));
  }
  return grpc::Status::OK;
}

const grpc::Status GemmArgs::kNotAGroupForm(
    grpc::StatusCode::INVALID_ARGUMENT,
    "options: a grouped GEMM takes no handles, regions, C_in (pass each problem's), batch or "
    "stream mode");

grpc::Status GemmArgs::CheckGroupForm() const {
  const bool names_operands = !a_handle.empty() || !b_handle.empty() || !c_in_handle.empty() ||
                              !a_region.region().empty() || !b_region.region().empty() ||
                              !c_in_region.region().empty() || !c_region.region().empty();
  return names_operands || c_in != nullptr || batch > 1 ? kNotAGroupForm : grpc::Status::OK;
}

grpc::Status GemmArgs::CheckRingEntry(uint32_t m, uint32_t n, uint32_t k, bool keep_c) const {
  auto bad = [](const std::string& message) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
  };
  if (keep_c != c_region.region().empty()) {
    return bad(keep_c ? "c: a kept C goes to no region (hgemm_gemm_options_set_c_region)"
                      : "c: a ring GEMM writes C into a region (hgemm_gemm_options_set_c_region)");
  }
  if (c_in != nullptr || c_in_bytes != 0) {
    return bad("c_in: a ring entry carries no bytes: name C_in by region or handle");
  }
  const bool a_named = !a_region.region().empty() || !a_handle.empty();
  const bool b_named = !b_region.region().empty() || !b_handle.empty();
  if (!a_named || !b_named) {
    return bad(std::string(a_named ? "b" : "a") +
               ": a ring entry carries no bytes: name it by region or handle");
  }
  // A kept C needs no room here; one in a region none either.
  return Check(m, n, k, {}, keep_c ? kCKept : 0, Regions::kTaken);
}

void GemmArgs::Request(uint32_t m, uint32_t n, uint32_t k, const OperandBytes& operands,
                       v1::GemmRequest* request, OperandBytes* detached) const {
  request->set_m(m);
  request->set_n(n);
  request->set_k(k);
  v1::GemmOptions* options = request->mutable_options();
  options->set_kernel(kernel);
  options->set_accumulation(accumulation);
  options->set_request_id(request_id);
  options->set_verify(verify);
  options->set_verify_repetitions(verify_repetitions);
  const auto& [a, a_bytes, b, b_bytes] = operands;
  if (!a_region.region().empty()) {
    *request->mutable_a_region() = a_region;
  } else if (a_handle.empty() && detached != nullptr) {
    detached->a = a != nullptr ? a : "";
    detached->a_bytes = a_bytes;
  } else if (a_handle.empty()) {
    request->set_a(a, a_bytes);
  } else {
    request->set_a_handle(a_handle);
  }
  if (!b_region.region().empty()) {
    *request->mutable_b_region() = b_region;
  } else if (b_handle.empty() && detached != nullptr) {
    detached->b = b != nullptr ? b : "";
    detached->b_bytes = b_bytes;
  } else if (b_handle.empty()) {
    request->set_b(b, b_bytes);
  } else {
    request->set_b_handle(b_handle);
  }
  if (!c_region.region().empty()) *request->mutable_c_region() = c_region;
  request->set_transpose_a(transpose_a);
  request->set_transpose_b(transpose_b);
  request->set_dtype(dtype);
  request->set_c_dtype(c_dtype);
  if (alpha) request->set_alpha(*alpha);
  request->set_beta(beta);
  if (beta != 0 && c_in != nullptr) {
    request->set_c_in(c_in, c_in_bytes);
  } else if (beta != 0 && !c_in_handle.empty()) {
    request->set_c_in_handle(c_in_handle);
  } else if (beta != 0 && !c_in_region.region().empty()) {
    *request->mutable_c_in_region() = c_in_region;
  }
  request->set_batch(batch);
}

}  // namespace hgemm
