// The random vectors of Freivalds' check (freivalds.h): element j of vector `seed` is a
// standard Gaussian drawn from a counter-based hash of (seed, j): the CUDA backend's check
// kernels draw r where they use it (nothing to copy to the device), any element on its own, and
// the host draws the same vector (up to the last bits of logf and cosf).
//
// Plain C++17 with no includes beyond <cmath>/<cstdint>, compiled by nvcc and host compilers.
// Thread safety: pure functions.
#ifndef HGEMM_SERVER_VERIFY_RANDOM_VECTOR_H_
#define HGEMM_SERVER_VERIFY_RANDOM_VECTOR_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define HGEMM_HOST_DEVICE __host__ __device__
#else
#define HGEMM_HOST_DEVICE
#endif

namespace hgemm::verify {

// splitmix64's finaliser: a bijection of 64-bit words whose outputs pass BigCrush for
// consecutive inputs, which is what a counter-based draw needs.
HGEMM_HOST_DEVICE inline uint64_t Mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element j of the Gaussian vector `seed` (Box-Muller on two 24-bit uniforms of one hash; the
// first uniform is in (0, 1], so the logarithm is finite: |r_j| < 5.8).
HGEMM_HOST_DEVICE inline float GaussianAt(uint64_t seed, int64_t j) {
  const uint64_t bits = Mix64(seed ^ Mix64(uint64_t(j)));
  const float u1 = float((bits >> 40) + 1) * (1.0f / 16777216.0f);
  const float u2 = float((bits >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647f * u2);
}

}  // namespace hgemm::verify

#endif  // HGEMM_SERVER_VERIFY_RANDOM_VECTOR_H_
