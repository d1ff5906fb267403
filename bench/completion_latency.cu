// How long after a GPU kernel ends does the host thread that waits for it run again? And what
// do cudaMalloc/cudaFree of a result buffer cost? Both sit on the path of every resident GEMM,
// whose client-visible time is meant to stay within 0.3 ms of its kernel.
//
// For each way of waiting, a kernel that runs a fixed time (globaltimer) is launched and waited
// for; overhead = host launch→wake time − kernel time (events). Medians over many runs.
//   completion_latency [--kernel_us=400] [--runs=200]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "bench/stats.h"
#include "kernels/cuda_check.h"

namespace {

using hgemm::bench::Median;
using hgemm::bench::Percentile;

__global__ void SpinFor(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct HostSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

void CUDART_CB Signal(void* data) {
  auto* s = static_cast<HostSignal*>(data);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->done = true;
  }
  s->cv.notify_one();
}

}  // namespace

int main(int argc, char** argv) {
  int kernel_us = 400, runs = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--kernel_us=", 12) == 0) kernel_us = std::atoi(argv[i] + 12);
    if (std::strncmp(argv[i], "--runs=", 7) == 0) runs = std::atoi(argv[i] + 7);
  }
  HGEMM_CHECK_CUDA(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));  // as the server sets it
  cudaStream_t stream;
  HGEMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop, blocking;
  HGEMM_CHECK_CUDA(cudaEventCreate(&start));
  HGEMM_CHECK_CUDA(cudaEventCreate(&stop));
  HGEMM_CHECK_CUDA(
      cudaEventCreateWithFlags(&blocking, cudaEventBlockingSync | cudaEventDisableTiming));
  cudaDeviceProp prop;
  HGEMM_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; kernel %d us; %d runs per row\n\n", prop.name, kernel_us, runs);

  struct Wait {
    const char* name;
    std::function<void()> wait;  // after the kernel and `stop` are enqueued
  };
  HostSignal signal;
  const std::vector<Wait> waits = {
      {"cudaEventSynchronize (blocking-sync event)",
       [&] {
         HGEMM_CHECK_CUDA(cudaEventRecord(blocking, stream));
         HGEMM_CHECK_CUDA(cudaEventSynchronize(blocking));
       }},
      {"cudaStreamSynchronize (device flag blocking sync)",
       [&] { HGEMM_CHECK_CUDA(cudaStreamSynchronize(stream)); }},
      {"cudaLaunchHostFunc + condition variable",
       [&] {
         signal.done = false;
         HGEMM_CHECK_CUDA(cudaLaunchHostFunc(stream, Signal, &signal));
         std::unique_lock<std::mutex> lock(signal.mu);
         signal.cv.wait(lock, [&] { return signal.done; });
       }},
      {"cudaEventQuery polling (busy wait, reference)",
       [&] {
         HGEMM_CHECK_CUDA(cudaEventRecord(blocking, stream));
         while (cudaEventQuery(blocking) == cudaErrorNotReady) {
         }
       }},
  };
  std::printf("%-52s %12s %12s %12s\n", "wait", "kernel_ms", "overhead_ms", "p90_ms");
  for (const Wait& w : waits) {
    std::vector<double> overhead, kernel;
    for (int r = 0; r < runs + 5; ++r) {
      const auto t0 = Clock::now();
      HGEMM_CHECK_CUDA(cudaEventRecord(start, stream));
      SpinFor<<<1, 1, 0, stream>>>(uint64_t(kernel_us) * 1000);
      HGEMM_CHECK_CUDA(cudaGetLastError());
      HGEMM_CHECK_CUDA(cudaEventRecord(stop, stream));
      w.wait();
      const double host_ms = Ms(Clock::now() - t0);
      HGEMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      float device_ms = 0;
      HGEMM_CHECK_CUDA(cudaEventElapsedTime(&device_ms, start, stop));
      if (r < 5) continue;  // warm-up
      kernel.push_back(device_ms);
      overhead.push_back(host_ms - device_ms);
    }
    std::sort(overhead.begin(), overhead.end());
    std::printf("%-52s %12.3f %12.3f %12.3f\n", w.name, Median(kernel), Median(overhead),
                Percentile(overhead, 90));
  }

  std::printf("\n%-52s %12s %12s\n", "allocation", "median_ms", "p90_ms");
  for (size_t mib : {32, 128}) {
    std::vector<double> malloc_ms, free_ms;
    for (int r = 0; r < 50; ++r) {
      void* p = nullptr;
      auto t0 = Clock::now();
      HGEMM_CHECK_CUDA(cudaMalloc(&p, mib << 20));
      auto t1 = Clock::now();
      HGEMM_CHECK_CUDA(cudaFree(p));
      auto t2 = Clock::now();
      malloc_ms.push_back(Ms(t1 - t0));
      free_ms.push_back(Ms(t2 - t1));
    }
    std::sort(malloc_ms.begin(), malloc_ms.end());
    std::sort(free_ms.begin(), free_ms.end());
    std::printf("cudaMalloc %4zu MiB %33s %12.3f %12.3f\n", mib, "", Median(malloc_ms),
                Percentile(malloc_ms, 90));
    std::printf("cudaFree   %4zu MiB %33s %12.3f %12.3f\n", mib, "", Median(free_ms),
                Percentile(free_ms, 90));
  }
  return 0;
}
