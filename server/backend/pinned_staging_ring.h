// PinnedStagingRing: the pinned host buffers ("pieces") through which one slot stages operands
// to the device and results back, piece by piece, so that host copies overlap the DMA. Each
// piece has an event recorded after the last copy that used it: the piece may be reused once
// it has fired. Owns the pieces and events and frees them on destruction.
// Thread safety: none; it belongs to one slot, used by one scheduler worker at a time.
#ifndef HGEMM_SERVER_BACKEND_PINNED_STAGING_RING_H_
#define HGEMM_SERVER_BACKEND_PINNED_STAGING_RING_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hgemm {

class PinnedStagingRing {
 public:
  PinnedStagingRing() = default;
  // REQUIRES: no copy through it is in flight (its stream is synchronized).
  ~PinnedStagingRing();
  PinnedStagingRing(const PinnedStagingRing&) = delete;
  PinnedStagingRing& operator=(const PinnedStagingRing&) = delete;

  // Allocates `count` pieces of `piece_bytes` on the current device with their events, each
  // recorded on `stream` (so every piece starts free). Returns "" or the first failure
  // (naming device `ordinal`); what was allocated is freed by the destructor.
  std::string Init(int count, int64_t piece_bytes, cudaStream_t stream, int ordinal);

  size_t size() const { return pieces_.size(); }
  char* piece(size_t r) const { return pieces_[r]; }
  cudaEvent_t free_event(size_t r) const { return free_events_[r]; }

  // The piece the next copy starts at (taken modulo size()); the copies advance it.
  size_t next = 0;

 private:
  std::vector<char*> pieces_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_BACKEND_PINNED_STAGING_RING_H_
