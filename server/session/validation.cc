#include "server/session/validation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <tuple>
#include <utility>

#include "server/core/status.h"
#include "server/verify/freivalds.h"

namespace hgemm {
namespace {

absl::Status CheckElements(const char* matrix, uint32_t rows, uint32_t cols,
                           const RequestRules& rules) {
  const uint64_t elements = MatrixElements(rows, cols);
  if (elements > uint64_t(MaxElementsPerMatrix(rules))) {
    return status::OverLimit(fmt::format("{} has {}x{} = {} elements; this server takes at most {}",
                                         matrix, rows, cols, elements,
                                         MaxElementsPerMatrix(rules)));
  }
  return absl::OkStatus();
}

// A scale factor as a float always: shortest round-trip digits, with ".0" added to an integral
// value (fmt prints -1608507300.0f as "-1608507300", which reads like a wrapped integer size).
std::string ScaleText(float scale) {
  std::string text = fmt::format("{}", scale);
  if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
  return text;
}

constexpr char kNoRegion[] = "empty (the handle RegisterRegion returned)";

// A handle that is set must name something: an empty one would leave its operand without
// bytes (the resolver has nothing to look up, the length check was skipped for it).
absl::Status ValidateHandles(const v1::GemmRequest& request) {
  if (request.has_a_handle() && request.a_handle().empty()) {
    return status::InvalidArgument("a_handle", "empty (set a, or the handle of a resident matrix)");
  }
  if (request.has_b_handle() && request.b_handle().empty()) {
    return status::InvalidArgument("b_handle", "empty (set b, or the handle of a resident matrix)");
  }
  // Regions: named, and C goes to one place. Offsets and sizes are checked against the
  // region when it is looked up (RegionStore::Acquire).
  if (request.has_a_region() && request.a_region().region().empty()) {
    return status::InvalidArgument("a_region.region", kNoRegion);
  }
  if (request.has_b_region() && request.b_region().region().empty()) {
    return status::InvalidArgument("b_region.region", kNoRegion);
  }
  if (request.has_c_region() && request.c_region().region().empty()) {
    return status::InvalidArgument("c_region.region", kNoRegion);
  }
  if (request.has_c_in_handle() && request.c_in_handle().empty()) {
    return status::InvalidArgument(
        "c_in_handle", "empty (set c_in, or the handle of a resident matrix)");
  }
  if (request.has_c_in_region() && request.c_in_region().region().empty()) {
    return status::InvalidArgument("c_in_region.region", kNoRegion);
  }
  if (request.has_c_region() && request.keep_c_resident()) {
    return status::InvalidArgument("c_region",
                                   "C goes either to a region or stays resident, not both");
  }
  return absl::OkStatus();
}

}  // namespace

bool AutoSupports(const RequestRules& rules, Accumulation accumulation, unsigned layout_bit,
                  unsigned types_bit, bool scaled) {
  return std::any_of(rules.kernels.begin(), rules.kernels.end(), [&](const KernelDescription& k) {
    return (accumulation == Accumulation::kFp16 ? k.fp16_accumulation : k.fp32_accumulation) &&
           (k.layouts & layout_bit) != 0 && (k.types & types_bit) != 0 &&
           (!scaled || (k.scaled_types & types_bit) != 0);
  });
}

unsigned AutoLayouts(const RequestRules& rules) {
  unsigned bits = 0;
  for (const KernelDescription& k : rules.kernels) bits |= k.layouts;
  return bits;
}

unsigned AutoTypes(const RequestRules& rules) {
  unsigned bits = 0;
  for (const KernelDescription& k : rules.kernels) bits |= k.types;
  return bits;
}

unsigned AutoScaledTypes(const RequestRules& rules) {
  unsigned bits = 0;
  for (const KernelDescription& k : rules.kernels) bits |= k.scaled_types;
  return bits;
}

namespace {

std::string BitNames(unsigned bits, const char* const names[4]) {
  std::string out;
  for (int i = 0; i < 4; ++i) {
    if ((bits & (1u << i)) == 0) continue;
    if (!out.empty()) out += ", ";
    out += names[i];
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string LayoutNames(unsigned layouts) {
  return BitNames(layouts, kLayoutNames);
}

std::string TypesNames(unsigned types) {
  static const char* const kNames[4] = {"fp16", "fp16->fp32", "bf16", "bf16->fp32"};
  return BitNames(types, kNames);
}

bool FromProto(v1::DataType type, ElementType unspecified, ElementType* out) {
  switch (type) {
    case v1::DATA_TYPE_UNSPECIFIED:
      *out = unspecified;
      return true;
    case v1::DATA_TYPE_FP16:
      *out = ElementType::kFp16;
      return true;
    case v1::DATA_TYPE_BF16:
      *out = ElementType::kBf16;
      return true;
    case v1::DATA_TYPE_FP32:
      *out = ElementType::kFp32;
      return true;
    default:
      return false;
  }
}

int64_t MaxElementsPerMatrix(const RequestRules& rules) {
  return std::clamp<int64_t>(rules.max_elements_per_matrix, 1, kMaxElementsPerMatrix);
}

absl::Status ValidateShape(uint32_t m, uint32_t n, uint32_t k, const RequestRules& rules,
                           GemmShape* shape) {
  if (m == 0) return status::InvalidArgument("m", "must be at least 1");
  if (n == 0) return status::InvalidArgument("n", "must be at least 1");
  if (k == 0) return status::InvalidArgument("k", "must be at least 1");
  for (absl::Status s : {CheckElements("A (m x k)", m, k, rules),
                         CheckElements("B (k x n)", k, n, rules),
                         CheckElements("C (m x n)", m, n, rules)}) {
    if (!s.ok()) return s;
  }
  shape->m = m;  // only now are its sizes safe to compute
  shape->n = n;
  shape->k = k;
  return absl::OkStatus();
}

absl::Status ValidateOptions(const v1::GemmOptions& options, const RequestRules& rules,
                             const std::string& field, GemmJob* job) {
  if (options.request_id().size() > kMaxRequestIdBytes) {
    return status::InvalidArgument(field + ".request_id",
                                   fmt::format("{} bytes; at most {}", options.request_id().size(),
                                               kMaxRequestIdBytes));
  }
  job->request_id = options.request_id();
  if (options.verify_repetitions() > uint32_t(verify::kMaxRepetitions)) {
    return status::InvalidArgument(
        field + ".verify_repetitions",
        fmt::format("{}; at most {}", options.verify_repetitions(), verify::kMaxRepetitions));
  }
  job->verify = options.verify();
  job->verify_repetitions = options.verify() ? int(options.verify_repetitions()) : 0;
  switch (options.accumulation()) {
    case v1::ACCUMULATION_FP16:
      job->accumulation = Accumulation::kFp16;
      break;
    case v1::ACCUMULATION_UNSPECIFIED:
    case v1::ACCUMULATION_FP32:
      job->accumulation = Accumulation::kFp32;
      break;
    default:
      return status::InvalidArgument(field + ".accumulation",
                                     fmt::format("unknown value {}", int(options.accumulation())));
  }
  const std::string& name = options.kernel();
  const bool fp16 = job->accumulation == Accumulation::kFp16;
  if (name.empty() || name == "auto") {
    if (!AutoSupports(rules, job->accumulation)) {
      return status::InvalidArgument(
          field + ".accumulation",
          fmt::format("no kernel of this server has {} accumulation (ListKernels says which do)",
                      fp16 ? "FP16" : "FP32"));
    }
    job->kernel = "auto";
  } else {
    auto it = std::find_if(rules.kernels.begin(), rules.kernels.end(),
                           [&](const KernelDescription& k) { return k.name == name; });
    if (it == rules.kernels.end()) {
      return status::InvalidArgument(
          field + ".kernel", fmt::format("unknown kernel {}; ListKernels names the kernels of "
                                         "this server, or use 'auto'",
                                         status::Quote(name)));
    }
    if (fp16 ? !it->fp16_accumulation : !it->fp32_accumulation) {
      return status::InvalidArgument(
          field + ".accumulation",
          fmt::format("kernel '{}' has no {} accumulation", name, fp16 ? "FP16" : "FP32"));
    }
    job->kernel = name;
  }
  return absl::OkStatus();
}

absl::Status ValidateForm(bool transpose_a, bool transpose_b, v1::DataType dtype,
                          v1::DataType c_dtype, const RequestRules& rules,
                          const std::string& prefix, GemmJob* job) {
  ElementType ab = ElementType::kFp16, c = ElementType::kFp16;
  if (!FromProto(dtype, ElementType::kFp16, &ab) || ab == ElementType::kFp32) {
    return status::InvalidArgument(
        prefix + "dtype",
        fmt::format("enum value {} is not a type of A and B (DATA_TYPE_FP16 or DATA_TYPE_BF16)", int(dtype)));
  }
  if (!FromProto(c_dtype, ab, &c) || (c != ab && c != ElementType::kFp32)) {
    return status::InvalidArgument(
        prefix + "c_dtype",
        fmt::format("enum value {} is not a type of C for {} inputs (UNSPECIFIED, the inputs' type, or "
                    "DATA_TYPE_FP32)",
                    int(c_dtype), ElementTypeName(ab)));
  }
  const std::string options = prefix + "options";
  if (job->accumulation == Accumulation::kFp16 &&
      (ab != ElementType::kFp16 || c != ElementType::kFp16)) {
    return status::InvalidArgument(
        options + ".accumulation",
        fmt::format("FP16 accumulation takes fp16 in and out, not {}", TypesNames(TypesBit(ab, c))));
  }
  const unsigned layout = LayoutBit(transpose_a, transpose_b), types = TypesBit(ab, c);
  // The field to blame for a layout no kernel takes: the transposed operand (A's first).
  const std::string layout_field = prefix + (transpose_a ? "transpose_a" : "transpose_b");
  const std::string types_field = prefix + (ab != ElementType::kFp16 ? "dtype" : "c_dtype");
  if (job->kernel == "auto") {
    if ((AutoLayouts(rules) & layout) == 0) {
      return status::InvalidArgument(
          layout_field, fmt::format("no kernel of this server takes layout {} (it takes {})",
                                    LayoutNames(layout), LayoutNames(AutoLayouts(rules))));
    }
    if (!AutoSupports(rules, job->accumulation, layout, types)) {
      return status::InvalidArgument(
          types_field, fmt::format("no kernel of this server takes {} in layout {} (ListKernels "
                                   "says which do)",
                                   TypesNames(types), LayoutNames(layout)));
    }
  } else {
    auto it = std::find_if(rules.kernels.begin(), rules.kernels.end(),
                           [&](const KernelDescription& k) { return k.name == job->kernel; });
    // ValidateOptions found it.
    if ((it->layouts & layout) == 0) {
      return status::InvalidArgument(
          layout_field, fmt::format("kernel '{}' takes layouts {}, not {}", it->name,
                                    LayoutNames(it->layouts), LayoutNames(layout)));
    }
    if ((it->types & types) == 0) {
      return status::InvalidArgument(
          types_field, fmt::format("kernel '{}' takes types {}, not {}", it->name,
                                   TypesNames(it->types), TypesNames(types)));
    }
  }
  job->transpose_a = transpose_a;
  job->transpose_b = transpose_b;
  job->shape.ab_type = ab;
  job->shape.c_type = c;
  return absl::OkStatus();
}

absl::Status ValidateScale(bool has_alpha, float alpha, float beta, bool has_c_in,
                           const RequestRules& rules, const std::string& prefix, GemmJob* job) {
  if (!has_alpha) alpha = 1;
  if (!std::isfinite(alpha)) {
    return status::InvalidArgument(prefix + "alpha", ScaleText(alpha) + " is not a finite number");
  }
  if (!std::isfinite(beta)) {
    return status::InvalidArgument(prefix + "beta", ScaleText(beta) + " is not a finite number");
  }
  if (beta != 0 && !has_c_in) {
    return status::InvalidArgument(
        prefix + "beta",
        ScaleText(beta) + " needs a C input (c_in, c_in_handle or c_in_region), and none was given");
  }
  job->alpha = alpha;
  job->beta = beta;
  job->shape.c_input = beta != 0;
  if (!job->Scaled()) return absl::OkStatus();
  // The field a refusal names: the scale that makes this more than op(A)·op(B).
  const std::string scale_field = prefix + (beta != 0 ? "beta" : "alpha");
  if (job->accumulation != Accumulation::kFp32) {
    return status::InvalidArgument(
        prefix + "options.accumulation",
        "FP16 accumulation takes no alpha/beta (they need FP32 accumulation)");
  }
  const unsigned types = TypesBit(job->shape.ab_type, job->shape.c_type);
  if (job->kernel == "auto") {
    if (!AutoSupports(rules, job->accumulation, LayoutBit(job->transpose_a, job->transpose_b),
                      types, /*scaled=*/true)) {
      return status::InvalidArgument(
          scale_field, fmt::format("no kernel of this server takes alpha/beta for {} in layout {} "
                                   "(it takes them for {})",
                                   TypesNames(types),
                                   LayoutNames(LayoutBit(job->transpose_a, job->transpose_b)),
                                   TypesNames(AutoScaledTypes(rules))));
    }
    return absl::OkStatus();
  }
  auto it = std::find_if(rules.kernels.begin(), rules.kernels.end(),
                         [&](const KernelDescription& k) { return k.name == job->kernel; });
  if ((it->scaled_types & types) == 0) {  // ValidateOptions found it
    return status::InvalidArgument(
        scale_field, fmt::format("kernel '{}' takes alpha/beta for {}, not {} (use 'auto')",
                                 it->name, TypesNames(it->scaled_types), TypesNames(types)));
  }
  return absl::OkStatus();
}

absl::Status ValidateBatch(uint32_t batch, const std::string& single_matrix_field,
                           const RequestRules& rules, const std::string& prefix, GemmJob* job) {
  GemmShape& shape = job->shape;
  shape.batch = std::max<uint32_t>(batch, 1);
  if (batch <= 1) return absl::OkStatus();
  if (!single_matrix_field.empty()) {
    return status::InvalidArgument(
        prefix + single_matrix_field,
        fmt::format("holds one matrix; a batch of {} takes its operands inline, in a region or "
                    "streamed, and C back (batch 1 for this)",
                    batch));
  }
  // Each operand's buffer is one matrix of batch·rows rows, for the size limits.
  const int64_t limit = MaxElementsPerMatrix(rules);
  for (auto [name, elements] : {std::pair{"A", shape.m * shape.k}, std::pair{"B", shape.k * shape.n},
                                std::pair{"C", shape.m * shape.n}}) {
    if (elements > limit / int64_t(batch)) {
      return status::OverLimit(fmt::format(
          "{}batch: {} matrices {} of {} elements each are {} elements; this server takes at most "
          "{} per operand",
          prefix, batch, name, elements, uint64_t(batch) * uint64_t(elements), limit));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGroup(const v1::GemmRequest& request, const RequestRules& rules,
                           GemmJob* job) {
  const int64_t count = request.group_size();
  if (count > rules.max_group_problems) {
    return status::OverLimit(fmt::format("group has {} problems; this server takes at most {}",
                                         count, rules.max_group_problems));
  }
  for (auto [field, value, most] : {std::tuple{"m", request.m(), 0u}, std::tuple{"n", request.n(), 0u},
                                    std::tuple{"k", request.k(), 0u},
                                    std::tuple{"batch", request.batch(), 1u}}) {
    if (value > most) {
      return status::InvalidArgument(
          field, fmt::format("{} with a group (each problem has its own m, n, k in group[i]; "
                             "leave m, n, k 0 and batch 0 or 1)",
                             value));
    }
  }
  const std::string single_source_field =
      request.has_a_handle()      ? "a_handle"
      : request.has_b_handle()    ? "b_handle"
      : request.has_c_in_handle() ? "c_in_handle"
      : request.has_a_region()    ? "a_region"
      : request.has_b_region()    ? "b_region"
      : request.has_c_in_region() ? "c_in_region"
      : request.has_c_region()    ? "c_region"
      : request.keep_c_resident() ? "keep_c_resident"
                                  : "";
  if (!single_source_field.empty()) {
    return status::InvalidArgument(
        single_source_field,
        "a grouped GEMM takes its operands inline (a, b, c_in as bytes) and sends C back");
  }
  const bool auto_kernel = job->kernel == "auto";
  if (std::none_of(rules.kernels.begin(), rules.kernels.end(), [&](const KernelDescription& k) {
        return k.grouped && (auto_kernel || k.name == job->kernel);
      })) {
    return status::InvalidArgument(
        "options.kernel",
        fmt::format("'{}' takes no grouped GEMMs (ListKernels: KernelInfo.grouped says which do)",
                    job->kernel));
  }
  // Each problem's matrices are within the limit, so a sum stays far inside int64 until it
  // passes the limit, where the loop stops.
  const int64_t limit = MaxElementsPerMatrix(rules);
  int64_t a_elements = 0, b_elements = 0, c_elements = 0;
  std::vector<ProblemDims> group;
  group.reserve(size_t(count));
  for (int i = 0; i < int(count); ++i) {
    const v1::GroupedProblem& p = request.group(i);
    for (auto [field, value] : {std::pair{"m", p.m()}, std::pair{"n", p.n()}, std::pair{"k", p.k()}}) {
      if (value == 0) {
        return status::InvalidArgument(fmt::format("group[{}].{}", i, field), "must be at least 1");
      }
    }
    GemmShape one;
    if (absl::Status s = ValidateShape(p.m(), p.n(), p.k(), rules, &one); !s.ok()) {
      return absl::Status(s.code(), fmt::format("group[{}]: {}", i, std::string(s.message())));
    }
    a_elements += one.m * one.k;
    b_elements += one.k * one.n;
    c_elements += one.m * one.n;
    for (auto [name, elements] : {std::pair{"A", a_elements}, std::pair{"B", b_elements},
                                  std::pair{"C", c_elements}}) {
      if (elements > limit) {
        return status::OverLimit(fmt::format(
            "group: the {} matrices of problems 0..{} have {} elements together; this server "
            "takes at most {} per operand",
            name, i, elements, limit));
      }
    }
    group.push_back({one.m, one.n, one.k});
  }
  job->shape.m = job->shape.n = job->shape.k = 0;
  job->shape.batch = 1;
  job->shape.group = std::move(group);
  return absl::OkStatus();
}

namespace {

// The byte lengths of a grouped request's inline operands. REQUIRES: ValidateGroup passed.
absl::Status ValidateGroupBytes(const v1::GemmRequest& request, const GemmShape& shape) {
  for (auto [field, have, want, type] :
       {std::tuple{"a", request.a().size(), shape.ABytes(), shape.ab_type},
        std::tuple{"b", request.b().size(), shape.BBytes(), shape.ab_type},
        std::tuple{"c_in", request.c_in().size(), shape.CInBytes(), shape.c_type}}) {
    if (std::string_view(field) == "c_in" && !shape.c_input) continue;  // never read
    if (int64_t(have) != want) {
      return status::InvalidArgument(
          field, fmt::format("{} bytes; the {} problems' matrices ({}, as stored, packed in "
                             "order) take exactly {}",
                             have, shape.group.size(), ElementTypeName(type), want));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGemmRequest(const v1::GemmRequest& request, const RequestRules& rules,
                                 GemmJob* job) {
  absl::Status s = ValidateOptions(request.options(), rules, "options", job);
  if (!s.ok()) return s;
  if (s = ValidateForm(request.transpose_a(), request.transpose_b(), request.dtype(),
                       request.c_dtype(), rules, "", job);
      !s.ok()) {
    return s;
  }
  if (s = ValidateScale(request.has_alpha(), request.alpha(), request.beta(),
                        request.c_in_source_case() != v1::GemmRequest::C_IN_SOURCE_NOT_SET, rules,
                        "", job);
      !s.ok()) {
    return s;
  }
  if (request.group_size() > 0) {
    if (s = ValidateGroup(request, rules, job); !s.ok()) return s;
    return ValidateGroupBytes(request, job->shape);
  }
  if (s = ValidateShape(request.m(), request.n(), request.k(), rules, &job->shape); !s.ok()) return s;
  if (s = ValidateHandles(request); !s.ok()) return s;
  const std::string single_matrix_field =
      request.has_a_handle()                             ? "a_handle"
      : request.has_b_handle()                           ? "b_handle"
      : request.has_c_in_handle() && job->shape.c_input  ? "c_in_handle"
      : request.keep_c_resident()                        ? "keep_c_resident"
                                                         : "";
  if (s = ValidateBatch(request.batch(), single_matrix_field, rules, "", job); !s.ok()) return s;
  const GemmShape& shape = job->shape;
  // "N", or "N for the batch of B (M each)".
  auto total = [&](int64_t one_matrix) {
    return shape.batch == 1 ? std::to_string(one_matrix)
                            : fmt::format("{} for the batch of {} ({} each)",
                                          one_matrix * shape.batch, shape.batch, one_matrix);
  };
  if (int64_t want = shape.CBytes();
      shape.c_input && request.has_c_in() && int64_t(request.c_in().size()) != want) {
    return status::InvalidArgument(
        "c_in", fmt::format("{} bytes; an {}x{} {} matrix (m x n, c_dtype) takes exactly {}",
                            request.c_in().size(), shape.m, shape.n, ElementTypeName(shape.c_type),
                            total(shape.CMatrixBytes())));
  }
  // Operands given by handle or region are checked when it is resolved.
  const bool a_inline = request.a_source_case() == v1::GemmRequest::kA ||
                        request.a_source_case() == v1::GemmRequest::A_SOURCE_NOT_SET;
  const bool b_inline = request.b_source_case() == v1::GemmRequest::kB ||
                        request.b_source_case() == v1::GemmRequest::B_SOURCE_NOT_SET;
  if (int64_t want = shape.ABytes(); a_inline && int64_t(request.a().size()) != want) {
    return status::InvalidArgument(
        "a", fmt::format("{} bytes; an {}x{} {} matrix ({}) takes exactly {} (or give a_handle or a_region)",
                         request.a().size(), job->transpose_a ? shape.k : shape.m,
                         job->transpose_a ? shape.m : shape.k, ElementTypeName(shape.ab_type),
                         job->transpose_a ? "k x m, transpose_a" : "m x k",
                         total(shape.AMatrixBytes())));
  }
  if (int64_t want = shape.BBytes(); b_inline && int64_t(request.b().size()) != want) {
    return status::InvalidArgument(
        "b", fmt::format("{} bytes; a {}x{} {} matrix ({}) takes exactly {} (or give b_handle or b_region)",
                         request.b().size(), job->transpose_b ? shape.n : shape.k,
                         job->transpose_b ? shape.k : shape.n, ElementTypeName(shape.ab_type),
                         job->transpose_b ? "n x k, transpose_b" : "k x n",
                         total(shape.BMatrixBytes())));
  }
  return absl::OkStatus();
}

absl::Status ValidateGemmHeader(const v1::GemmHeader& header, const RequestRules& rules,
                                GemmJob* job) {
  absl::Status s = ValidateOptions(header.options(), rules, "header.options", job);
  if (!s.ok()) return s;
  if (s = ValidateForm(header.transpose_a(), header.transpose_b(), header.dtype(),
                       header.c_dtype(), rules, "header.", job);
      !s.ok()) {
    return s;
  }
  // C_in comes by handle or in OPERAND_C chunks: a header always has one.
  if (s = ValidateScale(header.has_alpha(), header.alpha(), header.beta(), /*has_c_in=*/true,
                        rules, "header.", job);
      !s.ok()) {
    return s;
  }
  if (s = ValidateShape(header.m(), header.n(), header.k(), rules, &job->shape); !s.ok()) return s;
  const std::string single_matrix_field =
      !header.a_handle().empty()      ? "a_handle"
      : !header.b_handle().empty()    ? "b_handle"
      : !header.c_in_handle().empty() && job->shape.c_input ? "c_in_handle"
      : header.keep_c_resident()      ? "keep_c_resident"
                                      : "";
  return ValidateBatch(header.batch(), single_matrix_field, rules, "header.", job);
}

}  // namespace hgemm
