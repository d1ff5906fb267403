// cuda_ipc_load: GEMMs whose A, B and C live in this process's GPU memory, shared with a
// same-host hgemm_server by CUDA IPC, for bench/dataplane.sh's same-host table; and
// the pinned cudaMemcpy bandwidth the other paths are held against.
//   cuda_ipc_load --server=unix:/run/hgemm/hgemm.sock --shape=2048x2048x2048 --concurrency=1
//   cuda_ipc_load --server=unix:/run/hgemm/hgemm.sock --shape=8192x8192x8192 --transport=ring
//   cuda_ipc_load --memcpy --shape=8192x8192x8192
// Each worker cudaMallocs its own A | B | C, registers it once (RegisterRegion with cuda_ipc)
// and sends unary Gemm calls naming its regions for --seconds (--transport=ring: through a
// submission ring of its own, gRPC out of each GEMM's path); worker 0's first C is checked by
// Freivalds' test. Prints one line per run (cuda_ipc_ring with the ring):
//   cuda_ipc SHAPE CONC req/s P50_MS P99_MS KERNEL_P50_MS ERRORS
//   pinned_memcpy SHAPE H2D_GBPS D2H_GBPS H2D_AB_MS D2H_C_MS
#include <cuda_runtime.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/soak.h"
#include "client/gemm_client.h"
#include "client/gemm_dims.h"
#include "client/ring_client.h"
#include "proto/numerics/cpu_gemm.h"

namespace {

using Clock = std::chrono::steady_clock;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

std::string PciBusId(int device) {
  char bus_id[32] = {};
  Check(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device), "cudaDeviceGetPCIBusId");
  return bus_id;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

// Pinned host ↔ device bandwidth with A + B up and C down, the median of `repeat` copies each.
void MeasureMemcpy(const hgemm::GemmDims& dims, int repeat, const std::string& shape) {
  const size_t up = size_t(dims.ABytes() + dims.BBytes()), down = size_t(dims.CBytes());
  void *host = nullptr, *device = nullptr;
  Check(cudaMallocHost(&host, std::max(up, down)), "cudaMallocHost");
  Check(cudaMalloc(&device, std::max(up, down)), "cudaMalloc");
  std::memset(host, 0x3c, std::max(up, down));
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  auto time = [&](void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    std::vector<double> ms;
    for (int i = 0; i < repeat + 1; ++i) {  // the first is a warm-up
      Check(cudaEventRecord(start), "cudaEventRecord");
      Check(cudaMemcpyAsync(dst, src, bytes, kind), "cudaMemcpyAsync");
      Check(cudaEventRecord(stop), "cudaEventRecord");
      Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float t = 0;
      Check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      if (i > 0) ms.push_back(t);
    }
    return Percentile(ms, 0.5);
  };
  const double h2d_ms = time(device, host, up, cudaMemcpyHostToDevice);
  const double d2h_ms = time(host, device, down, cudaMemcpyDeviceToHost);
  std::printf("pinned_memcpy %s %.1f %.1f %.3f %.3f\n", shape.c_str(), double(up) / h2d_ms / 1e6,
              double(down) / d2h_ms / 1e6, h2d_ms, d2h_ms);
  Check(cudaEventDestroy(start), "cudaEventDestroy");
  Check(cudaEventDestroy(stop), "cudaEventDestroy");
  Check(cudaFree(device), "cudaFree");
  Check(cudaFreeHost(host), "cudaFreeHost");
}

struct WorkerResult {
  std::vector<double> latency_ms, kernel_ms;
  int errors = 0;
  std::string first_error;
  double check_error = -1;  // Freivalds' estimate of worker 0's first C (-1: not checked)
};

// `ring_over` (not null): the GEMMs go through a ring attached over that client. GEMMs for
// `run_s` from the end of this worker's setup (its random operands, registration and ring take
// seconds at 8192³; counted in, they made req/s a fraction of 1 / latency).
// `gap_bytes` between A, B and C in the one allocation: at 8192³ they sit 128 MiB apart without
// it, and the kernel on this memory timed 1.53-1.64 ms against 1.43 on the server's own (H200;
// H100 1.57 / 1.45): a gap tells whether the power-of-two offsets are why.
void RunWorker(int index, const hgemm::GemmDims& dims, hgemm::v1::GemmService::Stub* stub,
               const hgemm::GemmClient* ring_over, int device, double run_s, size_t gap_bytes,
               bool verify, WorkerResult* result) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  std::mt19937_64 rng(1000 + index);
  const std::vector<uint16_t> a = hgemm::RandomHalfMatrix(int64_t(dims.m) * dims.k, rng);
  const std::vector<uint16_t> b = hgemm::RandomHalfMatrix(int64_t(dims.k) * dims.n, rng);
  const size_t a_bytes = size_t(dims.ABytes()), b_bytes = size_t(dims.BBytes());
  const size_t c_bytes = size_t(dims.CBytes());
  // Parts at 256-byte boundaries (the server takes region offsets that are multiples of 16).
  auto aligned = [](size_t at) { return (at + 255) / 256 * 256; };
  const size_t b_offset = aligned(a_bytes + gap_bytes);
  const size_t c_offset = aligned(b_offset + b_bytes + gap_bytes);
  const size_t bytes = c_offset + c_bytes;
  char* memory = nullptr;
  Check(cudaMalloc(&memory, bytes), "cudaMalloc");
  Check(cudaMemcpy(memory, a.data(), a_bytes, cudaMemcpyHostToDevice), "cudaMemcpy A");
  Check(cudaMemcpy(memory + b_offset, b.data(), b_bytes, cudaMemcpyHostToDevice), "cudaMemcpy B");
  Check(cudaMemset(memory + c_offset, 0xFF, c_bytes), "cudaMemset C");
  cudaIpcMemHandle_t handle;
  Check(cudaIpcGetMemHandle(&handle, memory), "cudaIpcGetMemHandle");

  hgemm::v1::RegisterRegionRequest registration;
  registration.set_byte_size(bytes);
  registration.set_label("cuda_ipc_load");
  registration.mutable_cuda_ipc()->set_handle(reinterpret_cast<const char*>(&handle),
                                              sizeof(handle));
  registration.mutable_cuda_ipc()->set_device(PciBusId(device));
  hgemm::v1::RegionInfo info;
  {
    grpc::ClientContext context;
    if (grpc::Status s = stub->RegisterRegion(&context, registration, &info); !s.ok()) {
      result->errors = 1;
      result->first_error = "RegisterRegion: " + s.error_message();
      Check(cudaFree(memory), "cudaFree");
      return;
    }
  }
  hgemm::v1::GemmRequest request;
  request.set_m(dims.m);
  request.set_n(dims.n);
  request.set_k(dims.k);
  auto set = [&](hgemm::v1::RegionRef* ref, size_t offset) {
    ref->set_region(info.region());
    ref->set_offset(offset);
  };
  set(request.mutable_a_region(), 0);
  set(request.mutable_b_region(), b_offset);
  set(request.mutable_c_region(), c_offset);
  std::unique_ptr<hgemm::RingClient> ring;
  hgemm::RingSubmission entry;
  if (ring_over != nullptr) {
    grpc::Status s;
    ring = hgemm::RingClient::Attach(*ring_over, {info.region()}, {}, {}, &s);
    if (ring) s = ring->ToSubmission(request, "", std::chrono::microseconds(0), &entry);
    if (!s.ok()) {
      result->errors = 1;
      result->first_error = "ring: " + s.error_message();
      run_s = 0;  // no GEMMs; the region is unregistered below
    }
  }
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(run_s));
  bool first = true;
  while (Clock::now() < until) {
    grpc::Status s;
    double kernel_ms = 0;
    const auto start = Clock::now();
    if (ring) {
      hgemm::RingCompletion done{};
      s = ring->Gemm(entry, &done);
      kernel_ms = done.kernel_ms;
    } else {
      grpc::ClientContext context;
      hgemm::v1::GemmResponse response;
      s = stub->Gemm(&context, request, &response);
      kernel_ms = response.timing().kernel_ms();
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (!s.ok()) {
      if (result->errors++ == 0) result->first_error = s.error_message();
      continue;
    }
    result->latency_ms.push_back(ms);
    result->kernel_ms.push_back(kernel_ms);
    if (first && verify) {
      std::vector<uint16_t> c(size_t(dims.m) * dims.n);
      Check(cudaMemcpy(c.data(), memory + c_offset, c_bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy C");
      result->check_error =
          hgemm::bench::FreivaldsError(a.data(), b.data(), c.data(), dims.m, dims.n, dims.k, 4, 7);
    }
    first = false;
  }
  ring.reset();  // detached before its region goes
  grpc::ClientContext context;
  hgemm::v1::UnregisterRegionRequest unregister;
  unregister.set_region(info.region());
  hgemm::v1::UnregisterRegionResponse freed;
  (void)stub->UnregisterRegion(&context, unregister, &freed);
  Check(cudaFree(memory), "cudaFree");
}

}  // namespace

int main(int argc, char** argv) {
  std::string server = "unix:/run/hgemm/hgemm.sock", shape = "2048x2048x2048", transport = "grpc";
  int concurrency = 1, device = 0, repeat = 10;
  double seconds = 5, warmup_s = 1;
  size_t gap_bytes = 0;
  bool memcpy_only = false, verify = true;
  CLI::App app{"cuda_ipc_load: GEMMs on this process's GPU memory, shared by CUDA IPC"};
  app.add_option("--server", server, "the server's Unix socket (unix:PATH)")->capture_default_str();
  app.add_option("--shape", shape, "MxNxK (fp16)")->capture_default_str();
  app.add_option("--concurrency", concurrency, "workers, each with its own A, B, C")
      ->capture_default_str();
  app.add_option("--device", device, "CUDA device of the memory")->capture_default_str();
  app.add_option("--seconds", seconds, "measured time")->capture_default_str();
  app.add_option("--warmup_s", warmup_s, "GEMMs before measuring")->capture_default_str();
  app.add_option("--verify", verify, "check worker 0's first C (Freivalds)")->capture_default_str();
  app.add_option("--transport", transport, "grpc (unary Gemm calls) or ring")
      ->check(CLI::IsMember({"grpc", "ring"}))
      ->capture_default_str();
  app.add_option("--gap_bytes", gap_bytes, "bytes left between A, B and C (a multiple of 256)")
      ->capture_default_str();
  app.add_flag("--memcpy", memcpy_only, "measure pinned cudaMemcpy bandwidth instead");
  app.add_option("--repeat", repeat, "copies per direction for --memcpy")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (gap_bytes % 256 != 0) {
    std::fprintf(stderr, "cuda_ipc_load: --gap_bytes must be a multiple of 256\n");
    return 2;
  }
  hgemm::GemmDims dims;
  if (std::string e = hgemm::ParseGemmDims(shape, &dims); !e.empty()) {
    std::fprintf(stderr, "cuda_ipc_load: --shape: %s\n", e.c_str());
    return 2;
  }
  try {
    Check(cudaSetDevice(device), "cudaSetDevice");
    if (memcpy_only) {
      MeasureMemcpy(dims, repeat, shape);
      return 0;
    }
    auto channel = hgemm::Connect(server);
    auto stub = hgemm::v1::GemmService::NewStub(channel);
    const hgemm::GemmClient client(channel);
    const hgemm::GemmClient* ring_over = transport == "ring" ? &client : nullptr;
    auto run = [&](double run_s, bool check, std::vector<WorkerResult>* results) {
      results->assign(concurrency, {});
      std::vector<std::thread> workers;
      for (int i = 0; i < concurrency; ++i) {
        workers.emplace_back([&, i] {
          try {
            RunWorker(i, dims, stub.get(), ring_over, device, run_s, gap_bytes, check && i == 0,
                      &(*results)[i]);
          } catch (const std::exception& e) {
            (*results)[i].errors++;
            (*results)[i].first_error = e.what();
          }
        });
      }
      for (std::thread& t : workers) t.join();
    };
    std::vector<WorkerResult> results;
    if (warmup_s > 0) run(warmup_s, verify, &results);
    const double check_error = results.empty() ? -1 : results[0].check_error;
    run(seconds, false, &results);
    std::vector<double> latency, kernel;
    int errors = 0;
    std::string first_error;
    for (const WorkerResult& r : results) {
      latency.insert(latency.end(), r.latency_ms.begin(), r.latency_ms.end());
      kernel.insert(kernel.end(), r.kernel_ms.begin(), r.kernel_ms.end());
      if (errors == 0 && r.errors > 0) first_error = r.first_error;
      errors += r.errors;
    }
    std::printf("%s %s %d %.1f %.3f %.3f %.3f %d\n",
                transport == "ring" ? "cuda_ipc_ring" : "cuda_ipc", shape.c_str(), concurrency,
                double(latency.size()) / seconds, Percentile(latency, 0.5),
                Percentile(latency, 0.99), Percentile(kernel, 0.5), errors);
    if (check_error >= 0)
      std::fprintf(stderr, "cuda_ipc_load: first C's error %.2e\n", check_error);
    if (errors > 0)
      std::fprintf(stderr, "cuda_ipc_load: %d errors, first: %s\n", errors, first_error.c_str());
    // A wrong C is a failure of the run, not a slow one.
    return errors > 0 || check_error > 1e-2 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_ipc_load: %s\n", e.what());
    return 1;
  }
}
