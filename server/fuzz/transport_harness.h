// The server transport_fuzz talks to: one HgemmServer (CPU backend, the limits of fuzz_util.h)
// for the whole fuzzing process, reached over TCP on 127.0.0.1, as clients reach it. Not gRPC's
// in-process transport: under gRPC 1.51 it kept ~25 kB per streaming call (transport_fuzz
// workers grew to their 4 GiB limit in ~270 s on the GPU machine; over TCP RSS stays flat),
// and a client whose stream held a message the server could not parse never heard the
// server's answer. Its scheduler's workers sleep as soon as their queue is empty (no idle
// spin: CPU per GEMM for a latency nobody measures here). What an execution costs:
// docs/soak.md, "Fuzzing at depth". Every call gets
// kCallDeadline; DEADLINE_EXCEEDED means the server never answered, and Check()
// abort()s on it (a crash for libFuzzer), as on a status message showing a wrapped number.
// Include it in exactly one file of a target: it defines LLVMFuzzerInitialize, which starts the
// server. Thread safety: Server() and Stub() are started once, from there; the rest is
// stateless.
#ifndef HGEMM_SERVER_FUZZ_TRANSPORT_HARNESS_H_
#define HGEMM_SERVER_FUZZ_TRANSPORT_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "proto/hgemm.grpc.pb.h"
#include "server/backend/cpu_backend.h"
#include "server/fuzz/fuzz_util.h"
#include "server/server.h"

namespace hgemm::fuzz {

// Started on first use. Never destroyed: the fuzzer ends the process.
inline HgemmServer& Server() {
  static HgemmServer* server = [] {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.max_message_bytes = 8 << 20;
    options.drain_deadline = std::chrono::milliseconds(2000);
    options.upload_threads = kUploadThreads;
    options.service.scheduler.idle_spin = std::chrono::microseconds(0);
    options.service.rules.max_elements_per_matrix = kMaxElementsPerMatrix;
    options.service.stream_chunk_bytes = kStreamChunkBytes;
    options.service.max_stream_pending_bytes = kMaxPendingBytes;
    options.service.max_client_pending_bytes = kMaxPendingBytes;
    options.service.resident.quota_bytes_per_client = kQuotaBytesPerClient;
    // The bulk channel, with timeouts short enough that a lane left silent by an input ends
    // well within kCallDeadline.
    options.bulk.address = "127.0.0.1:0";
    options.bulk.hello_timeout = std::chrono::milliseconds(200);
    options.bulk.idle_timeout = std::chrono::milliseconds(500);
    options.bulk.chunk_bytes = kStreamChunkBytes;
    auto* started =
        HgemmServer::Start(options, MakeCpuBackend({.workers = kCpuWorkers,
                                                    .max_job_bytes = kBackendBytes,
                                                    .resident_budget_bytes = kBackendBytes}))
            .release();
    if (started == nullptr) std::abort();
    return started;
  }();
  return *server;
}

inline v1::GemmService::Stub& Stub() {
  static v1::GemmService::Stub* stub = [] {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    return v1::GemmService::NewStub(
               grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(Server().port()),
                                         grpc::InsecureChannelCredentials(), args))
        .release();
  }();
  return *stub;
}

// The deadline, and `client` as the caller's identity.
inline void Context(grpc::ClientContext* context, const std::string& client) {
  context->set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  context->AddMetadata("x-client-id", client);
}

inline void Check(const grpc::Status& s, const char* call) {
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    Fail("call not answered within its deadline", call);
  }
  if (ShowsNegativeNumber(s.error_message())) {
    Fail("a message shows a wrapped negative number", s.error_message());
  }
}

}  // namespace hgemm::fuzz

// libFuzzer's hook before the first input and before it parses its flags: the server starts
// here, not inside an input, and -entropic=0 goes first among the flags (one on the command line
// wins). Entropic scheduling's bookkeeping per feature took 40-50 % of this target's CPU (~40 k
// features an execution through gRPC): without it, 4-6x the executions and more coverage in the
// same time (docs/soak.md, "Fuzzing at depth").
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static auto* args = new std::vector<char*>(*argv, *argv + *argc);
  static char entropic_off[] = "-entropic=0";
  args->insert(args->begin() + 1, entropic_off);
  args->push_back(nullptr);
  *argc = int(args->size()) - 1;
  *argv = args->data();
  hgemm::fuzz::Stub();
  return 0;
}

#endif  // HGEMM_SERVER_FUZZ_TRANSPORT_HARNESS_H_
