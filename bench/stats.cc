#include "bench/stats.h"

#include <cmath>
#include <cstddef>

namespace hgemm::bench {

double Percentile(const std::vector<double>& sorted, double p) {
  const double rank = std::ceil(p / 100.0 * sorted.size());
  const size_t index = std::clamp<size_t>(rank < 1 ? 0 : size_t(rank) - 1, 0, sorted.size() - 1);
  return sorted[index];
}

}  // namespace hgemm::bench
