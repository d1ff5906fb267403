// verify_overhead: what Freivalds' check (GemmOptions.verify, docs/verification.md) costs a
// GEMM. Runs square fp16 GEMMs through the server's scheduler and backend in process (no
// transport), verify off and on, with B sent each time or resident (its op(B)·r then kept with
// it), and prints a table of medians and the same as CSV.
//
//   bazel build -c opt //bench:verify_overhead
//   bazel-bin/bench/verify_overhead --sizes 4096,8192 --csv verify_overhead.csv
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/backend/backend_factory.h"
#include "server/scheduler/scheduler.h"
#include "server/testing/run_job.h"

namespace {

using hgemm::GemmJob;
using hgemm::GemmReport;

struct Row {
  int64_t size = 0;
  bool b_resident = false;
  bool verify = false;
  double kernel_ms = 0, verify_ms = 0, server_ms = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs `job` `warmup` + `repeat` times; the medians of the last `repeat`.
bool Measure(hgemm::Scheduler& scheduler, const GemmJob& job, int warmup, int repeat, Row* row) {
  std::vector<double> kernel, verify, server;
  for (int i = 0; i < warmup + repeat; ++i) {
    const auto [status, report] = hgemm::RunJob(scheduler, job);
    if (!status.ok()) {
      spdlog::error("GEMM failed: {}", status.ToString());
      return false;
    }
    if (job.verify && report.verified_repetitions == 0) {
      spdlog::error("verify on but C was not checked");
      return false;
    }
    if (i < warmup) continue;
    kernel.push_back(report.kernel_ms);
    verify.push_back(report.verify_ms);
    server.push_back(report.server_total_ms);
  }
  row->kernel_ms = Median(kernel);
  row->verify_ms = Median(verify);
  row->server_ms = Median(server);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend_kind = "auto", csv_path;
  std::vector<int64_t> sizes = {4096, 8192};
  int warmup = 3, repeat = 20, repetitions = 1;
  CLI::App app{"verify_overhead: the cost of the Freivalds check of GEMMs, verify off vs on"};
  app.add_option("--backend", backend_kind, "auto, cuda or cpu")->capture_default_str();
  app.add_option("--sizes", sizes, "square sizes m = n = k")->delimiter(',')->capture_default_str();
  app.add_option("--warmup", warmup, "runs not measured, per point")->capture_default_str();
  app.add_option("--repeat", repeat, "measured runs per point")->capture_default_str();
  app.add_option("--repetitions", repetitions, "repetitions of the check (fresh vectors)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--csv", csv_path, "also write the rows to this CSV file");
  CLI11_PARSE(app, argc, argv);

  std::string error;
  std::unique_ptr<hgemm::Backend> backend = hgemm::CreateBackend({.kind = backend_kind}, &error);
  if (!backend) {
    spdlog::critical("no backend: {}", error);
    return 1;
  }
  hgemm::Scheduler scheduler(backend.get(), {});
  const std::string device = backend->Devices().front().name;
  std::mt19937_64 rng(1);
  std::vector<Row> rows;
  for (int64_t size : sizes) {
    const std::vector<uint16_t> a = hgemm::RandomHalfMatrix(size * size, rng);
    const std::vector<uint16_t> b = hgemm::RandomHalfMatrix(size * size, rng);
    std::vector<uint16_t> c(size * size);
    std::shared_ptr<hgemm::ResidentBuffer> b_resident;
    if (absl::Status s = backend->AllocateResident(0, 2 * size * size, &b_resident);
        !s.ok() || !(s = backend->WriteResident(*b_resident, 0, b.data(), 2 * size * size)).ok()) {
      spdlog::critical("resident B: {}", s.ToString());
      return 1;
    }
    for (bool resident : {false, true}) {
      for (bool verify : {false, true}) {
        GemmJob job;
        job.shape = {.m = size, .n = size, .k = size};
        job.a = a.data();
        job.c = c.data();
        if (resident) {
          job.b_resident = b_resident;
          job.device_index = 0;
        } else {
          job.b = b.data();
        }
        job.verify = verify;
        job.verify_repetitions = repetitions;
        Row row{.size = size, .b_resident = resident, .verify = verify};
        if (!Measure(scheduler, job, warmup, repeat, &row)) return 1;
        rows.push_back(row);
      }
    }
  }

  std::printf(
      "verify overhead on %s (%s backend), fp16 NN, %d repetition(s) of the check, "
      "medians of %d runs\n",
      device.c_str(), backend->Name().c_str(), repetitions, repeat);
  std::printf("%6s %10s %6s %10s %10s %10s %12s %12s\n", "size", "b_resident", "verify",
              "kernel_ms", "verify_ms", "server_ms", "verify/kern", "server_cost");
  std::string csv =
      "device,backend,size,b_resident,verify,repetitions,kernel_ms,verify_ms,server_ms,"
      "verify_over_kernel,server_overhead\n";
  for (const Row& r : rows) {
    // The same point with verify off: what the check adds to the server's time.
    const auto off = std::find_if(rows.begin(), rows.end(), [&](const Row& o) {
      return o.size == r.size && o.b_resident == r.b_resident && !o.verify;
    });
    const double overhead = off->server_ms > 0 ? r.server_ms / off->server_ms - 1 : 0;
    // Kernel + check with it on against the kernel with it off: the passes that run beside
    // the GEMM cost it what they take from its kernel_ms.
    const double ratio = off->kernel_ms > 0 ? (r.kernel_ms + r.verify_ms) / off->kernel_ms - 1 : 0;
    std::printf("%6lld %10s %6s %10.3f %10.3f %10.3f %11.1f%% %11.1f%%\n", (long long)r.size,
                r.b_resident ? "yes" : "no", r.verify ? "on" : "off", r.kernel_ms, r.verify_ms,
                r.server_ms, 100 * ratio, 100 * overhead);
    csv += fmt::format("\"{}\",{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}\n", device,
                       backend->Name(), r.size, r.b_resident ? 1 : 0, r.verify ? 1 : 0, repetitions,
                       r.kernel_ms, r.verify_ms, r.server_ms, ratio, overhead);
  }
  std::printf("\n%s", csv.c_str());
  if (!csv_path.empty()) std::ofstream(csv_path) << csv;
  return 0;
}
