// Order statistics of measured samples, shared by the benchmarks (hgemm_load, kernel_bench,
// completion_latency).
// Thread safety: pure functions.
#ifndef HGEMM_BENCH_STATS_H_
#define HGEMM_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace hgemm::bench {

// Percentile (0 < p ≤ 100) by nearest rank. REQUIRES: `sorted` ascending, non-empty.
double Percentile(const std::vector<double>& sorted, double p);

// The median of `values` (the upper one of an even count: a value that was measured).
// REQUIRES: `values` non-empty.
template <typename T>
T Median(std::vector<T> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_STATS_H_
