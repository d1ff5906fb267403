// poll_probe: does a client thread that never sleeps lower the fixed cost of an all-resident
// GEMM? (The fixed costs; docs/kernels_notes.md, "The RPC floor with the kernel's idle
// time".) Uploads A and B once, then makes --calls unary Gemm calls one at a time with both
// operands resident and C kept, each waited for in one of two ways:
//   block  the blocking stub: the client thread sleeps in the kernel until the reply comes
//   poll   a completion queue polled with a zero deadline: the client thread never sleeps
// and alternates the two call by call so that both see the same server and clocks. Kept Cs are
// released between calls, outside the measured time. Prints per mode the p50/p90 of the
// client's latency and the server's kernel and total times.
//   poll_probe --server=127.0.0.1:50051 --shape=8192x8192x8192 --calls=200
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/stats.h"
#include "client/gemm_client.h"
#include "client/gemm_dims.h"
#include "proto/hgemm.grpc.pb.h"
#include "proto/numerics/cpu_gemm.h"

namespace {

using Clock = std::chrono::steady_clock;
using hgemm::v1::GemmRequest;
using hgemm::v1::GemmResponse;

struct Sample {
  double client_ms, kernel_ms, server_ms;
};

grpc::Status CallBlocking(hgemm::v1::GemmService::Stub* stub, const GemmRequest& request,
                          const std::string& client_id, GemmResponse* response) {
  grpc::ClientContext context;
  context.AddMetadata("x-client-id", client_id);
  return stub->Gemm(&context, request, response);
}

grpc::Status CallPolling(hgemm::v1::GemmService::Stub* stub, grpc::CompletionQueue* cq,
                         const GemmRequest& request, const std::string& client_id,
                         GemmResponse* response) {
  grpc::ClientContext context;
  context.AddMetadata("x-client-id", client_id);
  grpc::Status status;
  auto call = stub->AsyncGemm(&context, request, cq);
  call->Finish(response, &status, &status);
  void* tag = nullptr;
  bool ok = false;
  while (cq->AsyncNext(&tag, &ok, std::chrono::system_clock::now()) !=
         grpc::CompletionQueue::GOT_EVENT) {
  }
  return status;
}

void Report(const char* mode, std::vector<Sample> samples) {
  auto column = [&](double Sample::*field) {
    std::vector<double> v;
    for (const Sample& s : samples) v.push_back(s.*field);
    return v;
  };
  std::vector<double> client = column(&Sample::client_ms);
  std::sort(client.begin(), client.end());
  const double kernel = hgemm::bench::Median(column(&Sample::kernel_ms));
  const double server = hgemm::bench::Median(column(&Sample::server_ms));
  const double p50 = hgemm::bench::Median(client);
  std::printf(
      "%-6s %5zu  p50 %.3f ms  p90 %.3f ms  kernel %.3f ms  server %.3f ms  "
      "p50/kernel %.3f  p50 - server %.3f ms\n",
      mode, samples.size(), p50, hgemm::bench::Percentile(client, 90), kernel, server, p50 / kernel,
      p50 - server);
}

}  // namespace

int main(int argc, char** argv) {
  std::string server = "127.0.0.1:50051";
  std::string shape_text = "8192x8192x8192";
  int calls = 200;
  CLI::App app{"poll_probe: all-resident Gemm latency with a sleeping vs a polling client thread"};
  app.add_option("--server", server, "HOST:PORT of hgemm_server")->capture_default_str();
  app.add_option("--shape", shape_text, "MxNxK")->capture_default_str();
  app.add_option("--calls", calls, "calls per mode")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  hgemm::GemmDims shape;
  if (std::string error = hgemm::ParseGemmDims(shape_text, &shape); !error.empty()) {
    std::fprintf(stderr, "poll_probe: --shape: %s\n", error.c_str());
    return 2;
  }

  const std::string client_id = "poll_probe-" + std::to_string(getpid());
  std::shared_ptr<grpc::Channel> channel = hgemm::Connect(server);
  hgemm::GemmClient client(channel);
  hgemm::CallOptions options;
  options.client_id = client_id;
  std::mt19937_64 rng(17);
  hgemm::v1::MatrixInfo a, b;
  for (auto [info, rows, cols] :
       {std::tuple{&a, shape.m, shape.k}, std::tuple{&b, shape.k, shape.n}}) {
    const std::string data = hgemm::HalfBytes(hgemm::RandomHalfMatrix(int64_t(rows) * cols, rng));
    grpc::Status s =
        client.UploadMatrix(rows, cols, data, info, /*ttl_seconds=*/600, "poll_probe", options);
    if (!s.ok()) {
      std::fprintf(stderr, "poll_probe: upload: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  GemmRequest request;
  request.set_m(shape.m);
  request.set_n(shape.n);
  request.set_k(shape.k);
  request.set_a_handle(a.handle());
  request.set_b_handle(b.handle());
  request.set_keep_c_resident(true);

  auto stub = hgemm::v1::GemmService::NewStub(channel);
  grpc::CompletionQueue cq;
  std::vector<Sample> blocking, polling;
  for (int i = 0; i < 2 * calls + 2; ++i) {  // the first call of each mode warms up
    const bool poll = i % 2 == 1;
    GemmResponse response;
    const Clock::time_point start = Clock::now();
    grpc::Status s = poll ? CallPolling(stub.get(), &cq, request, client_id, &response)
                          : CallBlocking(stub.get(), request, client_id, &response);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (!s.ok()) {
      std::fprintf(stderr, "poll_probe: Gemm: %s\n", s.error_message().c_str());
      return 1;
    }
    client.ReleaseMatrix(response.c_matrix().handle(), options);
    if (i >= 2) {
      (poll ? polling : blocking)
          .push_back({ms, response.timing().kernel_ms(), response.timing().server_total_ms()});
    }
  }
  client.ReleaseMatrix(a.handle(), options);
  client.ReleaseMatrix(b.handle(), options);
  cq.Shutdown();
  std::printf("all-resident %s, unary, concurrency 1, kept C released between calls\n",
              shape_text.c_str());
  Report("block", blocking);
  Report("poll", polling);
  return 0;
}
