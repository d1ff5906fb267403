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
    return status::OverLimit(
        "max_elements_per_matrix",
        fmt::format("{} has {}x{} = {} elements; this server takes at most {}", matrix, rows, cols,
                    elements, MaxElementsPerMatrix(rules)));
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
absl::Status ValidateHandles(const GemmSpec& spec) {
  using Kind = OperandSource::Kind;
  auto empty_handle = [](const OperandSource& source) {
    return source.kind == Kind::kResident && source.handle.empty();
  };
  auto empty_region = [](const OperandSource& source) {
    return source.kind == Kind::kRegion && source.handle.empty();
  };
  if (empty_handle(spec.a)) {
    return status::InvalidArgument(spec.Field("a_handle"),
                                   "empty (set a, or the handle of a resident matrix)");
  }
  if (empty_handle(spec.b)) {
    return status::InvalidArgument(spec.Field("b_handle"),
                                   "empty (set b, or the handle of a resident matrix)");
  }
  // Regions: named, and C goes to one place. Offsets and sizes are checked against the
  // region when it is looked up (RegionStore::Acquire).
  if (empty_region(spec.a)) {
    return status::InvalidArgument(spec.Field("a_region.region"), kNoRegion);
  }
  if (empty_region(spec.b)) {
    return status::InvalidArgument(spec.Field("b_region.region"), kNoRegion);
  }
  const bool c_region = spec.c.kind == ResultSink::Kind::kRegion;
  if (c_region && spec.c.region.empty()) {
    return status::InvalidArgument(spec.Field("c_region.region"), kNoRegion);
  }
  if (empty_handle(spec.c_in)) {
    return status::InvalidArgument(spec.Field("c_in_handle"),
                                   "empty (set c_in, or the handle of a resident matrix)");
  }
  if (empty_region(spec.c_in)) {
    return status::InvalidArgument(spec.Field("c_in_region.region"), kNoRegion);
  }
  if (c_region && spec.keep_c_resident) {
    return status::InvalidArgument(spec.Field("c_region"),
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

std::string LayoutNames(unsigned layouts) { return BitNames(layouts, kLayoutNames); }

std::string TypesNames(unsigned types) {
  static const char* const kNames[4] = {"fp16", "fp16->fp32", "bf16", "bf16->fp32"};
  return BitNames(types, kNames);
}

int64_t MaxElementsPerMatrix(const RequestRules& rules) {
  return std::clamp<int64_t>(rules.max_elements_per_matrix, 1, kMaxElementsPerMatrix);
}

absl::Status ValidateShape(uint32_t m, uint32_t n, uint32_t k, const RequestRules& rules,
                           GemmShape* shape) {
  if (m == 0) return status::InvalidArgument("m", "must be at least 1");
  if (n == 0) return status::InvalidArgument("n", "must be at least 1");
  if (k == 0) return status::InvalidArgument("k", "must be at least 1");
  for (absl::Status s :
       {CheckElements("A (m x k)", m, k, rules), CheckElements("B (k x n)", k, n, rules),
        CheckElements("C (m x n)", m, n, rules)}) {
    if (!s.ok()) return s;
  }
  shape->m = m;  // only now are its sizes safe to compute
  shape->n = n;
  shape->k = k;
  return absl::OkStatus();
}

namespace {

// Request id, kernel name and accumulation. Fills job->request_id first (a refusal of any
// later field is logged with it), then job->kernel and job->accumulation.
absl::Status ValidateOptions(const GemmSpec& spec, const RequestRules& rules, GemmJob* job) {
  const GemmSpec::Options& options = spec.options;
  if (options.request_id.size() > kMaxRequestIdBytes) {
    return status::InvalidArgument(
        spec.Field("options.request_id"),
        fmt::format("{} bytes; at most {}", options.request_id.size(), kMaxRequestIdBytes));
  }
  job->request_id = options.request_id;
  if (options.verify_repetitions > uint32_t(verify::kMaxRepetitions)) {
    return status::InvalidArgument(
        spec.Field("options.verify_repetitions"),
        fmt::format("{}; at most {}", options.verify_repetitions, verify::kMaxRepetitions));
  }
  job->verify = options.verify;
  job->verify_repetitions = options.verify ? int(options.verify_repetitions) : 0;
  if (!options.accumulation.known) {
    return status::InvalidArgument(spec.Field("options.accumulation"),
                                   fmt::format("unknown value {}", options.accumulation.number));
  }
  job->accumulation = options.accumulation.value.value_or(Accumulation::kFp32);
  const std::string& name = options.kernel;
  const bool fp16 = job->accumulation == Accumulation::kFp16;
  if (name.empty() || name == "auto") {
    if (!AutoSupports(rules, job->accumulation)) {
      return status::InvalidArgument(
          spec.Field("options.accumulation"),
          fmt::format("no kernel of this server has {} accumulation (ListKernels says which do)",
                      fp16 ? "FP16" : "FP32"));
    }
    job->kernel = "auto";
  } else {
    auto it = std::find_if(rules.kernels.begin(), rules.kernels.end(),
                           [&](const KernelDescription& k) { return k.name == name; });
    if (it == rules.kernels.end()) {
      return status::InvalidArgument(
          spec.Field("options.kernel"),
          fmt::format("unknown kernel {}; ListKernels names the kernels of this server, or use "
                      "'auto'",
                      status::Quote(name)));
    }
    if (fp16 ? !it->fp16_accumulation : !it->fp32_accumulation) {
      return status::InvalidArgument(
          spec.Field("options.accumulation"),
          fmt::format("kernel '{}' has no {} accumulation", name, fp16 ? "FP16" : "FP32"));
    }
    job->kernel = name;
  }
  return absl::OkStatus();
}

// Layout and types: dtype fp16 or bf16, c_dtype the same or fp32, the accumulation FP32
// unless both are fp16, and the kernel (job->kernel, "auto" included) taking the layout and
// the types. Fills job->transpose_a/b and job->shape's ab_type and c_type.
// REQUIRES: ValidateOptions passed.
absl::Status ValidateForm(const GemmSpec& spec, const RequestRules& rules, GemmJob* job) {
  const ElementType ab = spec.dtype.value.value_or(ElementType::kFp16);
  if (!spec.dtype.known || ab == ElementType::kFp32) {
    return status::InvalidArgument(
        spec.Field("dtype"),
        fmt::format("enum value {} is not a type of A and B (DATA_TYPE_FP16 or DATA_TYPE_BF16)",
                    spec.dtype.number));
  }
  const ElementType c = spec.c_dtype.value.value_or(ab);
  if (!spec.c_dtype.known || (c != ab && c != ElementType::kFp32)) {
    return status::InvalidArgument(
        spec.Field("c_dtype"),
        fmt::format("enum value {} is not a type of C for {} inputs (UNSPECIFIED, the inputs' "
                    "type, or DATA_TYPE_FP32)",
                    spec.c_dtype.number, ElementTypeName(ab)));
  }
  if (job->accumulation == Accumulation::kFp16 &&
      (ab != ElementType::kFp16 || c != ElementType::kFp16)) {
    return status::InvalidArgument(spec.Field("options.accumulation"),
                                   fmt::format("FP16 accumulation takes fp16 in and out, not {}",
                                               TypesNames(TypesBit(ab, c))));
  }
  const unsigned layout = LayoutBit(spec.transpose_a, spec.transpose_b);
  const unsigned types = TypesBit(ab, c);
  // The field to blame for a layout no kernel takes: the transposed operand (A's first).
  const std::string layout_field = spec.Field(spec.transpose_a ? "transpose_a" : "transpose_b");
  const std::string types_field = spec.Field(ab != ElementType::kFp16 ? "dtype" : "c_dtype");
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
      return status::InvalidArgument(layout_field,
                                     fmt::format("kernel '{}' takes layouts {}, not {}", it->name,
                                                 LayoutNames(it->layouts), LayoutNames(layout)));
    }
    if ((it->types & types) == 0) {
      return status::InvalidArgument(types_field,
                                     fmt::format("kernel '{}' takes types {}, not {}", it->name,
                                                 TypesNames(it->types), TypesNames(types)));
    }
  }
  job->transpose_a = spec.transpose_a;
  job->transpose_b = spec.transpose_b;
  job->shape.ab_type = ab;
  job->shape.c_type = c;
  return absl::OkStatus();
}

// Scales: alpha (1 when unset) and beta finite; beta ≠ 0 only with a C input; alpha ≠ 1 or
// beta ≠ 0 only with FP32 accumulation and a kernel (job->kernel, "auto" included) that takes
// them for the types. Fills job->alpha, job->beta and job->shape.c_input (beta ≠ 0).
// REQUIRES: ValidateForm passed.
absl::Status ValidateScale(const GemmSpec& spec, const RequestRules& rules, GemmJob* job) {
  const float alpha = spec.alpha.value_or(1), beta = spec.beta;
  if (!std::isfinite(alpha)) {
    return status::InvalidArgument(spec.Field("alpha"),
                                   ScaleText(alpha) + " is not a finite number");
  }
  if (!std::isfinite(beta)) {
    return status::InvalidArgument(spec.Field("beta"), ScaleText(beta) + " is not a finite number");
  }
  if (beta != 0 && spec.c_in.kind == OperandSource::Kind::kNone) {
    return status::InvalidArgument(spec.Field("beta"), ScaleText(beta) +
                                                           " needs a C input (c_in, c_in_handle or "
                                                           "c_in_region), and none was given");
  }
  job->alpha = alpha;
  job->beta = beta;
  job->shape.c_input = beta != 0;
  if (!job->Scaled()) return absl::OkStatus();
  // The field a refusal names: the scale that makes this more than op(A)·op(B).
  const std::string scale_field = spec.Field(beta != 0 ? "beta" : "alpha");
  if (job->accumulation != Accumulation::kFp32) {
    return status::InvalidArgument(
        spec.Field("options.accumulation"),
        "FP16 accumulation takes no alpha/beta (they need FP32 accumulation)");
  }
  const unsigned types = TypesBit(job->shape.ab_type, job->shape.c_type);
  if (job->kernel == "auto") {
    if (!AutoSupports(rules, job->accumulation, LayoutBit(job->transpose_a, job->transpose_b),
                      types, /*scaled=*/true)) {
      return status::InvalidArgument(
          scale_field,
          fmt::format("no kernel of this server takes alpha/beta for {} in layout {} "
                      "(it takes them for {})",
                      TypesNames(types), LayoutNames(LayoutBit(job->transpose_a, job->transpose_b)),
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

// Strided-batched: batch 0 or 1 is one GEMM; more needs batch·(elements of each of A, B, C)
// within MaxElementsPerMatrix (RESOURCE_EXHAUSTED naming the batch's matrix and the limit) and
// no field that holds one matrix only (`single_matrix_field`, e.g. "a_handle" or
// "keep_c_resident"; "" when none is set). Fills job->shape.batch.
// REQUIRES: ValidateShape passed.
absl::Status ValidateBatch(const GemmSpec& spec, const std::string& single_matrix_field,
                           const RequestRules& rules, GemmJob* job) {
  const uint32_t batch = spec.batch;
  GemmShape& shape = job->shape;
  shape.batch = std::max<uint32_t>(batch, 1);
  if (batch <= 1) return absl::OkStatus();
  if (!single_matrix_field.empty()) {
    return status::InvalidArgument(
        spec.Field(single_matrix_field),
        fmt::format("holds one matrix; a batch of {} takes its operands inline, in a region or "
                    "streamed, and C back (batch 1 for this)",
                    batch));
  }
  // Each operand's buffer is one matrix of batch·rows rows, for the size limits.
  const int64_t limit = MaxElementsPerMatrix(rules);
  for (auto [name, elements] :
       {std::pair{"A", shape.m * shape.k}, std::pair{"B", shape.k * shape.n},
        std::pair{"C", shape.m * shape.n}}) {
    if (elements > limit / int64_t(batch)) {
      return status::OverLimit(
          "max_elements_per_matrix",
          fmt::format(
              "{}: {} matrices {} of {} elements each are {} elements; this server takes at most "
              "{} per operand",
              spec.Field("batch"), batch, name, elements, uint64_t(batch) * uint64_t(elements),
              limit));
    }
  }
  return absl::OkStatus();
}

// Grouped (spec.group non-empty): m, n, k 0 and batch ≤ 1 (INVALID_ARGUMENT naming them), at
// most rules.max_group_problems problems (RESOURCE_EXHAUSTED), each with m, n, k ≥ 1
// (INVALID_ARGUMENT naming "group[i].m") and its matrices within the limit, and each of A, B,
// C summed over the group within MaxElementsPerMatrix (RESOURCE_EXHAUSTED, in checked
// arithmetic), the kernel (job->kernel, "auto" included) taking groups, and no operand or C by
// handle or region, nor a kept C. Fills job->shape.group. REQUIRES: ValidateOptions passed.
absl::Status ValidateGroup(const GemmSpec& spec, const RequestRules& rules, GemmJob* job) {
  const int64_t count = int64_t(spec.group.size());
  if (count > rules.max_group_problems) {
    return status::OverLimit("max_group_problems",
                             fmt::format("group has {} problems; this server takes at most {}",
                                         count, rules.max_group_problems));
  }
  for (auto [field, value, most] :
       {std::tuple{"m", spec.m, 0u}, std::tuple{"n", spec.n, 0u}, std::tuple{"k", spec.k, 0u},
        std::tuple{"batch", spec.batch, 1u}}) {
    if (value > most) {
      return status::InvalidArgument(
          spec.Field(field),
          fmt::format("{} with a group (each problem has its own m, n, k in group[i]; leave m, "
                      "n, k 0 and batch 0 or 1)",
                      value));
    }
  }
  using Kind = OperandSource::Kind;
  const std::string single_source_field = spec.a.kind == Kind::kResident             ? "a_handle"
                                          : spec.b.kind == Kind::kResident           ? "b_handle"
                                          : spec.c_in.kind == Kind::kResident        ? "c_in_handle"
                                          : spec.a.kind == Kind::kRegion             ? "a_region"
                                          : spec.b.kind == Kind::kRegion             ? "b_region"
                                          : spec.c_in.kind == Kind::kRegion          ? "c_in_region"
                                          : spec.c.kind == ResultSink::Kind::kRegion ? "c_region"
                                          : spec.keep_c_resident ? "keep_c_resident"
                                                                 : "";
  if (!single_source_field.empty()) {
    return status::InvalidArgument(
        spec.Field(single_source_field),
        "a grouped GEMM takes its operands inline (a, b, c_in as bytes) and sends C back");
  }
  const bool auto_kernel = job->kernel == "auto";
  if (std::none_of(rules.kernels.begin(), rules.kernels.end(), [&](const KernelDescription& k) {
        return k.grouped && (auto_kernel || k.name == job->kernel);
      })) {
    return status::InvalidArgument(
        spec.Field("options.kernel"),
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
    const GemmSpec::Problem& p = spec.group[size_t(i)];
    for (auto [field, value] : {std::pair{"m", p.m}, std::pair{"n", p.n}, std::pair{"k", p.k}}) {
      if (value == 0) {
        return status::InvalidArgument(fmt::format("group[{}].{}", i, field), "must be at least 1");
      }
    }
    GemmShape one;
    if (absl::Status s = ValidateShape(p.m, p.n, p.k, rules, &one); !s.ok()) {
      return absl::Status(s.code(), fmt::format("group[{}]: {}", i, std::string(s.message())));
    }
    a_elements += one.m * one.k;
    b_elements += one.k * one.n;
    c_elements += one.m * one.n;
    for (auto [name, elements] :
         {std::pair{"A", a_elements}, std::pair{"B", b_elements}, std::pair{"C", c_elements}}) {
      if (elements > limit) {
        return status::OverLimit(
            "max_elements_per_matrix",
            fmt::format(
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

// The byte lengths of a grouped request's inline operands. REQUIRES: ValidateGroup passed.
absl::Status ValidateGroupBytes(const GemmSpec& spec, const GemmShape& shape) {
  for (auto [field, have, want, type] :
       {std::tuple{"a", spec.a.bytes, shape.ABytes(), shape.ab_type},
        std::tuple{"b", spec.b.bytes, shape.BBytes(), shape.ab_type},
        std::tuple{"c_in", spec.c_in.bytes, shape.CInBytes(), shape.c_type}}) {
    if (std::string_view(field) == "c_in" && !shape.c_input) continue;  // never read
    if (have != want) {
      return status::InvalidArgument(
          spec.Field(field), fmt::format("{} bytes; the {} problems' matrices ({}, as stored, "
                                         "packed in order) take exactly {}",
                                         have, shape.group.size(), ElementTypeName(type), want));
    }
  }
  return absl::OkStatus();
}

// The byte lengths of a single or batched GEMM's inline operands (C_in's only with beta ≠ 0).
// Operands given by handle or region are checked when they are resolved.
// REQUIRES: ValidateBatch passed.
absl::Status ValidateInlineBytes(const GemmSpec& spec, const GemmJob& job) {
  using Kind = OperandSource::Kind;
  const GemmShape& shape = job.shape;
  // "N", or "N for the batch of B (M each)".
  auto total = [&](int64_t one_matrix) {
    return shape.batch == 1 ? std::to_string(one_matrix)
                            : fmt::format("{} for the batch of {} ({} each)",
                                          one_matrix * shape.batch, shape.batch, one_matrix);
  };
  if (int64_t want = shape.CBytes();
      shape.c_input && spec.c_in.kind == Kind::kInline && spec.c_in.bytes != want) {
    return status::InvalidArgument(
        spec.Field("c_in"),
        fmt::format("{} bytes; an {}x{} {} matrix (m x n, c_dtype) takes exactly {}",
                    spec.c_in.bytes, shape.m, shape.n, ElementTypeName(shape.c_type),
                    total(shape.CMatrixBytes())));
  }
  if (int64_t want = shape.ABytes(); spec.a.kind == Kind::kInline && spec.a.bytes != want) {
    return status::InvalidArgument(
        spec.Field("a"),
        fmt::format("{} bytes; an {}x{} {} matrix ({}) takes exactly {} (or give a_handle or "
                    "a_region)",
                    spec.a.bytes, job.transpose_a ? shape.k : shape.m,
                    job.transpose_a ? shape.m : shape.k, ElementTypeName(shape.ab_type),
                    job.transpose_a ? "k x m, transpose_a" : "m x k", total(shape.AMatrixBytes())));
  }
  if (int64_t want = shape.BBytes(); spec.b.kind == Kind::kInline && spec.b.bytes != want) {
    return status::InvalidArgument(
        spec.Field("b"),
        fmt::format("{} bytes; a {}x{} {} matrix ({}) takes exactly {} (or give b_handle or "
                    "b_region)",
                    spec.b.bytes, job.transpose_b ? shape.n : shape.k,
                    job.transpose_b ? shape.k : shape.n, ElementTypeName(shape.ab_type),
                    job.transpose_b ? "n x k, transpose_b" : "k x n", total(shape.BMatrixBytes())));
  }
  return absl::OkStatus();
}

// Options, form, scales, then the group or the shape, handles, batch and inline operands.
absl::Status ValidateJob(const GemmSpec& spec, const RequestRules& rules, GemmJob* job) {
  absl::Status s = ValidateOptions(spec, rules, job);
  if (!s.ok()) return s;
  if (s = ValidateForm(spec, rules, job); !s.ok()) return s;
  if (s = ValidateScale(spec, rules, job); !s.ok()) return s;
  if (!spec.group.empty()) {
    if (s = ValidateGroup(spec, rules, job); !s.ok()) return s;
    return ValidateGroupBytes(spec, job->shape);
  }
  if (s = ValidateShape(spec.m, spec.n, spec.k, rules, &job->shape); !s.ok()) return s;
  if (s = ValidateHandles(spec); !s.ok()) return s;
  using Kind = OperandSource::Kind;
  const std::string single_matrix_field = spec.a.kind == Kind::kResident   ? "a_handle"
                                          : spec.b.kind == Kind::kResident ? "b_handle"
                                          : spec.c_in.kind == Kind::kResident && job->shape.c_input
                                              ? "c_in_handle"
                                          : spec.keep_c_resident ? "keep_c_resident"
                                                                 : "";
  if (s = ValidateBatch(spec, single_matrix_field, rules, job); !s.ok()) return s;
  return ValidateInlineBytes(spec, *job);
}

}  // namespace

absl::Status ValidateGemm(const GemmSpec& spec, const RequestRules& rules, GemmOrder* order) {
  if (absl::Status s = ValidateJob(spec, rules, &order->job); !s.ok()) return s;
  order->a = spec.a;
  order->b = spec.b;
  // Without beta, C_in is never read: whatever the spec names for it is left alone.
  order->c_in = order->job.shape.c_input ? spec.c_in : OperandSource::None();
  order->c = spec.keep_c_resident ? ResultSink::KeepResident(spec.c_ttl_seconds, spec.c_transient)
                                  : spec.c;
  return absl::OkStatus();
}

}  // namespace hgemm
