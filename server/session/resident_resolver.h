// ResidentResolver: the resident half of admitting a GEMM, without the transport. It turns the
// handles a request names into the job's operand buffers (checking their shapes), places the
// job on a device, and reserves the quota of a C the client keeps on the server.
//
// Placement: a job runs where its resident operands live (the device of the larger one when A
// and B live on different devices: the backend copies the other over for that run); a job
// whose operands are still to come (a streamed GEMM) goes to the least loaded device, and its
// operands are written there as they arrive.
// Quota: the C of keep_c is reserved in one step (MatrixStore::Reserve), so two GEMMs admitted
// at once cannot both pass the client's quota; the reservation becomes the matrix's when the
// GEMM has run (MatrixStore::Add) or is given back if it does not.
// Keeping C: once the GEMM has run, KeepC turns the reservation into the stored matrix.
// Thread safety: all methods are thread-safe; the store and scheduler must outlive it.
#ifndef HGEMM_SERVER_SESSION_RESIDENT_RESOLVER_H_
#define HGEMM_SERVER_SESSION_RESIDENT_RESOLVER_H_

#include <absl/status/status.h>

#include <string>
#include <vector>

#include "server/core/job.h"
#include "server/resident/matrix_store.h"
#include "server/scheduler/scheduler.h"

namespace hgemm {

// The resident operands of a GEMM, as a request names them ("" for an operand sent as bytes).
struct ResidentOperands {
  std::string a_handle;
  std::string b_handle;
  std::string c_in_handle;  // m×n of C's type (any, fp32 included: e.g. a C kept before)
  // C written in place into this matrix (m×n of C's type; not A's, B's or C_in's): the GEMM
  // runs on its device.
  std::string c_handle;
  bool keep_c = false;
};

class ResidentResolver {
 public:
  ResidentResolver(MatrixStore* store, const Scheduler* scheduler)
      : store_(store), scheduler_(scheduler) {}

  // Sets job->a_resident / b_resident / c_in_resident (and c_device for c_handle) from the
  // handles (marking them used), pins the job to their device and, for keep_c, reserves C's
  // bytes of `owner`'s quota in *c_quota and sets job->keep_c. Errors: NOT_FOUND (a handle; the
  // message names its field), INVALID_ARGUMENT (a matrix of the wrong shape or dtype; C's
  // matrix also an operand), FAILED_PRECONDITION (C's matrix on another device than A's or
  // B's), RESOURCE_EXHAUSTED (keep_c_resident: over the quota). On an error nothing stays reserved.
  // *transient_handles (when given) gets the handles of transient matrices among the operands.
  // REQUIRES: job->shape is validated.
  absl::Status Resolve(const std::string& owner, const ResidentOperands& operands, GemmJob* job,
                       QuotaReservation* c_quota,
                       std::vector<std::string>* transient_handles = nullptr) const;

  // The device the operands still to come of `job` are written to: its pinned device, else
  // (and from now on pinned there) the least loaded one.
  int PlaceArriving(GemmJob* job) const;

  // The C that a keep_c GEMM of `shape` left on the device (report.c_resident), added to the
  // store under the reservation Resolve made, with `ttl_seconds` (0: the store's default), or
  // as a transient matrix. REQUIRES: report.c_resident is set.
  ResidentMatrix KeepC(QuotaReservation c_quota, const GemmShape& shape, const GemmReport& report,
                       uint32_t ttl_seconds, bool transient = false) const;

 private:
  MatrixStore* const store_;
  const Scheduler* const scheduler_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_SESSION_RESIDENT_RESOLVER_H_
