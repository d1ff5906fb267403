// GEMMs of their own few rows against one resident B, the scheduler's batches
// (Backend::RunBatch): a resident B with fresh random values, and members with their own random
// A (and C_in), a C sink poisoned with NaN (host memory, a kept C, or a device buffer) and an
// fp32 reference. Test-only.
// Thread safety: none; each object is used by one thread at a time (the scheduler's worker
// writes a member's sink while the test waits for its answer).
#ifndef HGEMM_SERVER_TESTING_SHARED_B_GEMMS_H_
#define HGEMM_SERVER_TESTING_SHARED_B_GEMMS_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/backend/backend.h"

namespace hgemm {

// B (k×n as op(B); stored n×k with form.transpose_b) resident on device 0 of `backend`.
struct SharedB {
  SharedB(Backend* backend, int64_t n, int64_t k, const GemmForm& form, std::mt19937_64& rng)
      : n(n), k(k), form(form), values(RandomHalfMatrix(n * k, rng, form.bf16)) {
    const int64_t bytes = n * k * 2;
    EXPECT_TRUE(backend->AllocateResident(0, bytes, &buffer).ok());
    if (buffer) {
      EXPECT_TRUE(backend->WriteResident(*buffer, 0, values.data(), bytes).ok());
    }
  }

  const int64_t n, k;
  const GemmForm form;
  const std::vector<uint16_t> values;
  std::shared_ptr<ResidentBuffer> buffer;
};

// Where a member's C goes.
enum class CSink {
  kHost,    // GemmJob::c
  kKeepC,   // kept on the backend (GemmReport::c_resident)
  kDevice,  // GemmJob::c_device, a buffer of the backend's
};

// One member: m rows of its own times the shared B, C = alpha·op(A)·op(B) + beta·C_in.
class RowsGemm {
 public:
  // `in_place`: C_in is C's own memory (a host sink, beta ≠ 0).
  RowsGemm(Backend* backend, const SharedB& b, int64_t m, std::mt19937_64& rng, float alpha = 1,
           float beta = 0, CSink sink = CSink::kHost, bool in_place = false)
      : backend_(backend), m_(m), n_(b.n), form_(b.form), sink_(sink) {
    a_ = RandomHalfMatrix(m * b.k, rng, form_.bf16);
    job.shape = {.m = m,
                 .n = b.n,
                 .k = b.k,
                 .ab_type = form_.bf16 ? ElementType::kBf16 : ElementType::kFp16,
                 .c_type = form_.c_fp32 ? ElementType::kFp32
                           : form_.bf16 ? ElementType::kBf16
                                        : ElementType::kFp16,
                 .c_input = beta != 0};
    job.transpose_a = form_.transpose_a;
    job.transpose_b = form_.transpose_b;
    job.a = a_.data();
    job.b_resident = b.buffer;
    job.alpha = alpha;
    job.beta = beta;
    const int64_t c_bytes = job.shape.CBytes();
    if (beta != 0) {  // C_in: random values of C's type
      std::vector<uint16_t> halves = RandomHalfMatrix(m * n_, rng, form_.bf16);
      c_in_.resize(c_bytes);
      if (form_.c_fp32) {
        std::vector<float> floats(m * n_);
        for (int64_t i = 0; i < m * n_; ++i) {
          floats[i] = float(int(halves[i] % 2001) - 1000) / 1000;
        }
        std::memcpy(c_in_.data(), floats.data(), c_bytes);
      } else {
        std::memcpy(c_in_.data(), halves.data(), c_bytes);
      }
    }
    reference_ = ReferenceGemm(
        a_.data(), b.values.data(), m, n_, b.k, form_,
        {.alpha = alpha, .beta = beta, .c_in = c_in_.empty() ? nullptr : c_in_.data()});
    c_.assign(c_bytes, '\xFF');  // NaN in every type: an element left unwritten shows
    switch (sink) {
      case CSink::kHost:
        if (in_place) c_ = c_in_;
        job.c = c_.data();
        job.c_in = in_place ? c_.data() : c_in_.empty() ? nullptr : c_in_.data();
        break;
      case CSink::kKeepC:
        job.keep_c = true;
        job.c_in = c_in_.empty() ? nullptr : c_in_.data();
        break;
      case CSink::kDevice:
        EXPECT_TRUE(backend->AllocateResident(0, c_bytes, &job.c_device).ok());
        if (job.c_device) {
          EXPECT_TRUE(backend->WriteResident(*job.c_device, 0, c_.data(), c_bytes).ok());
        }
        job.c_in = c_in_.empty() ? nullptr : c_in_.data();
        break;
    }
  }
  RowsGemm(const RowsGemm&) = delete;
  RowsGemm& operator=(const RowsGemm&) = delete;

  // C as delivered to the sink (for kKeepC, in `report`) against the reference.
  ErrorStats Check(const GemmReport& report) const {
    std::vector<char> c(c_.size());
    switch (sink_) {
      case CSink::kHost:
        c = c_;
        break;
      case CSink::kKeepC:
        if (report.c_resident == nullptr) {
          ADD_FAILURE() << "no kept C";
          return {.rel_frobenius = 1e9};
        }
        EXPECT_TRUE(backend_->ReadResident(*report.c_resident, c.data()).ok());
        break;
      case CSink::kDevice:
        EXPECT_TRUE(backend_->ReadResident(*job.c_device, c.data()).ok());
        break;
    }
    return CompareToReference(c.data(), reference_.data(), m_ * n_, form_);
  }
  // Whether C is the reference's within the service's tolerance, every element written.
  bool Correct(const GemmReport& report) const {
    const ErrorStats error = Check(report);
    EXPECT_EQ(error.nan_count, 0u) << error.ToString();
    EXPECT_LE(error.rel_frobenius, ServiceTolerance(false, form_)) << error.ToString();
    return error.nan_count == 0 && error.rel_frobenius <= ServiceTolerance(false, form_);
  }
  // Whether the host sink still holds its poison (nothing was written there).
  bool Untouched() const {
    return std::all_of(c_.begin(), c_.end(), [](char byte) { return byte == '\xFF'; });
  }

  GemmJob job;

 private:
  Backend* const backend_;
  const int64_t m_, n_;
  const GemmForm form_;
  const CSink sink_;
  std::vector<uint16_t> a_;
  std::vector<char> c_in_, c_;
  std::vector<float> reference_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_SHARED_B_GEMMS_H_
