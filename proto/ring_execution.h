// RingExecution: what ran a GEMM of a submission ring, as GemmResponse.execution says it of a
// Gemm call: a completion's kernel index and device id (proto/ring_layout.h) resolved through
// the RingAttached its ring was attached with. Shared by the clients and the server's tests.
// Thread safety: a pure function.
#ifndef HGEMM_PROTO_RING_EXECUTION_H_
#define HGEMM_PROTO_RING_EXECUTION_H_

#include "proto/hgemm.pb.h"
#include "proto/ring_layout.h"

namespace hgemm {

// The ring's enum numbers are the wire's (proto/ring_layout.h says so).
static_assert(kRingDataTypeUnspecified == v1::DATA_TYPE_UNSPECIFIED &&
              kRingDataTypeFp16 == v1::DATA_TYPE_FP16 && kRingDataTypeBf16 == v1::DATA_TYPE_BF16 &&
              kRingDataTypeFp32 == v1::DATA_TYPE_FP32);
static_assert(kRingAccumulationUnspecified == v1::ACCUMULATION_UNSPECIFIED &&
              kRingAccumulationFp16 == v1::ACCUMULATION_FP16 &&
              kRingAccumulationFp32 == v1::ACCUMULATION_FP32);

// Fills *execution from `completion` and returns true; false, leaving *execution as it was,
// when the completion carries no execution (not OK, or from a server that predates
// kRingCompletionExecution). A kernel index or device id that `attached` does not name leaves
// that name empty.
inline bool RingExecution(const RingCompletion& completion, const v1::RingAttached& attached,
                          v1::Execution* execution) {
  if (completion.code != 0 || (completion.flags & kRingCompletionExecution) == 0) return false;
  execution->Clear();
  if (completion.kernel > 0 && completion.kernel <= attached.kernels_size()) {
    execution->set_kernel(attached.kernels(completion.kernel - 1));
  }
  execution->set_accumulation(v1::Accumulation_IsValid(completion.accumulation)
                                  ? v1::Accumulation(completion.accumulation)
                                  : v1::ACCUMULATION_UNSPECIFIED);
  execution->set_backend(attached.backend());
  execution->set_device_id(completion.device_id);
  for (const v1::Device& device : attached.devices()) {
    if (device.id() == completion.device_id) execution->set_device_name(device.name());
  }
  execution->set_stream_id(completion.stream_id);
  return true;
}

}  // namespace hgemm

#endif  // HGEMM_PROTO_RING_EXECUTION_H_
