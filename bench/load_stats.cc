#include "bench/load_stats.h"

#include <algorithm>

#include "bench/stats.h"

namespace hgemm::bench {

PointStats Summarize(const std::vector<Sample>& samples, int shape, double seconds,
                     const std::vector<Shape>& shapes, Target kind, Resident resident) {
  PointStats st;
  st.shape = shape >= 0 ? shapes[shape].Name() : shapes.size() == 1 ? shapes[0].Name() : "mix";
  st.seconds = seconds;
  std::vector<double> latencies;
  double flops = 0, bytes = 0, sum = 0;
  for (const Sample& s : samples) {
    if (shape >= 0 && s.shape != shape) continue;
    if (s.code != 0) {
      ++st.errors;
      continue;
    }
    latencies.push_back(s.latency_ms);
    sum += s.latency_ms;
    bytes +=
        double(SentBytes(shapes[s.shape], resident) + ReceivedBytes(shapes[s.shape], resident));
    if (kind != Target::kService) continue;
    flops += shapes[s.shape].Flops();
    ServerBreakdown& b = st.server;
    ++b.count;
    b.queue_ms += s.queue_ms;
    b.h2d_ms += s.h2d_ms;
    b.kernel_ms += s.kernel_ms;
    b.d2h_ms += s.d2h_ms;
    b.total_ms += s.total_ms;
    b.verify_ms += s.verify_ms;
    b.batch_size += s.batch_size;
  }
  st.requests = int64_t(latencies.size());
  if (st.requests == 0) return st;
  ServerBreakdown& b = st.server;
  if (b.count > 0) {
    for (double* v : {&b.queue_ms, &b.h2d_ms, &b.kernel_ms, &b.d2h_ms, &b.total_ms, &b.verify_ms,
                      &b.batch_size}) {
      *v /= b.count;
    }
  }
  std::sort(latencies.begin(), latencies.end());
  st.p50_ms = Percentile(latencies, 50);
  st.p90_ms = Percentile(latencies, 90);
  st.p99_ms = Percentile(latencies, 99);
  st.min_ms = latencies.front();
  st.max_ms = latencies.back();
  st.mean_ms = sum / st.requests;
  if (seconds > 0) {
    st.requests_per_s = st.requests / seconds;
    st.gflops = flops / seconds / 1e9;
    st.payload_gb_per_s = bytes / seconds / 1e9;
  }
  return st;
}

}  // namespace hgemm::bench
