#include "server/session/resident_resolver.h"

#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <utility>

#include "server/core/status.h"

namespace hgemm {

absl::Status ResidentResolver::Resolve(const std::string& owner, const ResidentOperands& operands,
                                       GemmJob* job, QuotaReservation* c_quota,
                                       std::vector<std::string>* transient_handles) const {
  const GemmShape& shape = job->shape;
  struct Operand {
    const std::string& handle;
    const char* field;
    int64_t rows, cols;  // as stored
    const char* layout;  // what the stored shape follows from
    std::shared_ptr<ResidentBuffer>* slot;
  };
  const Operand a =
      job->transpose_a
          ? Operand{operands.a_handle, "a_handle",           shape.k,
                    shape.m,           "k x m, transpose_a", &job->a_resident}
          : Operand{operands.a_handle, "a_handle", shape.m, shape.k, "m x k", &job->a_resident};
  const Operand b =
      job->transpose_b
          ? Operand{operands.b_handle, "b_handle",           shape.n,
                    shape.k,           "n x k, transpose_b", &job->b_resident}
          : Operand{operands.b_handle, "b_handle", shape.k, shape.n, "k x n", &job->b_resident};
  const Operand c_in{operands.c_in_handle, "c_in_handle", shape.m, shape.n, "m x n",
                     &job->c_in_resident};
  const Operand c{operands.c_handle, "c_handle", shape.m, shape.n, "m x n", &job->c_device};
  for (const std::string* operand :
       {&operands.a_handle, &operands.b_handle, &operands.c_in_handle}) {
    if (!c.handle.empty() && *operand == c.handle) {
      return status::InvalidArgument(
          c.field, fmt::format("matrix {} is also an operand of this GEMM; C is written in place",
                               status::Quote(c.handle)));
    }
  }
  for (const Operand& o : {a, b, c_in, c}) {
    if (o.handle.empty()) continue;
    ResidentMatrix m;
    if (absl::Status s = store_->Lookup(owner, o.handle, o.field, &m); !s.ok()) return s;
    const bool c_typed = o.slot == &job->c_in_resident || o.slot == &job->c_device;
    if (c_typed && m.dtype != shape.c_type) {
      return status::InvalidArgument(
          o.field, fmt::format("matrix {} is {}, this GEMM's C is {} (C_in has c_dtype's type)",
                               status::Quote(o.handle), ElementTypeName(m.dtype),
                               ElementTypeName(shape.c_type)));
    }
    if (!c_typed && m.dtype == ElementType::kFp32) {
      return status::InvalidArgument(
          o.field, fmt::format("matrix {} is fp32 (a C kept with c_dtype FP32), this GEMM's dtype "
                               "is {} (mixing dtypes: operands are fp16 or bf16; download it, "
                               "convert and upload it)",
                               status::Quote(o.handle), ElementTypeName(shape.ab_type)));
    }
    if (!c_typed && m.dtype != shape.ab_type) {
      return status::InvalidArgument(
          o.field, fmt::format("matrix {} is {}, this GEMM's dtype is {} (mixing dtypes: upload "
                               "it as {}, or send the GEMM's dtype as {})",
                               status::Quote(o.handle), ElementTypeName(m.dtype),
                               ElementTypeName(shape.ab_type), ElementTypeName(shape.ab_type),
                               ElementTypeName(m.dtype)));
    }
    if (m.rows != o.rows || m.cols != o.cols) {
      return status::InvalidArgument(
          o.field, fmt::format("matrix {} is {}x{}; this GEMM needs {}x{} ({})",
                               status::Quote(o.handle), m.rows, m.cols, o.rows, o.cols, o.layout));
    }
    // C written in place decides the device: the backend writes C only on the device it runs.
    if (o.slot == &job->c_device) {
      if ((job->a_resident && job->a_resident->device_index != m.buffer->device_index) ||
          (job->b_resident && job->b_resident->device_index != m.buffer->device_index)) {
        return status::FailedPrecondition(fmt::format(
            "c_handle: matrix {} is on another device than this GEMM's resident operands",
            status::Quote(o.handle)));
      }
      job->device_index = m.buffer->device_index;
      job->stay_on_device = true;
      *o.slot = m.buffer;
      continue;
    }
    // Operands on different devices: run where the larger of A and B lives (C_in decides
    // only alone).
    if (job->device_index < 0 || (o.slot == &job->b_resident && job->a_resident &&
                                  m.buffer->bytes > job->a_resident->bytes)) {
      job->device_index = m.buffer->device_index;
    }
    *o.slot = m.buffer;
    if (m.transient && transient_handles != nullptr) transient_handles->push_back(o.handle);
  }
  if (operands.keep_c) {
    if (absl::Status s = store_->Reserve(owner, shape.CBytes(), c_quota); !s.ok()) {
      return status::WithContext("keep_c_resident", s);
    }
    job->keep_c = true;
  }
  return absl::OkStatus();
}

int ResidentResolver::PlaceArriving(GemmJob* job) const {
  if (job->device_index < 0) job->device_index = scheduler_->LeastLoadedDevice();
  return job->device_index;
}

ResidentMatrix ResidentResolver::KeepC(QuotaReservation c_quota, const GemmShape& shape,
                                       const GemmReport& report, uint32_t ttl_seconds,
                                       bool transient) const {
  return store_->Add(std::move(c_quota), shape.m, shape.n, shape.c_type, report.c_resident,
                     std::chrono::seconds(ttl_seconds), "C of " + report.kernel, transient);
}

}  // namespace hgemm
