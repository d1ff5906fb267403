// hgemm_client: multiplies matrices on an hgemm-serve server and prints where the time went.
//
//   hgemm_client --server=127.0.0.1:50051 --shape=1024x1024x1024 --check
//   hgemm_client --a=a.npy --b=b.npy --out=c.npy
//   hgemm_client --shape=8192x8192x8192 --resident=all --repeat=20   # operands stay on the GPU
//   hgemm_client --info
//   hgemm_client --list --client_id=me              # this client's resident matrices
//   hgemm_client --release=HANDLE1,HANDLE2 --client_id=me
//   hgemm_client --server=ipv4:10.0.0.1:50051,10.0.0.2:50051 --resident=all --check  # replicas
//   hgemm_client --server=unix:/run/hgemm/hgemm.sock --transport=shm --shape=2048x2048x2048 --check
//   hgemm_client --server=unix:/run/hgemm/hgemm.sock --transport=ring --shape=256x256x256
//   --repeat=20 hgemm_client --shape=512x384x256 --dtype=bf16 --c_dtype=fp32 --alpha=0.5 --beta=-1
//   --check hgemm_client --shape=512x512x512 --batch=64 --check   # strided-batched, operands
//   packed hgemm_client --group=512x256x128,64x2048x1024,1x4096x4096 --check   # grouped: one call
// Random fp16 (or --dtype=bf16) inputs in [-1, 1) unless --a/--b give float16 .npy files;
// --transpose_a / --transpose_b send A stored k×m / B stored n×k (the files as stored too),
// --c_dtype=fp32 asks for an fp32 C, --alpha / --beta scale it (C = alpha·op(A)·op(B) +
// beta·C_in, with a random C_in of C's type when beta ≠ 0). Before allocating any operand,
// the shape is checked against the server's limits (GetServerInfo): a GEMM the server would
// refuse is refused here, naming the operand and the limit. Exits non-zero on any error,
// including a failed --check. Over several replicas, calls naming a handle go to the replica that
// holds it and the rest are balanced (see client/gemm_client.h); --resident uploads B, then A onto
// the replica that holds B, so that the GEMMs and their kept C stay there.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "client/cli.h"
#include "client/connect_flags.h"
#include "client/gemm_client.h"
#include "client/gemm_dims.h"
#include "client/npy.h"
#include "client/ring_client.h"
#include "client/shared_region.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/ring_execution.h"

namespace {

using hgemm::v1::GemmRequest;
using hgemm::v1::GemmResponse;

int Fail(const std::string& message) {
  std::fprintf(stderr, "hgemm_client: %s\n", message.c_str());
  return 1;
}

int Fail(const grpc::Status& status) {
  return Fail(fmt::format("{} (gRPC status {})", status.error_message(),
                          static_cast<int>(status.error_code())));
}

const char* AccumulationName(hgemm::v1::Accumulation a) {
  return a == hgemm::v1::ACCUMULATION_FP16 ? "fp16" : "fp32";
}

// What a result line says of the server's Freivalds check: "" when C was not checked.
std::string VerifiedNote(const hgemm::v1::Execution& e) {
  if (e.verified_repetitions() == 0) return "";
  std::string note = ", verified x" + std::to_string(e.verified_repetitions());
  if (e.has_suspect_device_id()) {
    note += " (a rerun: device " + std::to_string(e.suspect_device_id()) + " failed the check)";
  }
  return note;
}

void PrintServerInfo(const hgemm::GemmClient& client) {
  hgemm::v1::ServerInfo info;
  hgemm::v1::ListKernelsResponse kernels;
  if (grpc::Status s = client.GetServerInfo(&info); !s.ok()) return;
  std::printf("server %s, backend %s\n", info.version().c_str(), info.backend().c_str());
  if (!info.replica().empty()) std::printf("  replica %s\n", info.replica().c_str());
  for (const auto& d : info.devices()) {
    if (d.compute_capability().empty()) {
      std::printf("  %s: %d workers\n", d.name().c_str(), d.streams());
    } else {
      std::printf("  device %d: %s (cc %s), %llu MiB, %d streams\n", d.id(), d.name().c_str(),
                  d.compute_capability().c_str(),
                  static_cast<unsigned long long>(d.memory_bytes() >> 20), d.streams());
    }
  }
  const auto& l = info.limits();
  std::printf(
      "  limits: %llu elements/matrix, %llu queued GEMMs, %llu queued bytes, %llu bytes/message\n",
      (unsigned long long)l.max_elements_per_matrix(), (unsigned long long)l.max_queued_requests(),
      (unsigned long long)l.max_queued_bytes(), (unsigned long long)l.max_message_bytes());
  std::printf(
      "  resident: %llu bytes quota per client, TTL %s, LRU eviction %s\n",
      (unsigned long long)l.resident_quota_bytes(),
      l.resident_default_ttl_seconds() == 0
          ? "none (kept until released)"
          : fmt::format("{} s after the last use", l.resident_default_ttl_seconds()).c_str(),
      l.resident_lru_eviction() ? "on" : "off");
  if (client.ListKernels(&kernels).ok()) {
    std::printf("kernels:\n");
    for (const auto& k : kernels.kernels()) {
      std::printf("  %-34s %s\n", k.name().c_str(), k.description().c_str());
    }
  }
}

int ListResident(const hgemm::GemmClient& client, const hgemm::CallOptions& call) {
  hgemm::v1::ListMatricesResponse list;
  if (grpc::Status s = client.ListMatrices(&list, call); !s.ok()) return Fail(s);
  std::fputs(hgemm::cli::FormatMatrixList(list).c_str(), stdout);
  return 0;
}

// Releases every handle (all are tried); non-zero if any release failed.
int ReleaseResident(const hgemm::GemmClient& client, const hgemm::CallOptions& call,
                    const std::vector<std::string>& handles) {
  int failures = 0;
  for (const std::string& handle : handles) {
    uint64_t freed = 0;
    if (grpc::Status s = client.ReleaseMatrix(handle, call, &freed); !s.ok()) {
      Fail(fmt::format("release {}: {} (gRPC status {})", handle.substr(0, 40), s.error_message(),
                       static_cast<int>(s.error_code())));
      ++failures;
    } else {
      std::printf("released %s (%llu bytes)\n", handle.c_str(), (unsigned long long)freed);
    }
  }
  return failures == 0 ? 0 : 1;
}

// A grouped GEMM (--group): random operands of `form` per problem in one unary Gemm call,
// `repeat` times; --check compares each problem's C with its fp32 reference.
struct GroupRun {
  std::vector<hgemm::GemmDims> group;
  hgemm::GemmForm form;
  GemmRequest shared;  // what the problems share: form, scales, options
  uint64_t seed = 0;
  int repeat = 1;
  bool check = false;
  double tolerance = 0;  // 0: the service's tolerance for the form
};

int RunGroup(const hgemm::GemmClient& client, const hgemm::CallOptions& call, const GroupRun& run) {
  const GemmRequest& shared = run.shared;
  const int64_t c_element_bytes = run.form.c_fp32 ? 4 : 2;
  std::mt19937_64 rng(run.seed);
  std::vector<std::string> a, b, c_in;
  double flops = 0;
  for (const hgemm::GemmDims& d : run.group) {
    a.push_back(hgemm::HalfBytes(hgemm::RandomHalfMatrix(int64_t(d.m) * d.k, rng, run.form.bf16)));
    b.push_back(hgemm::HalfBytes(hgemm::RandomHalfMatrix(int64_t(d.k) * d.n, rng, run.form.bf16)));
    if (shared.beta() != 0) {
      const int64_t count = int64_t(d.m) * d.n;
      if (run.form.c_fp32) {
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        std::vector<float> values(count);
        for (float& v : values) v = uniform(rng);
        c_in.emplace_back(reinterpret_cast<const char*>(values.data()), 4 * values.size());
      } else {
        c_in.push_back(hgemm::HalfBytes(hgemm::RandomHalfMatrix(count, rng, run.form.bf16)));
      }
    }
    flops += d.Flops();
  }
  std::vector<hgemm::GroupedOperands> problems;
  for (size_t i = 0; i < run.group.size(); ++i) {
    const hgemm::GemmDims& d = run.group[i];
    problems.push_back(
        {.m = d.m,
         .n = d.n,
         .k = d.k,
         .a = a[i],
         .b = b[i],
         .c_in = shared.beta() != 0 ? std::string_view(c_in[i]) : std::string_view()});
  }
  std::printf("grouped GEMM of %zu problems (%.3g GFLOP) %s%s in one unary Gemm, kernel %s\n",
              run.group.size(), flops / 1e9, shared.transpose_a() ? "T" : "N",
              shared.transpose_b() ? "T" : "N", shared.options().kernel().c_str());
  std::printf("%5s %10s %10s %10s %10s %8s  %s\n", "run", "queue_ms", "kernel_ms", "verify_ms",
              "client_ms", "TFLOP/s", "kernel@device");
  std::vector<std::string> c;
  GemmResponse response;
  for (int i = 1; i <= run.repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (grpc::Status s = client.GemmGrouped(shared, problems, &c, &response, call); !s.ok()) {
      return Fail(s);
    }
    const double client_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const auto& t = response.timing();
    std::printf("%5d %10.3f %10.3f %10.3f %10.3f %8.2f  %s @ %s%s\n", i, t.queue_wait_ms(),
                t.kernel_ms(), t.verify_ms(), client_ms, t.tflops(),
                response.execution().kernel().c_str(), response.execution().device_name().c_str(),
                VerifiedNote(response.execution()).c_str());
  }
  if (!run.check) return 0;
  const double tolerance =
      run.tolerance > 0
          ? run.tolerance
          : hgemm::ServiceTolerance(
                response.execution().accumulation() == hgemm::v1::ACCUMULATION_FP16, run.form);
  double worst = 0;
  for (size_t i = 0; i < run.group.size(); ++i) {
    const hgemm::GemmDims& d = run.group[i];
    const std::vector<float> reference = hgemm::ReferenceGemm(
        reinterpret_cast<const uint16_t*>(a[i].data()),
        reinterpret_cast<const uint16_t*>(b[i].data()), d.m, d.n, d.k, run.form,
        {.alpha = shared.has_alpha() ? shared.alpha() : 1.0f,
         .beta = shared.beta(),
         .c_in = shared.beta() != 0 ? c_in[i].data() : nullptr});
    if (int64_t(c[i].size()) != c_element_bytes * int64_t(reference.size())) {
      return Fail(fmt::format("problem {}: C has {} bytes; expected {}", i, c[i].size(),
                              c_element_bytes * reference.size()));
    }
    const hgemm::ErrorStats stats =
        hgemm::CompareToReference(c[i].data(), reference.data(), reference.size(), run.form);
    const double error = stats.nan_count > 0 ? INFINITY : stats.rel_frobenius;
    if (!(error <= tolerance)) {
      std::printf(
          "check: problem %zu (%s): relative Frobenius error %.3e (tolerance %.0e): FAILED\n", i,
          d.Name().c_str(), error, tolerance);
      return 1;
    }
    worst = std::max(worst, error);
  }
  std::printf(
      "check: %zu problems, worst relative Frobenius error vs fp32 reference %.3e "
      "(tolerance %.0e): OK\n",
      run.group.size(), worst, tolerance);
  return 0;
}

int Main(int argc, char** argv);

}  // namespace

// Nothing may escape main: what a library throws becomes an error message.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::bad_alloc&) {
    return Fail("out of memory");
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}

namespace {

int Main(int argc, char** argv) {
  std::string server = "127.0.0.1:50051", shape, a_path, b_path, out_path, kernel = "auto";
  std::string accumulation = "fp32", mode = "auto", resident = "none", client_id, request_id,
              traceparent;
  int repeat = 1;
  const hgemm::CallOptions defaults;
  int parallel_parts = defaults.parallel_parts;
  int64_t parallel_min_bytes = defaults.parallel_min_bytes;
  uint64_t seed = std::random_device{}();
  double timeout_s = 0, tolerance = 0;
  float alpha = 1, beta = 0;
  uint32_t batch = 1;
  int verify_repetitions = 0;
  bool verify = false;
  bool check = false, info = false, list = false, transpose_a = false, transpose_b = false;
  std::string release, dtype = "fp16", c_dtype, transport = "grpc", group_text;

  CLI::App app{"hgemm_client: fp16 GEMM on an hgemm-serve server"};
  app.add_option("--server", server,
                 "server address (HOST:PORT or a gRPC target; several replicas: "
                 "ipv4:HOST:P1,HOST:P2,... or a DNS name resolving to all of them)")
      ->envname("HGEMM_SERVER")
      ->capture_default_str();
  app.add_option("--shape", shape, "MxNxK of random inputs, e.g. 512x256x1024 (each in [1, 2^32))");
  app.add_option("--a", a_path, "A as an m x k float16 .npy file");
  app.add_option("--b", b_path, "B as a k x n float16 .npy file");
  app.add_option("--out", out_path, "write C to this .npy file");
  app.add_flag("--transpose_a", transpose_a, "A is stored k x m (C = A^T B)");
  app.add_flag("--transpose_b", transpose_b, "B is stored n x k (C = A B^T, nn.Linear's weight)");
  app.add_option("--dtype", dtype, "element type of A and B: fp16 or bf16")
      ->check(CLI::IsMember({"fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--c_dtype", c_dtype, "element type of C: that of A and B (default) or fp32")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  CLI::Option* alpha_flag =
      app.add_option("--alpha", alpha, "C = alpha op(A) op(B) + beta C_in (default 1)");
  app.add_option("--beta", beta,
                 "with beta != 0, a random C_in of C's type is sent too (default 0: none)");
  app.add_option("--batch", batch,
                 "strided-batched: this many GEMMs of the shape in one call, random operands "
                 "packed one after the other (the server checks the batch's size)")
      ->check(CLI::Range(1u, 65536u));
  app.add_option("--group", group_text,
                 "grouped: MxNxK,MxNxK,... problems of their own shapes in one call (random "
                 "operands of --dtype, one form, --alpha/--beta shared), C back per problem");
  app.add_option("--kernel", kernel, "kernel variant (see --info) or auto")->capture_default_str();
  app.add_option("--accumulation", accumulation, "fp16 or fp32")
      ->check(CLI::IsMember({"fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--mode", mode,
                 "unary, stream, parts (parallel parts), or auto (parts from --parallel_min_bytes, "
                 "else stream when over 3 MiB)")
      ->check(CLI::IsMember({"auto", "unary", "stream", "parts"}))
      ->capture_default_str();
  app.add_option("--parallel_parts", parallel_parts,
                 "connections (and parts) a large GEMM's A, B and C travel over at once; 1: off")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--parallel_min_bytes", parallel_min_bytes,
                 "A + B + C bytes from which --mode=auto sends parallel parts")
      ->check(CLI::Range(int64_t{0}, INT64_MAX))
      ->capture_default_str();
  app.add_option("--repeat", repeat, "send the GEMM this many times")->check(CLI::Range(1, 100000));
  app.add_option("--resident", resident,
                 "none; b: upload B once, send only A per call; all: upload A and B once and keep "
                 "C on the server (fetched once at the end for --check/--out)")
      ->check(CLI::IsMember({"none", "b", "all"}))
      ->capture_default_str();
  app.add_option("--client_id", client_id,
                 "x-client-id for resident matrices when the server has no authentication "
                 "(default: peer address)");
  app.add_option("--request_id", request_id,
                 "request id sent with each GEMM (echoed back, in the server's logs); with "
                 "--repeat, run N sends ID-N");
  app.add_option("--traceparent", traceparent,
                 "W3C trace context sent with every call (00-<32 hex>-<16 hex>-<2 hex>), logged by "
                 "the server with the call");
  app.add_option("--seed", seed, "seed of the random inputs");
  app.add_option("--timeout_s", timeout_s, "deadline of each call in seconds (0: none)");
  app.add_option("--transport", transport,
                 "grpc: operands and C in the messages; shm: A, B and C in one shared-memory "
                 "region (same host: a unix: --server started with --allow_shared_memory), "
                 "named by unary Gemm calls; ring: the same region, named by the entries of a "
                 "submission ring (AttachRing: no gRPC call per GEMM)")
      ->check(CLI::IsMember({"grpc", "shm", "ring"}))
      ->capture_default_str();
  app.add_flag("--check", check, "compare C with a local fp32-accumulate reference");
  app.add_flag("--verify", verify,
               "ask the server to check C by Freivalds' method before answering "
               "(docs/verification.md)");
  app.add_option("--verify_repetitions", verify_repetitions,
                 "repetitions of that check (0: the server's default)")
      ->check(CLI::Range(0, 8));
  app.add_option(
      "--tolerance", tolerance,
      "largest relative Frobenius error --check accepts (default 1e-3 for fp32, 2e-2 for fp16)");
  app.add_flag("--info", info, "print the server's backend, devices, limits and kernels");
  app.add_flag("--list", list,
               "list this client's resident matrices (handle, shape, bytes, age, idle, time left "
               "before expiry, label); see --client_id. Over several replicas, those of the one "
               "the call reaches: give one replica's address as --server to list its own");
  app.add_option("--release", release,
                 "release these resident matrices (comma-separated handles, as --list shows)");
  hgemm::ConnectFlags connect_flags;
  connect_flags.Add(&app);
  CLI11_PARSE(app, argc, argv);
  hgemm::ConnectOptions connect;
  if (std::string e = connect_flags.Apply(&connect); !e.empty()) return Fail(e);

  // Everything that can be checked locally, before any call.
  hgemm::GemmDims dims{.m = 256, .n = 256, .k = 256};
  if (!shape.empty()) {
    if (std::string e = hgemm::ParseGemmDims(shape, &dims); !e.empty()) {
      return Fail(fmt::format("--shape '{}': {}", shape.substr(0, 64), e));
    }
  }
  std::vector<std::string> release_handles;
  if (!release.empty()) {
    if (std::string e = hgemm::cli::ParseHandleList(release, &release_handles); !e.empty()) {
      return Fail(e);
    }
  }
  hgemm::HalfMatrix a_npy, b_npy;
  if (!a_path.empty() || !b_path.empty()) {
    if (a_path.empty() || b_path.empty()) return Fail("--a and --b go together");
    if (!shape.empty()) return Fail("--shape and --a/--b exclude each other");
    if (std::string e = hgemm::ReadNpyShape(a_path, &a_npy); !e.empty()) return Fail(e);
    if (std::string e = hgemm::ReadNpyShape(b_path, &b_npy); !e.empty()) return Fail(e);
    if (std::string e = hgemm::cli::CheckMatrixDims("A (" + a_path + ")", a_npy.rows, a_npy.cols);
        !e.empty()) {
      return Fail(e);
    }
    if (std::string e = hgemm::cli::CheckMatrixDims("B (" + b_path + ")", b_npy.rows, b_npy.cols);
        !e.empty()) {
      return Fail(e);
    }
    if (dtype != "fp16") return Fail("--a/--b are float16 .npy files: not with --dtype=bf16");
    // As stored: A is k x m with --transpose_a, B n x k with --transpose_b.
    const uint64_t m = transpose_a ? a_npy.cols : a_npy.rows,
                   ka = transpose_a ? a_npy.rows : a_npy.cols;
    const uint64_t n = transpose_b ? b_npy.rows : b_npy.cols,
                   kb = transpose_b ? b_npy.cols : b_npy.rows;
    if (ka != kb) {
      return Fail(fmt::format("A is {}x{} and B is {}x{} (as stored{}{}): inner dimensions differ",
                              a_npy.rows, a_npy.cols, b_npy.rows, b_npy.cols,
                              transpose_a ? ", A transposed" : "",
                              transpose_b ? ", B transposed" : ""));
    }
    dims = {.m = uint32_t(m), .n = uint32_t(n), .k = uint32_t(ka)};
  }

  if (c_dtype.empty()) c_dtype = dtype;
  if (c_dtype != dtype && c_dtype != "fp32") {
    return Fail(
        fmt::format("--c_dtype={} with --dtype={}: C is the inputs' type or fp32", c_dtype, dtype));
  }
  if (!out_path.empty() && c_dtype != "fp16")
    return Fail("--out writes a float16 .npy: C must be fp16");
  const hgemm::GemmForm form{.transpose_a = transpose_a,
                             .transpose_b = transpose_b,
                             .bf16 = dtype == "bf16",
                             .c_fp32 = c_dtype == "fp32"};
  const uint64_t c_element_bytes = form.c_fp32 ? 4 : 2;

  const bool through_ring = transport == "ring";
  // Through the ring: A, B and C in a region, or (--resident=all) resident matrices, C
  // written in place into one uploaded for the run.
  const bool ring_resident = through_ring && resident == "all";
  const bool shm = transport == "shm" || (through_ring && !ring_resident);  // A, B, C in a region
  if (batch > 1 && (!a_path.empty() || shm || resident != "none" || !out_path.empty())) {
    return Fail(
        "--batch takes random inline operands: not with --a/--b, --transport=shm, "
        "--resident or --out");
  }
  if (transport == "shm" && resident != "none") {
    return Fail("--transport=shm and --resident exclude each other");
  }
  if (through_ring && resident == "b") return Fail("--transport=ring takes --resident=none or all");
  if (through_ring && mode == "stream") return Fail("--transport=ring is not --mode=stream");
  if (shm && mode == "stream")
    return Fail("--transport=shm sends unary Gemm calls, not --mode=stream");
  hgemm::CallOptions call;
  call.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  call.client_id = client_id;
  call.traceparent = traceparent;
  call.parallel_parts = parallel_parts;
  call.parallel_min_bytes = mode == "parts" ? 0 : parallel_min_bytes;
  if (mode == "parts" && parallel_parts < 2)
    return Fail("--mode=parts needs --parallel_parts of 2 or more");

  std::vector<hgemm::GemmDims> group;
  if (!group_text.empty()) {
    if (std::string e = hgemm::cli::ParseGroup(group_text, &group); !e.empty()) return Fail(e);
    if (!shape.empty() || !a_path.empty() || batch > 1 || resident != "none" || shm ||
        !out_path.empty() || (mode != "auto" && mode != "unary")) {
      return Fail(
          "--group sends random inline operands in one unary Gemm: not with --shape, "
          "--a/--b, --batch, --resident, --transport=shm, --out or --mode=stream/parts");
    }
  }

  hgemm::GemmClient client(server, connect);
  if (info) {
    hgemm::v1::ServerInfo server_info;
    if (grpc::Status s = client.GetServerInfo(&server_info, call); !s.ok()) return Fail(s);
    PrintServerInfo(client);
  }
  const bool gemm_asked = !shape.empty() || !a_path.empty() || !group.empty();
  if (list || !release_handles.empty()) {
    int rc = release_handles.empty() ? 0 : ReleaseResident(client, call, release_handles);
    if (list && rc == 0) rc = ListResident(client, call);
    if (rc != 0 || !gemm_asked) return rc;
  } else if (info && !gemm_asked) {
    return 0;
  }

  if (!group.empty()) {
    hgemm::v1::ServerInfo server_info;
    if (grpc::Status s = client.GetServerInfo(&server_info, call); !s.ok()) {
      return Fail(
          fmt::format("cannot read the server's limits (GetServerInfo): {} (gRPC status {})",
                      s.error_message(), static_cast<int>(s.error_code())));
    }
    if (std::string e =
            hgemm::cli::CheckGroupLimits(group, form.c_fp32, beta != 0, server_info.limits());
        !e.empty()) {
      return Fail("refused before sending: " + e);
    }
    GroupRun run{.group = group,
                 .form = form,
                 .seed = seed,
                 .repeat = repeat,
                 .check = check,
                 .tolerance = tolerance};
    run.shared.set_transpose_a(transpose_a);
    run.shared.set_transpose_b(transpose_b);
    run.shared.set_dtype(form.bf16 ? hgemm::v1::DATA_TYPE_BF16 : hgemm::v1::DATA_TYPE_UNSPECIFIED);
    run.shared.set_c_dtype(form.c_fp32 ? hgemm::v1::DATA_TYPE_FP32
                                       : hgemm::v1::DATA_TYPE_UNSPECIFIED);
    if (alpha_flag->count() > 0) run.shared.set_alpha(alpha);
    run.shared.set_beta(beta);
    run.shared.mutable_options()->set_kernel(kernel);
    run.shared.mutable_options()->set_accumulation(
        accumulation == "fp16" ? hgemm::v1::ACCUMULATION_FP16 : hgemm::v1::ACCUMULATION_FP32);
    run.shared.mutable_options()->set_request_id(request_id);
    run.shared.mutable_options()->set_verify(verify);
    run.shared.mutable_options()->set_verify_repetitions(uint32_t(verify_repetitions));
    return RunGroup(client, call, run);
  }

  // The server's limits, before a byte of A or B is allocated.
  {
    hgemm::v1::ServerInfo server_info;
    if (grpc::Status s = client.GetServerInfo(&server_info, call); !s.ok()) {
      return Fail(
          fmt::format("cannot read the server's limits (GetServerInfo): {} (gRPC status {})",
                      s.error_message(), static_cast<int>(s.error_code())));
    }
    // As GemmClient::ShouldStream will decide once the resident operands are handles.
    const auto a_bytes = hgemm::cli::MatrixBytes(dims.m, dims.k);
    const auto b_bytes = hgemm::cli::MatrixBytes(dims.k, dims.n);
    // Through shared memory, neither travels in a message.
    // C_in travels inline whatever the transport.
    const auto c_bytes = hgemm::cli::MatrixBytes(dims.m, dims.n);  // fp32: twice
    const auto c_in_bytes = beta == 0 ? std::optional<uint64_t>(0)
                                      : hgemm::cli::CheckedAdd(c_bytes, form.c_fp32 ? c_bytes : 0);
    const uint64_t sent =
        hgemm::cli::CheckedAdd(shm ? 0
                                   : hgemm::cli::CheckedAdd(resident == "all" ? 0 : a_bytes,
                                                            resident != "none" ? 0 : b_bytes),
                               c_in_bytes)
            .value_or(UINT64_MAX);
    const uint64_t received =
        shm || resident == "all"
            ? 0
            : hgemm::cli::CheckedAdd(hgemm::cli::MatrixBytes(dims.m, dims.n),  // fp32: twice
                                     form.c_fp32 ? hgemm::cli::MatrixBytes(dims.m, dims.n) : 0)
                  .value_or(UINT64_MAX);
    const uint64_t unary_limit = uint64_t(call.unary_limit_bytes);
    const bool unary =
        mode == "unary" || (mode == "auto" && sent <= unary_limit && received <= unary_limit);
    const hgemm::cli::Plan plan{.unary = unary && !shm,  // shm: no operand in a message
                                .resident_a = resident == "all",
                                .resident_b = resident != "none",
                                .keep_c = resident == "all",
                                .repeated = repeat > 1};
    if (std::string e = hgemm::cli::CheckLimits(dims, server_info.limits(), plan); !e.empty()) {
      return Fail("refused before sending: " + e);
    }
  }

  GemmRequest request;
  request.set_m(dims.m);
  request.set_n(dims.n);
  request.set_k(dims.k);
  request.set_transpose_a(transpose_a);
  request.set_transpose_b(transpose_b);
  // The defaults stay unset: an fp16 GEMM's request is what it was before these fields.
  request.set_dtype(form.bf16 ? hgemm::v1::DATA_TYPE_BF16 : hgemm::v1::DATA_TYPE_UNSPECIFIED);
  request.set_c_dtype(form.c_fp32 ? hgemm::v1::DATA_TYPE_FP32 : hgemm::v1::DATA_TYPE_UNSPECIFIED);
  if (!a_path.empty()) {
    if (std::string e = hgemm::ReadNpy(a_path, &a_npy); !e.empty()) return Fail(e);
    if (std::string e = hgemm::ReadNpy(b_path, &b_npy); !e.empty()) return Fail(e);
    request.set_a(std::move(a_npy.data));
    request.set_b(std::move(b_npy.data));
  } else {
    std::mt19937_64 rng(seed);
    auto a = hgemm::RandomHalfMatrix(int64_t(batch) * dims.m * dims.k, rng, form.bf16);
    request.set_a(reinterpret_cast<const char*>(a.data()), 2 * a.size());
    a = {};
    auto b = hgemm::RandomHalfMatrix(int64_t(batch) * dims.k * dims.n, rng, form.bf16);
    request.set_b(reinterpret_cast<const char*>(b.data()), 2 * b.size());
  }
  if (batch > 1) request.set_batch(batch);
  if (alpha_flag->count() > 0) request.set_alpha(alpha);  // unset: the wire's default, 1
  request.set_beta(beta);
  if (beta != 0) {
    std::mt19937_64 rng(seed + 1);
    const int64_t count = int64_t(batch) * dims.m * dims.n;
    if (form.c_fp32) {
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      std::vector<float> c_in(count);
      for (float& v : c_in) v = uniform(rng);
      request.set_c_in(reinterpret_cast<const char*>(c_in.data()), 4 * c_in.size());
    } else {
      request.set_c_in(hgemm::HalfBytes(hgemm::RandomHalfMatrix(count, rng, form.bf16)));
    }
  }
  request.mutable_options()->set_kernel(kernel);
  request.mutable_options()->set_accumulation(
      accumulation == "fp16" ? hgemm::v1::ACCUMULATION_FP16 : hgemm::v1::ACCUMULATION_FP32);
  request.mutable_options()->set_verify(verify);
  request.mutable_options()->set_verify_repetitions(uint32_t(verify_repetitions));

  // Host copies of the operands, for --check, whatever travels.
  const std::string a_bytes = request.a(), b_bytes = request.b();
  std::vector<std::string> uploaded;
  if (resident != "none") {
    const auto start = std::chrono::steady_clock::now();
    // B first, balanced; A onto B's replica: one GEMM's operands (and its kept C) live together.
    hgemm::CallOptions upload = call;
    for (bool is_a : {false, true}) {
      if (is_a && resident != "all") continue;
      hgemm::v1::MatrixInfo info;
      // As stored: A k x m when transposed, B n x k.
      grpc::Status s = is_a ? client.UploadMatrix(transpose_a ? request.k() : request.m(),
                                                  transpose_a ? request.m() : request.k(), a_bytes,
                                                  &info, 0, "A", upload, request.dtype())
                            : client.UploadMatrix(transpose_b ? request.n() : request.k(),
                                                  transpose_b ? request.k() : request.n(), b_bytes,
                                                  &info, 0, "B", upload, request.dtype());
      if (!s.ok()) return Fail(s);
      upload.replica = info.replica();
      uploaded.push_back(info.handle());
      if (is_a)
        request.set_a_handle(info.handle());
      else
        request.set_b_handle(info.handle());
    }
    request.set_keep_c_resident(resident == "all" && !ring_resident);
    std::printf(
        "uploaded %s once%s in %.1f ms; each call sends %.1f MiB\n",
        resident == "all" ? "A and B" : "B",
        upload.replica.empty() ? "" : (" to replica " + upload.replica).c_str(),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
        request.a().size() / 1048576.0);
  }
  // Shared memory: A, B and C in one region, registered for this run.
  std::unique_ptr<hgemm::SharedRegion> region;
  std::string region_handle;
  const int64_t b_offset = hgemm::SharedRegion::AlignPart(int64_t(a_bytes.size()));
  const int64_t c_offset = b_offset + hgemm::SharedRegion::AlignPart(int64_t(b_bytes.size()));
  if (shm) {
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    region =
        hgemm::SharedRegion::Create(c_offset + int64_t(c_element_bytes) * dims.m * dims.n, &error);
    if (!region) return Fail(error);
    std::memcpy(region->data(), a_bytes.data(), a_bytes.size());
    std::memcpy(region->data() + b_offset, b_bytes.data(), b_bytes.size());
    hgemm::v1::RegionInfo info;
    if (grpc::Status s =
            client.RegisterRegion(region->path(), region->bytes(), "hgemm_client", &info, call);
        !s.ok()) {
      return Fail(s);
    }
    region_handle = info.region();
    auto name = [&](hgemm::v1::RegionRef* ref, int64_t offset) {
      ref->set_region(region_handle);
      ref->set_offset(uint64_t(offset));
    };
    name(request.mutable_a_region(), 0);
    name(request.mutable_b_region(), b_offset);
    name(request.mutable_c_region(), c_offset);
    std::printf("registered a shared region of %.1f MiB (A, B, C) in %.1f ms\n",
                region->bytes() / 1048576.0,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  std::unique_ptr<hgemm::RingClient> ring;
  hgemm::RingSubmission ring_entry;
  std::string ring_c;  // ring_resident: the matrix C is written into, poisoned first
  if (ring_resident) {
    const uint32_t nan_bits = form.c_fp32 ? 0x7fc00000u : 0x7e00u;
    std::string poison(c_element_bytes * request.m() * request.n(), '\0');
    for (size_t i = 0; i < poison.size(); i += c_element_bytes) {
      std::memcpy(&poison[i], &nan_bits, c_element_bytes);
    }
    hgemm::v1::MatrixInfo info;
    if (grpc::Status s =
            client.UploadMatrix(request.m(), request.n(), poison, &info, 0, "C", call,
                                form.c_fp32 ? hgemm::v1::DATA_TYPE_FP32 : request.dtype());
        !s.ok()) {
      return Fail(s);
    }
    ring_c = info.handle();
    uploaded.push_back(ring_c);
  }
  if (through_ring) {
    const auto start = std::chrono::steady_clock::now();
    grpc::Status s;
    ring = hgemm::RingClient::Attach(
        client, shm ? std::vector<std::string>{region_handle} : std::vector<std::string>{},
        ring_resident ? std::vector<std::string>{request.a_handle(), request.b_handle(), ring_c}
                      : std::vector<std::string>{},
        {.call = call}, &s);
    if (!ring) return Fail(s);
    s = ring->ToSubmission(request, ring_c,
                           std::chrono::duration_cast<std::chrono::microseconds>(call.timeout),
                           &ring_entry);
    if (!s.ok()) return Fail(s);
    std::printf("attached a submission ring in %.1f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  // Through the ring, every run goes by the ring (a large C, which would otherwise stream,
  // is written in place).
  const bool parts = !shm && !through_ring && (mode == "parts" || mode == "auto") &&
                     hgemm::GemmClient::ShouldSendParts(request, call);
  const bool stream =
      !shm && !through_ring && !parts &&
      (mode == "stream" || (mode == "auto" && hgemm::GemmClient::ShouldStream(request, call)));
  hgemm::cli::WireBytes wire = hgemm::cli::RequestWireBytes(request, c_element_bytes);
  if (shm || ring_resident) wire.down = 0;  // C lands in a region or a resident matrix
  const double wire_bytes = double(wire.up + wire.down);
  if (request.has_alpha() || request.beta() != 0) {
    std::printf("C = %g op(A) op(B) + %g C_in\n", alpha, beta);
  }
  if (batch > 1) std::printf("a batch of %u GEMMs, operands packed\n", batch);
  std::printf(
      "GEMM %ux%ux%u (m x n x k) %s%s %s->%s via %s, kernel %s, accumulation %s, %.1f MiB up, %.1f "
      "MiB down\n",
      request.m(), request.n(), request.k(), transpose_a ? "T" : "N", transpose_b ? "T" : "N",
      dtype.c_str(), c_dtype.c_str(),
      ring_resident  ? "a submission ring, A, B and C resident (C written in place)"
      : through_ring ? "a submission ring, A, B and C in shared memory"
      : shm          ? "unary Gemm, A, B and C in shared memory"
      : parts
          ? fmt::format(
                "{} parallel parts{}", parallel_parts,
                call.bulk && client.OffersBulk(request.a_handle()) ? " over the bulk channel" : "")
                .c_str()
      : stream ? "GemmStream"
               : "unary Gemm",
      kernel.c_str(), accumulation.c_str(), wire.up / 1048576.0, wire.down / 1048576.0);
  std::printf("%5s %10s %9s %10s %9s %9s %10s %10s %8s %8s  %s\n", "run", "queue_ms", "h2d_ms",
              "kernel_ms", "d2h_ms", "verify_ms", "server_ms", "client_ms", "TFLOP/s", "wire_GB/s",
              "kernel@device");

  GemmResponse response;
  for (int run = 1; run <= repeat; ++run) {
    if (!request_id.empty()) {
      request.mutable_options()->set_request_id(repeat > 1 ? request_id + "-" + std::to_string(run)
                                                           : request_id);
    }
    const auto start = std::chrono::steady_clock::now();
    grpc::Status status;
    if (parts) {
      status = client.Run(request, &response, call);
    } else if (stream) {
      std::vector<hgemm::StreamedGemm> results;
      status = client.GemmStream({&request}, &results, call);
      if (status.ok()) {
        status = results[0].status;
        response = std::move(results[0].response);
      }
    } else if (through_ring) {
      hgemm::RingCompletion done{};
      status = ring->Gemm(ring_entry, &done);
      response.mutable_timing()->set_queue_wait_ms(done.queue_wait_ms);
      response.mutable_timing()->set_kernel_ms(done.kernel_ms);
      response.mutable_timing()->set_server_total_ms(done.server_total_ms);
      response.mutable_timing()->set_tflops(done.tflops);
      // A server that names no execution in its completions: the accumulation asked for.
      if (!hgemm::RingExecution(done, ring->attached(), response.mutable_execution())) {
        response.mutable_execution()->set_accumulation(request.options().accumulation());
      }
    } else {
      status = client.Gemm(request, &response, call);
    }
    const double client_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok()) return Fail(status);
    if (response.has_c_matrix()) {  // a kept C: release the previous run's
      if (!uploaded.empty() && uploaded.back().rfind("C:", 0) == 0) {
        client.ReleaseMatrix(uploaded.back().substr(2), call);
        uploaded.pop_back();
      }
      uploaded.push_back("C:" + response.c_matrix().handle());
    }
    const auto& t = response.timing();
    const auto& e = response.execution();
    std::printf(
        "%5d %10.3f %9.3f %10.3f %9.3f %9.3f %10.3f %10.3f %8.2f %8.2f  %s (%s) @ %s "
        "stream %d%s\n",
        run, t.queue_wait_ms(), t.host_to_device_ms(), t.kernel_ms(), t.device_to_host_ms(),
        t.verify_ms(), t.server_total_ms(), client_ms, t.tflops(), wire_bytes / client_ms / 1e6,
        e.kernel().c_str(), AccumulationName(e.accumulation()), e.device_name().c_str(),
        e.stream_id(), VerifiedNote(e).c_str());
  }

  if (response.has_c_matrix() && (check || !out_path.empty())) {
    const auto start = std::chrono::steady_clock::now();
    if (grpc::Status s =
            client.DownloadMatrix(response.c_matrix().handle(), response.mutable_c(), call);
        !s.ok()) {
      return Fail(s);
    }
    std::printf("downloaded the kept C in %.1f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  ring.reset();  // detached before its region goes
  if (ring_resident && (check || !out_path.empty())) {
    if (grpc::Status s = client.DownloadMatrix(ring_c, response.mutable_c(), call); !s.ok()) {
      return Fail(s);
    }
  }
  if (shm) {  // C is in the region: copied out for --check and --out
    response.set_c(reinterpret_cast<const char*>(region->data() + c_offset),
                   c_element_bytes * request.m() * request.n());
    if (grpc::Status s = client.UnregisterRegion(region_handle, call); !s.ok()) return Fail(s);
  }
  for (const std::string& handle : uploaded) {
    client.ReleaseMatrix(handle.rfind("C:", 0) == 0 ? handle.substr(2) : handle, call);
  }

  if (check) {
    const auto* a = reinterpret_cast<const uint16_t*>(a_bytes.data());
    const auto* b = reinterpret_cast<const uint16_t*>(b_bytes.data());
    // A batch: each GEMM's reference, one after the other as C holds them.
    const int64_t m = request.m(), n = request.n(), k = request.k();
    std::vector<float> reference;
    for (int64_t i = 0; i < int64_t(batch); ++i) {
      std::vector<float> one = hgemm::ReferenceGemm(
          a + i * m * k, b + i * k * n, m, n, k, form,
          {.alpha = request.has_alpha() ? request.alpha() : 1.0f,
           .beta = request.beta(),
           .c_in = request.c_in().data() + i * m * n * int64_t(c_element_bytes)});
      reference.insert(reference.end(), one.begin(), one.end());
    }
    if (response.c().size() != c_element_bytes * reference.size()) {
      return Fail(fmt::format("C has {} bytes; expected {}", response.c().size(),
                              c_element_bytes * reference.size()));
    }
    const hgemm::ErrorStats stats =
        hgemm::CompareToReference(response.c().data(), reference.data(), reference.size(), form);
    const double error = stats.nan_count > 0 ? INFINITY : stats.rel_frobenius;
    if (tolerance <= 0) {
      tolerance = hgemm::ServiceTolerance(
          response.execution().accumulation() == hgemm::v1::ACCUMULATION_FP16, form);
    }
    const bool ok = error <= tolerance;
    std::printf("check: relative Frobenius error vs fp32 reference %.3e (tolerance %.0e): %s\n",
                error, tolerance, ok ? "OK" : "FAILED");
    if (!ok) return 1;
  }
  if (!out_path.empty()) {
    hgemm::HalfMatrix c{.rows = request.m(), .cols = request.n(), .data = response.c()};
    if (std::string e = hgemm::WriteNpy(out_path, c); !e.empty()) return Fail(e);
    std::printf("wrote C (%ux%u) to %s\n", request.m(), request.n(), out_path.c_str());
  }
  return 0;
}

}  // namespace
