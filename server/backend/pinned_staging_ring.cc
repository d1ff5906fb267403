#include "server/backend/pinned_staging_ring.h"

#include "server/backend/cuda_errors.h"

namespace hgemm {

std::string PinnedStagingRing::Init(int count, int64_t piece_bytes, cudaStream_t stream,
                                    int ordinal) {
  std::string error;
  for (int i = 0; i < count && error.empty(); ++i) {
    void* pinned = nullptr;
    cudaEvent_t free_event = nullptr;
    error = CheckCuda(cudaHostAlloc(&pinned, piece_bytes, cudaHostAllocDefault), ordinal,
                      "cudaHostAlloc");
    if (error.empty()) {
      error = CheckCuda(
          cudaEventCreateWithFlags(&free_event, cudaEventDisableTiming | cudaEventBlockingSync),
          ordinal, "cudaEventCreate");
    }
    pieces_.push_back(static_cast<char*>(pinned));
    free_events_.push_back(free_event);
    if (error.empty())
      error = CheckCuda(cudaEventRecord(free_event, stream), ordinal, "cudaEventRecord");
  }
  return error;
}

PinnedStagingRing::~PinnedStagingRing() {
  for (char* p : pieces_) {
    if (p != nullptr) cudaFreeHost(p);
  }
  for (cudaEvent_t e : free_events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

}  // namespace hgemm
