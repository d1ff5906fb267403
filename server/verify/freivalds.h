// Freivalds' check of a GEMM's result: before a verified GEMM is answered, its backend
// compares C·r with alpha·op(A)·(op(B)·r) + beta·C_in·r, in fp32, for a random Gaussian vector
// r (random_vector.h), row by row, against the bound of Tolerance(). The passes are matrix-vector
// products: O(mk + kn + mn) work against the GEMM's O(mnk). docs/verification.md derives the
// bound and the detection rates.
//
// This file holds what every backend shares: the bound, the row check, the seeds, the host
// passes (the CPU backend's check; the CUDA backend runs the same passes as kernels) and the
// cache of op(B)·r per resident B.
// Thread safety: pure functions, FreshSeed and ResidentBCache are thread-safe.
#ifndef HGEMM_SERVER_VERIFY_FREIVALDS_H_
#define HGEMM_SERVER_VERIFY_FREIVALDS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/accumulation.h"
#include "server/core/job.h"
#include "server/core/shape.h"

namespace hgemm::verify {

// How many standard deviations of a correct C's deviation (see Tolerance) the check allows: a
// Gaussian passes 8 sigmas with probability 1.2e-15, per row and repetition.
inline constexpr double kSigmas = 8;
// The most repetitions (fresh vectors r) one GEMM may ask for.
inline constexpr int kMaxRepetitions = 8;

// One problem of a GEMM as the check sees it: C (m×n) = alpha·op(A)·op(B) + beta·C_in.
struct Form {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;  // A stored k×m
  bool transpose_b = false;  // B stored n×k
  ElementType ab_type = ElementType::kFp16;
  ElementType c_type = ElementType::kFp16;
  Accumulation accumulation = Accumulation::kFp32;
  float alpha = 1;
  float beta = 0;  // ≠ 0: C_in is read
};
// The form of one problem `p` of `job`.
Form FormOf(const GemmJob& job, const ProblemDims& p);

// What one repetition measured on one problem; the vectors have one element per row of C.
struct RowSums {
  std::vector<float> expected;  // alpha·(op(A)·x)_i + beta·(C_in·r)_i, x = op(B)·r
  std::vector<float> cr;        // (C·r)_i
  std::vector<float> a_sq;      // squared 2-norm of row i of op(A)
  std::vector<float> c_sq;      // squared 2-norm of row i of C
  std::vector<float> c_in_sq;   // squared 2-norm of row i of C_in; empty without beta
  double b_sq = 0;              // squared Frobenius norm of op(B)
};

// The largest |(C·r)_i − expected_i| a correct C lets row i show: kSigmas times the standard
// deviation bound
//   |alpha|·e_ab·‖op(A)_i‖·‖op(B)‖_F + |beta|·e_in·‖C_in_i‖ + e_c·‖C_i‖ + absolute underflow terms
// with e_ab = 2u_acc(√k + k/16) + u32(√n + √k + 3), e_in = u32(√n + 3), e_c = u_c + u32(√n + 1)
// (u_acc, u_c, u32: unit roundoffs of the accumulation, of C's type and of fp32). Arguments are
// the squared norms of RowSums.
double Tolerance(const Form& form, double a_sq, double b_sq, double c_sq, double c_in_sq);

// Whether row i of a correct C may hold an infinity or NaN: the inputs' norms allow a value
// past the largest finite of C's type (or of fp16, with fp16 accumulation).
bool MayOverflow(const Form& form, double a_sq, double b_sq, double c_in_sq);

// Checks every row of one repetition: "" if C passes, else what failed (the first row that
// failed, its deviation and bound). Rows whose expected side is not finite (an infinity or NaN
// in A, B or C_in) are not checked: there is nothing finite to compare with.
std::string CheckRows(const Form& form, const RowSums& sums);

// A seed for a fresh vector r: a process-wide counter through Mix64, started from
// std::random_device, so that no two GEMMs of a process, or of two processes, share one.
uint64_t FreshSeed();

// The B side of one repetition: the seed of r, x = op(B)·r (k elements) and ‖op(B)‖_F².
struct HostBSide {
  uint64_t seed = 0;
  std::vector<float> x;
  double b_sq = 0;
};

// The passes on the host, fp32 sums in the order the bound assumes (one running sum per
// element). A and B hold form.ab_type elements as stored; C and C_in form.c_type.
HostBSide HostB(const Form& form, const uint16_t* b, uint64_t seed);
// Fills sums' expected, a_sq and c_in_sq (reads A and C_in: before an in-place C overwrites
// C_in). c_in is read only when form.beta ≠ 0.
void HostExpected(const Form& form, const uint16_t* a, const void* c_in, const HostBSide& b,
                  RowSums* sums);
// Fills sums' cr and c_sq.
void HostCr(const Form& form, const void* c, uint64_t seed, RowSums* sums);

// What the check keeps per resident B (one Value per repetition and form of B): the vector
// drawn for it and what it derived from B, so that later GEMMs on the same B skip the pass
// over it. An entry belongs to the buffer object itself (its shared_ptr's control block), not
// to its address: a buffer freed and another one allocated at the same address find nothing.
// Whoever writes a resident buffer calls Forget for it. Keeps at most `capacity` entries,
// dropping the oldest. Thread-safe.
template <typename Value>
class ResidentBCache {
 public:
  // What a Value is for: the same B seen with another shape, type or transpose, or for another
  // repetition, has another key.
  struct Key {
    int64_t k = 0, n = 0;
    ElementType type = ElementType::kFp16;
    bool transposed = false;
    int repetition = 0;
    bool operator==(const Key& o) const {
      return k == o.k && n == o.n && type == o.type && transposed == o.transposed &&
             repetition == o.repetition;
    }
  };

  explicit ResidentBCache(size_t capacity = 256) : capacity_(capacity) {}

  // The value kept for this very buffer and key, or null.
  std::shared_ptr<const Value> Find(const std::shared_ptr<ResidentBuffer>& b, const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_) {
      if (Same(e.buffer, b) && e.key == key) return e.value;
    }
    return nullptr;
  }
  // Keeps `value` for `b` and `key` (replacing one there was).
  void Put(const std::shared_ptr<ResidentBuffer>& b, const Key& key,
           std::shared_ptr<const Value> value) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Entry> kept;
    for (Entry& e : entries_) {
      if (!e.buffer.expired() && !(Same(e.buffer, b) && e.key == key)) kept.push_back(std::move(e));
    }
    if (kept.size() >= capacity_) kept.erase(kept.begin());
    kept.push_back({b, key, std::move(value)});
    entries_ = std::move(kept);
  }
  // Forgets what was kept for `b`: its bytes are changing.
  void Forget(const ResidentBuffer* b) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Entry> kept;
    for (Entry& e : entries_) {
      std::shared_ptr<ResidentBuffer> held = e.buffer.lock();
      if (held && held.get() != b) kept.push_back(std::move(e));
    }
    entries_ = std::move(kept);
  }

 private:
  struct Entry {
    std::weak_ptr<ResidentBuffer> buffer;
    Key key;
    std::shared_ptr<const Value> value;
  };
  static bool Same(const std::weak_ptr<ResidentBuffer>& a,
                   const std::shared_ptr<ResidentBuffer>& b) {
    return !a.owner_before(b) && !b.owner_before(a);
  }

  const size_t capacity_;
  std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_; oldest first
};

}  // namespace hgemm::verify

#endif  // HGEMM_SERVER_VERIFY_FREIVALDS_H_
