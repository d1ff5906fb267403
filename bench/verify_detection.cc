// verify_detection: how often Freivalds' check (GemmOptions.verify, docs/verification.md)
// catches a damaged C on the GPU, against what its bound promises. Each trial runs one verified
// fp16 GEMM whose C is damaged at the kernel's output (the fault-injection build's
// FaultInjector::ArmCorruptOutput) by one fault of server/testing/c_faults.h at a random
// element: the damaged row is made on the host from the reference C and copied over the
// GEMM's row on its stream, before the check reads it. A trial counts as detected when the
// scheduler reran the GEMM (suspect_device_id set); the rerun's C must pass its check (a
// failure there is a false alarm) and match the reference. --clean N adds N undamaged verified
// GEMMs: every failure among them is a false alarm too.
//
// Per fault it prints trials, detections and the detections the bound promises (the mean over
// trials of 1 − erf(√2·t_i/‖e‖)^R: docs/verification.md, "Detection probability"), and the
// trials far above the bound (‖e‖ ≥ 30·t_i or not finite), which one repetition catches with
// probability ≥ 0.95 and three with ≥ 0.9999.
//
//   bazel build -c opt //bench:verify_detection
//   bazel-bin/bench/verify_detection --trials 100000 --clean 100000
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"
#include "server/backend/fault_injector.h"
#include "server/scheduler/scheduler.h"
#include "server/testing/c_faults.h"
#include "server/testing/run_job.h"
#include "server/verify/freivalds.h"

namespace {

using hgemm::CFault;
using hgemm::GemmJob;
using hgemm::GemmReport;

// One set of operands with what the trials need of its reference: C (fp32, and rounded to
// fp16 as the GEMM writes it), each row's squared norm of A and B's squared norm
// (verify::Tolerance's inputs).
struct Operands {
  std::vector<uint16_t> a, b, c_ref;
  std::vector<float> c;
  std::vector<double> a_sq;
  double b_sq = 0;
};

Operands MakeOperands(int64_t m, int64_t n, int64_t k, std::mt19937_64& rng) {
  Operands o;
  o.a = hgemm::RandomHalfMatrix(m * k, rng);
  o.b = hgemm::RandomHalfMatrix(k * n, rng);
  o.c = hgemm::ReferenceGemm(o.a.data(), o.b.data(), m, n, k);
  o.c_ref.resize(o.c.size());
  hgemm::FloatToHalf(o.c.data(), o.c_ref.data(), o.c.size());
  for (uint16_t x : o.b) o.b_sq += double(hgemm::HalfToFloat(x)) * hgemm::HalfToFloat(x);
  for (int64_t i = 0; i < m; ++i) {
    double a_sq = 0;
    for (int64_t l = 0; l < k; ++l) {
      const double x = hgemm::HalfToFloat(o.a[i * k + l]);
      a_sq += x * x;
    }
    o.a_sq.push_back(a_sq);
  }
  return o;
}

struct Tally {
  int64_t trials = 0, detected = 0, far = 0, far_detected = 0, wrong_answers = 0;
  double promised = 0;  // sum over trials of the bound's detection probability
};

}  // namespace

int main(int argc, char** argv) {
  int64_t trials = 100000, clean = 0, m = 256, n = 256, k = 512;
  int repetitions = 1, operand_sets = 4;
  uint64_t seed = 1;
  std::string csv_path;
  CLI::App app{"verify_detection: Freivalds' check against damaged C on the GPU"};
  app.add_option("--trials", trials, "damaged GEMMs")->capture_default_str();
  app.add_option("--clean", clean, "undamaged verified GEMMs (false alarms)")
      ->capture_default_str();
  app.add_option("--m", m)->capture_default_str();
  app.add_option("--n", n)->capture_default_str();
  app.add_option("--k", k)->capture_default_str();
  app.add_option("--repetitions", repetitions, "repetitions of the check")
      ->check(CLI::Range(1, hgemm::verify::kMaxRepetitions))
      ->capture_default_str();
  app.add_option("--operand_sets", operand_sets, "operand sets the trials take turns on")
      ->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  app.add_option("--csv", csv_path, "also write the table to this CSV file");
  CLI11_PARSE(app, argc, argv);

  std::string error;
  std::unique_ptr<hgemm::Backend> backend =
      hgemm::MakeFaultInjectingCudaBackend({.devices = {0}, .streams_per_device = 2}, &error);
  if (!backend) {
    spdlog::critical("no CUDA backend: {}", error);
    return 1;
  }
  // Retiring the device after failures would end the run: every trial fails a check.
  hgemm::Scheduler scheduler(backend.get(), {.verify_failures_to_retire = 0});
  std::mt19937_64 rng(seed);
  std::vector<Operands> sets;
  for (int s = 0; s < operand_sets; ++s) sets.push_back(MakeOperands(m, n, k, rng));

  std::vector<uint16_t> c(m * n);
  auto job_for = [&](const Operands& o) {
    GemmJob job;
    job.shape = {.m = m, .n = n, .k = k};
    job.a = o.a.data();
    job.b = o.b.data();
    job.c = c.data();
    job.verify = true;
    job.verify_repetitions = repetitions;
    return job;
  };
  // The relative 2-norm error of row `row` of the answer against the reference.
  auto row_error = [&](const Operands& o, int64_t row) {
    return hgemm::RelativeFrobeniusError(&c[row * n], &o.c[row * n], n);
  };

  std::map<CFault, Tally> tallies;
  int64_t false_alarms = 0, clean_checks = 0, failed_runs = 0;
  std::uniform_int_distribution<int> pick_fault(0, std::size(hgemm::kAllCFaults) - 1);
  std::uniform_int_distribution<int64_t> pick_row(0, m - 1), pick_col(0, n - 1);
  std::vector<uint16_t> damaged(n);
  for (int64_t trial = 0; trial < trials; ++trial) {
    const Operands& o = sets[trial % sets.size()];
    const CFault fault = hgemm::kAllCFaults[pick_fault(rng)];
    const int64_t row = pick_row(rng), col = pick_col(rng);
    std::memcpy(damaged.data(), &o.c_ref[row * n], n * sizeof(uint16_t));
    hgemm::CorruptC(fault, hgemm::ElementType::kFp16, n, damaged.data(), 0, col);
    double e_sq = 0, c_sq = 0;
    for (int64_t j = 0; j < n; ++j) {
      c_sq += double(hgemm::HalfToFloat(damaged[j])) * hgemm::HalfToFloat(damaged[j]);
      const double d =
          double(hgemm::HalfToFloat(damaged[j])) - hgemm::HalfToFloat(o.c_ref[row * n + j]);
      e_sq += d * d;
    }
    // The bound the check applies: from the norms of the row it reads, the damaged one (so a
    // huge error raises its own bound by u_c·|e|, capping one repetition's detection of it).
    const hgemm::verify::Form form{.m = m, .n = n, .k = k};
    const double e = std::sqrt(e_sq),
                 t = hgemm::verify::Tolerance(form, o.a_sq[row], o.b_sq, c_sq, 0);
    Tally& tally = tallies[fault];
    ++tally.trials;
    const double miss_one = std::isfinite(e) ? std::erf(std::sqrt(2.0) * t / e) : 0;
    tally.promised += 1 - std::pow(miss_one, repetitions);
    const bool far = !std::isfinite(e) || e >= 30 * t;
    tally.far += far;

    cudaError_t copy_error = cudaSuccess;
    hgemm::FaultInjector::Global().ArmCorruptOutput(
        [&](cudaStream_t stream, void* d_c, int64_t) {
          copy_error =
              cudaMemcpyAsync(static_cast<char*>(d_c) + row * n * sizeof(uint16_t), damaged.data(),
                              n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream);
        },
        1);
    const hgemm::JobAnswer answer = hgemm::RunJob(scheduler, job_for(o));
    hgemm::FaultInjector::Global().Reset();
    if (copy_error != cudaSuccess) {
      spdlog::critical("the damage's copy failed: {}", cudaGetErrorString(copy_error));
      return 1;
    }
    if (answer.status.code() == absl::StatusCode::kDataLoss) {
      ++false_alarms;  // the rerun, undamaged, failed its check
      ++clean_checks;
      continue;
    }
    if (!answer.status.ok()) {
      ++failed_runs;
      spdlog::error("trial {}: {}", trial, answer.status.ToString());
      continue;
    }
    if (answer.report.suspect_device_id.has_value()) {
      ++tally.detected;
      tally.far_detected += far;
      ++clean_checks;
      if (row_error(o, row) > 1e-2) ++tally.wrong_answers;
    }
  }
  for (int64_t i = 0; i < clean; ++i) {
    const hgemm::JobAnswer answer = hgemm::RunJob(scheduler, job_for(sets[i % sets.size()]));
    ++clean_checks;
    if (answer.status.code() == absl::StatusCode::kDataLoss ||
        answer.report.suspect_device_id.has_value()) {
      ++false_alarms;
    } else if (!answer.status.ok()) {
      ++failed_runs;
      spdlog::error("clean GEMM {}: {}", i, answer.status.ToString());
    }
  }

  std::printf(
      "Freivalds' check on %s: %lldx%lldx%lld fp16, %d repetition(s), %lld damaged "
      "GEMMs\n",
      backend->Devices().front().name.c_str(), (long long)m, (long long)n, (long long)k,
      repetitions, (long long)trials);
  std::printf("%-14s %8s %9s %9s %10s %8s %9s %7s\n", "fault", "trials", "detected", "rate",
              "promised", "far", "far_det", "wrong");
  std::string csv = "fault,trials,detected,promised_rate,far,far_detected,wrong_answers\n";
  for (const auto& [fault, tally] : tallies) {
    const double rate = tally.trials ? double(tally.detected) / tally.trials : 0;
    const double promised = tally.trials ? tally.promised / tally.trials : 0;
    std::printf("%-14s %8lld %9lld %8.2f%% %9.2f%% %8lld %9lld %7lld\n",
                hgemm::CFaultName(fault).c_str(), (long long)tally.trials,
                (long long)tally.detected, 100 * rate, 100 * promised, (long long)tally.far,
                (long long)tally.far_detected, (long long)tally.wrong_answers);
    csv +=
        fmt::format("{},{},{},{:.4f},{},{},{}\n", hgemm::CFaultName(fault), tally.trials,
                    tally.detected, promised, tally.far, tally.far_detected, tally.wrong_answers);
  }
  std::printf("false alarms: %lld in %lld checks of undamaged C; runs failed otherwise: %lld\n",
              (long long)false_alarms, (long long)clean_checks, (long long)failed_runs);
  if (!csv_path.empty()) std::ofstream(csv_path) << csv;
  return failed_runs == 0 ? 0 : 1;
}
