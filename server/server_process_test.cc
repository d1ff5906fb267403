// The real hgemm_server binary as a child process, seen from outside:
//   * grpc.health.v1 reports SERVING for "" and hgemm.v1.GemmService;
//   * a client that knows the service only through server reflection (no generated hgemm code:
//     descriptors fetched at run time, dynamic messages, a generic stub) multiplies 2x2 matrices;
//   * every service reflection lists can be described through reflection alone (grpcurl's
//     `describe`, and its health check, need that);
//   * SIGTERM while GEMMs are in flight: every one of them is answered, and the process exits 0
//     within the drain deadline the Kubernetes manifests assume (20 s);
//   * SIGTERM with only idle long-lived calls (a GemmStream, a health Watch): they end with
//     UNAVAILABLE at once instead of holding the drain for its whole deadline;
//   * with TLS, a token and --auth_protect_reflection, the reflection-only client still
//     multiplies (given the token) and reflection without one is UNAUTHENTICATED;
//   * a malformed certificate, key or tokens file stops the server at start, naming the file.
//   * --log_format=json: every line the process writes is a JSON object; calls made by the real
//     hgemm_client with --request_id and --traceparent show up with their fields, and a
//     malformed traceparent is not logged.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "client/metrics_scrape.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "proto/numerics/fp16.h"
#include "server/auth/test_certs.h"
#include "server/testing/child_process.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;
namespace reflection = grpc::reflection::v1alpha;
namespace pb = google::protobuf;

constexpr int kDrainDeadlineSeconds = 20;
using subprocess::FreePort;

std::string ServerBinary() {
  return std::string(std::getenv("TEST_SRCDIR")) + "/hgemm_serve/server/hgemm_server";
}

class ServerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { Launch({}, {}); }

  // Starts hgemm_server (CPU backend, debug log, /metrics) with `extra` flags; channel_
  // connects with `connect`. Its output goes to `log_path`, or to the test's when empty.
  void Launch(const std::vector<std::string>& extra, const ConnectOptions& connect,
              const std::string& log_path = "") {
    const std::string binary = subprocess::RunfilePath("server/hgemm_server");
    target_ = "127.0.0.1:" + std::to_string(FreePort());
    metrics_port_ = FreePort();
    std::vector<std::string> args = {binary,
                                     "--backend=cpu",
                                     "--listen=" + target_,
                                     "--drain_deadline_s=" + std::to_string(kDrainDeadlineSeconds),
                                     "--metrics_listen=127.0.0.1:" + std::to_string(metrics_port_),
                                     "--log_level=debug"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      if (!log_path.empty()) {  // only async-signal-safe calls between fork and exec
        const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(126);
      }
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    channel_ = Connect(target_, connect);
    ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + 30s))
        << "server did not come up on " << target_;
  }

  void TearDown() override {
    if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& service) {
    auto stub = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status s = stub->Check(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.status();
  }

  // Runs the real hgemm_client against the server with `flags` (a --server among them
  // replaces the TCP one); its exit status.
  int RunClient(std::vector<std::string> flags) {
    if (std::none_of(flags.begin(), flags.end(),
                     [](const std::string& f) { return f.rfind("--server=", 0) == 0; })) {
      flags.insert(flags.begin(), "--server=" + target_);
    }
    subprocess::ChildProcess client(subprocess::RunfilePath("client/hgemm_client"), flags);
    return client.Wait();
  }

  std::string target_;
  int metrics_port_ = 0;
  pid_t pid_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServerProcessTest, HealthIsServing) {
  EXPECT_EQ(Health(""), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("hgemm.v1.GemmService"), grpc::health::v1::HealthCheckResponse::SERVING);
}

// The binary serves /metrics (Debian's civetweb could not start a thread in it: see
// server/metrics_http.h), and its counters see the calls made.
TEST_F(ServerProcessTest, MetricsAreServed) {
  GemmClient client(channel_);
  v1::GemmRequest r;
  r.set_m(2);
  r.set_n(2);
  r.set_k(2);
  r.set_a(std::string(8, '\0'));
  r.set_b(std::string(8, '\0'));
  v1::GemmResponse response;
  ASSERT_TRUE(client.Gemm(r, &response).ok());
  std::string text;
  ASSERT_EQ(HttpGet("127.0.0.1", metrics_port_, "/metrics", &text), 200) << text;
  EXPECT_NE(text.find("\nhgemm_requests_total{code=\"OK\",rpc=\"Gemm\"} 1\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\nhgemm_build_info{backend=\"cpu\",version=\""), std::string::npos) << text;
}

// One request/response exchange on the reflection stream.
reflection::ServerReflectionResponse Reflect(std::shared_ptr<grpc::Channel> channel,
                                             const reflection::ServerReflectionRequest& request) {
  auto stub = reflection::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  EXPECT_TRUE(stream->Write(request));
  stream->WritesDone();
  reflection::ServerReflectionResponse response;
  EXPECT_TRUE(stream->Read(&response));
  EXPECT_TRUE(stream->Finish().ok());
  return response;
}

// Multiplies 2x2 matrices knowing the service only through reflection (as grpcurl does).
void ReflectionOnlyClientMultiplies(const std::shared_ptr<grpc::Channel>& channel) {
  reflection::ServerReflectionRequest list;
  list.set_list_services("*");
  std::vector<std::string> services;
  const reflection::ServerReflectionResponse listed = Reflect(channel, list);
  for (const auto& s : listed.list_services_response().service()) {
    services.push_back(s.name());
  }
  EXPECT_NE(std::find(services.begin(), services.end(), "hgemm.v1.GemmService"), services.end());
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());

  // Descriptors of the service, as the server sends them (a file before its imports: the
  // pool builds each from the database once its imports are in).
  reflection::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("hgemm.v1.GemmService");
  pb::SimpleDescriptorDatabase received;
  const reflection::ServerReflectionResponse files = Reflect(channel, symbol);
  for (const std::string& bytes : files.file_descriptor_response().file_descriptor_proto()) {
    pb::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    ASSERT_TRUE(received.Add(file)) << file.name();
  }
  pb::DescriptorPool pool(&received);
  const pb::MethodDescriptor* gemm = pool.FindMethodByName("hgemm.v1.GemmService.Gemm");
  ASSERT_NE(gemm, nullptr);

  pb::DynamicMessageFactory factory(&pool);
  std::unique_ptr<pb::Message> request(factory.GetPrototype(gemm->input_type())->New());
  const pb::Descriptor* d = gemm->input_type();
  const pb::Reflection* r = request->GetReflection();
  r->SetUInt32(request.get(), d->FindFieldByName("m"), 2);
  r->SetUInt32(request.get(), d->FindFieldByName("n"), 2);
  r->SetUInt32(request.get(), d->FindFieldByName("k"), 2);
  const std::string matrix("\x00\x3c\x00\x40\x00\x42\x00\x44", 8);  // [[1,2],[3,4]] in fp16
  r->SetString(request.get(), d->FindFieldByName("a"), matrix);
  r->SetString(request.get(), d->FindFieldByName("b"), matrix);

  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  std::string serialized = request->SerializeAsString();
  grpc::Slice slice(serialized);
  grpc::ByteBuffer request_bytes(&slice, 1), response_bytes;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/hgemm.v1.GemmService/Gemm", grpc::StubOptions(), &request_bytes,
                 &response_bytes, [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response_bytes.Dump(&slices).ok());
  std::string reply_bytes;
  for (const auto& s : slices)
    reply_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  std::unique_ptr<pb::Message> reply(factory.GetPrototype(gemm->output_type())->New());
  ASSERT_TRUE(reply->ParseFromString(reply_bytes));
  const std::string c =
      reply->GetReflection()->GetString(*reply, gemm->output_type()->FindFieldByName("c"));
  ASSERT_EQ(c.size(), 8u);
  const auto* half = reinterpret_cast<const uint16_t*>(c.data());
  EXPECT_EQ(HalfToFloat(half[0]), 7);
  EXPECT_EQ(HalfToFloat(half[1]), 10);
  EXPECT_EQ(HalfToFloat(half[2]), 15);
  EXPECT_EQ(HalfToFloat(half[3]), 22);
}

TEST_F(ServerProcessTest, ReflectionOnlyClientMultiplies) {
  ReflectionOnlyClientMultiplies(channel_);
}

// The same over TLS, with the token that --auth_protect_reflection asks reflection for.
class TlsServerProcessTest : public ServerProcessTest {
 protected:
  void SetUp() override {
    const std::string certs = testing::MakeTestCerts();
    tokens_ = certs + "/tokens";
    testing::ReplaceFile(tokens_, testing::TokenLine("alice", "alice-token"));
    ca_ = certs + "/ca.pem";
    Launch({"--tls_cert=" + certs + "/server.pem", "--tls_key=" + certs + "/server.key",
            "--auth_tokens_file=" + tokens_, "--auth_protect_reflection"},
           {.tls_ca = ca_, .token = "alice-token"});
  }
  std::string tokens_, ca_;
};

TEST_F(TlsServerProcessTest, ReflectionOnlyClientMultipliesOverTls) {
  ReflectionOnlyClientMultiplies(channel_);
}

TEST_F(TlsServerProcessTest, ReflectionNeedsTheToken) {
  auto stub = reflection::ServerReflection::NewStub(Connect(target_, {.tls_ca = ca_}));
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  reflection::ServerReflectionRequest list;
  list.set_list_services("*");
  stream->Write(list);
  stream->WritesDone();
  reflection::ServerReflectionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Health(""), grpc::health::v1::HealthCheckResponse::SERVING);  // open without one
}

// The server's output and exit status when started with `flags`; it must stop by itself.
int RunToExit(const std::string& flags, std::string* output) {
  const std::string command =
      "timeout 60 " + ServerBinary() + " --backend=cpu --listen=127.0.0.1:0 " + flags + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ServerProcess, MalformedCertificateKeyOrTokensFileStopsTheStart) {
  const std::string certs = testing::MakeTestCerts();
  const std::string garbage = certs + "/garbage.pem";
  testing::ReplaceFile(garbage, "not a PEM file\n");
  const std::string good_tls =
      "--tls_cert=" + certs + "/server.pem --tls_key=" + certs + "/server.key";
  struct Case {
    std::string flags, message;
  };
  for (const Case& c : {
           Case{"--tls_cert=" + garbage + " --tls_key=" + certs + "/server.key",
                garbage + ": no PEM certificate"},
           Case{"--tls_cert=" + certs + "/server.pem --tls_key=" + garbage,
                garbage + ": no PEM private key"},
           Case{"--tls_cert=" + certs + "/server.pem --tls_key=" + certs + "/other-server.key",
                certs + "/other-server.key: the private key does not belong"},
           Case{good_tls + " --tls_client_ca=" + garbage, garbage + ": no PEM certificate"},
           Case{"--tls_cert=" + certs + "/missing.pem --tls_key=" + certs + "/server.key",
                certs + "/missing.pem: cannot open"},
           Case{"--auth_tokens_file=" + garbage, garbage + ": line 1: expected PRINCIPAL"},
       }) {
    std::string output;
    EXPECT_EQ(RunToExit(c.flags, &output), 1) << c.flags << "\n" << output;
    EXPECT_NE(output.find(c.message), std::string::npos) << c.flags << "\n" << output;
  }
}

// Reflection describes every service it lists, grpc.health.v1.Health included.
TEST_F(ServerProcessTest, ReflectionDescribesEveryListedService) {
  reflection::ServerReflectionRequest list;
  list.set_list_services("*");
  const reflection::ServerReflectionResponse listed = Reflect(channel_, list);
  ASSERT_GE(listed.list_services_response().service_size(), 3);
  for (const auto& service : listed.list_services_response().service()) {
    reflection::ServerReflectionRequest symbol;
    symbol.set_file_containing_symbol(service.name());
    const reflection::ServerReflectionResponse files = Reflect(channel_, symbol);
    ASSERT_FALSE(files.has_error_response())
        << service.name() << ": " << files.error_response().error_message();
    pb::SimpleDescriptorDatabase received;  // a file comes before its imports
    for (const std::string& bytes : files.file_descriptor_response().file_descriptor_proto()) {
      pb::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(bytes));
      ASSERT_TRUE(received.Add(file)) << file.name();
    }
    pb::DescriptorPool pool(&received);
    EXPECT_NE(pool.FindServiceByName(service.name()), nullptr) << service.name();
  }
}

// grpcurl's bare `describe` lists the services and then resolves every one of them
// on the same reflection stream. Each answer must hold the symbol's file first, with every
// file it imports, whatever the stream already carried.
TEST_F(ServerProcessTest, ReflectionResolvesEveryListedServiceOnOneStream) {
  auto stub = reflection::ServerReflection::NewStub(channel_);
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  reflection::ServerReflectionRequest list;
  list.set_list_services("*");
  ASSERT_TRUE(stream->Write(list));
  reflection::ServerReflectionResponse listed;
  ASSERT_TRUE(stream->Read(&listed));
  ASSERT_GE(listed.list_services_response().service_size(), 3);
  std::vector<std::string> names;
  for (const auto& service : listed.list_services_response().service())
    names.push_back(service.name());
  std::sort(names.begin(), names.end());  // grpcurl's order
  for (const std::string& name : names) {
    reflection::ServerReflectionRequest symbol;
    symbol.set_file_containing_symbol(name);
    ASSERT_TRUE(stream->Write(symbol));
    reflection::ServerReflectionResponse files;
    ASSERT_TRUE(stream->Read(&files));
    ASSERT_FALSE(files.has_error_response())
        << name << ": " << files.error_response().error_message();
    // grpcurl takes the first file as the one that holds the symbol, and needs its imports.
    std::map<std::string, pb::FileDescriptorProto> received;
    std::string first;
    for (const std::string& bytes : files.file_descriptor_response().file_descriptor_proto()) {
      pb::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(bytes));
      if (first.empty()) first = file.name();
      received[file.name()] = file;
    }
    ASSERT_FALSE(first.empty()) << name << ": no file in the answer";
    pb::DescriptorPool pool;
    std::set<std::string> built;
    std::function<void(const std::string&)> build = [&](const std::string& file_name) {
      if (!built.insert(file_name).second) return;
      auto it = received.find(file_name);
      ASSERT_NE(it, received.end()) << name << " needs " << file_name << ", not in the answer";
      for (const std::string& dependency : it->second.dependency()) build(dependency);
      ASSERT_NE(pool.BuildFile(it->second), nullptr) << file_name;
    };
    build(first);
    const pb::FileDescriptor* file = pool.FindFileByName(first);
    ASSERT_NE(file, nullptr);
    EXPECT_NE(pool.FindServiceByName(name), nullptr) << name << " is not in " << first;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerProcessTest, SigtermEndsIdleStreamsAndWatchesAtOnce) {
  auto stub = v1::GemmService::NewStub(channel_);
  grpc::ClientContext stream_context, watch_context;
  auto stream = stub->GemmStream(&stream_context);
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest request;
  auto watch = health->Watch(&watch_context, request);
  grpc::health::v1::HealthCheckResponse seen;
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  ASSERT_EQ(kill(pid_, SIGTERM), 0);

  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  while (watch->Read(&seen)) {
  }
  grpc::Status s = watch->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  v1::GemmStreamResponse response;
  EXPECT_FALSE(stream->Read(&response));
  s = stream->Finish();
  // Held for the whole drain, it would have been CANCELLED at the deadline.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid_, &wstatus, 0), pid_);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
}

TEST_F(ServerProcessTest, SigtermDrainsInFlightGemmsAndExitsZero) {
  GemmClient client(channel_);
  std::mt19937_64 rng(5);
  // Enough CPU work (10 × 2·1500³ FLOP) that most of it is still queued when SIGTERM arrives.
  constexpr uint32_t kSize = 1500;
  std::vector<v1::GemmRequest> requests(6);
  std::vector<const v1::GemmRequest*> pointers;
  for (auto& r : requests) {
    r.set_m(kSize);
    r.set_n(kSize);
    r.set_k(kSize);
    auto a = RandomHalfMatrix(kSize * kSize, rng), b = RandomHalfMatrix(kSize * kSize, rng);
    r.set_a(reinterpret_cast<const char*>(a.data()), 2 * a.size());
    r.set_b(reinterpret_cast<const char*>(b.data()), 2 * b.size());
    pointers.push_back(&r);
  }
  std::vector<StreamedGemm> results;
  grpc::Status stream_status;
  std::chrono::steady_clock::time_point stream_done;
  std::thread caller([&] {
    stream_status = client.GemmStream(pointers, &results);
    stream_done = std::chrono::steady_clock::now();
  });
  // Unary calls in flight too.
  std::vector<grpc::Status> unary(4);
  std::vector<std::thread> unary_callers;
  for (int i = 0; i < 4; ++i) {
    unary_callers.emplace_back([&, i] {
      v1::GemmResponse response;
      unary[i] = client.Gemm(requests[i], &response);
    });
  }
  // SIGTERM once all 10 GEMMs are admitted (their requests fully received), most still queued.
  for (v1::ServerInfo info; info.load().admitted_total() < 10;) {
    std::this_thread::sleep_for(5ms);
    ASSERT_TRUE(client.GetServerInfo(&info).ok());
  }
  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  caller.join();
  for (auto& t : unary_callers) t.join();

  int wstatus = 0;
  ASSERT_EQ(waitpid(pid_, &wstatus, 0), pid_);
  const auto exited = std::chrono::steady_clock::now();
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  EXPECT_LT(exited - signalled, std::chrono::seconds(kDrainDeadlineSeconds));
  EXPECT_GT(stream_done, signalled) << "the stream ended before SIGTERM: nothing was drained";
  ASSERT_TRUE(stream_status.ok()) << stream_status.error_message();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    std::vector<float> reference = ReferenceGemm(
        reinterpret_cast<const uint16_t*>(requests[i].a().data()),
        reinterpret_cast<const uint16_t*>(requests[i].b().data()), kSize, kSize, kSize);
    EXPECT_LT(
        RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(results[i].response.c().data()),
                               reference.data(), reference.size()),
        kServiceTolerance.fp32_acc);
  }
  for (const grpc::Status& s : unary) EXPECT_TRUE(s.ok()) << s.error_message();
}

class JsonLogProcessTest : public ServerProcessTest {
 protected:
  void SetUp() override {
    log_path_ = std::string(std::getenv("TEST_TMPDIR")) + "/hgemm_server_json.log";
    Launch({"--log_format=json"}, {}, log_path_);
  }

  // SIGTERM, exit, and every line the process wrote.
  std::vector<std::string> StopAndReadLog() {
    EXPECT_EQ(kill(pid_, SIGTERM), 0);
    int wstatus = 0;
    EXPECT_EQ(waitpid(pid_, &wstatus, 0), pid_);
    pid_ = -1;
    EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    std::ifstream in(log_path_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::string log_path_;
};

TEST_F(JsonLogProcessTest, EveryLineIsJsonAndCallsCarryTheirFields) {
  const std::string trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  // A forged traceparent trying to close the JSON string and add a level of its own.
  const std::string forged = "00-4bf92f3577b34da6a\\\"}{\"level\":\"critical\"-00f067aa0ba902b7-01";
  EXPECT_EQ(RunClient({"--shape=8x8x8", "--request_id=ok-1", "--traceparent=" + trace}), 0);
  EXPECT_NE(RunClient({"--shape=8x8x8", "--kernel=warp_drive", "--request_id=refused-1",
                       "--traceparent=" + trace}),
            0);
  EXPECT_NE(RunClient({"--shape=8x8x8", "--kernel=warp_drive", "--request_id=refused-2",
                       "--traceparent=" + forged}),
            0);
  EXPECT_NE(RunClient({"--shape=8x8x8", "--mode=stream", "--kernel=warp_drive",
                       "--request_id=refused-3", "--traceparent=" + trace}),
            0);
  const std::vector<std::string> lines = StopAndReadLog();
  ASSERT_GT(lines.size(), 5u);
  std::vector<nlohmann::json> refused, streamed, gemms;
  for (const std::string& line : lines) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      ADD_FAILURE() << "not JSON: " << line << " (" << e.what() << ")";
      continue;
    }
    ASSERT_TRUE(j.is_object()) << line;
    for (const char* key : {"time", "level", "message"}) {
      EXPECT_TRUE(j.contains(key) && j[key].is_string()) << key << " missing in " << line;
    }
    if (j.contains("rpc") && j["rpc"] == "Gemm") refused.push_back(j);
    if (j.contains("gemm_id") && j["rpc"] == "GemmStream") streamed.push_back(j);
    if (j.value("message", "").rfind("gemm 8x8x8", 0) == 0) gemms.push_back(j);
  }
  ASSERT_EQ(refused.size(), 2u);
  for (const nlohmann::json& r : refused) {
    EXPECT_EQ(r["level"], "info");
    EXPECT_EQ(r["code"], "INVALID_ARGUMENT");
    EXPECT_NE(r["reason"].get<std::string>().find("warp_drive"), std::string::npos) << r;
    EXPECT_EQ(r["peer"].get<std::string>().rfind("ipv4:127.0.0.1:", 0), 0u) << r;
    EXPECT_EQ(r["principal"], "ipv4:127.0.0.1")
        << "without authentication the caller is its address";
  }
  EXPECT_EQ(refused[0]["request_id"], "refused-1");
  EXPECT_EQ(refused[0]["traceparent"], trace);
  EXPECT_EQ(refused[1]["request_id"], "refused-2");
  EXPECT_EQ(refused[1]["traceparent"], "") << "a malformed traceparent is dropped";
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find("critical"), std::string::npos) << "logged verbatim: " << line;
  }
  // A GEMM refused inside a stream: its own line, with the stream's trace context.
  ASSERT_EQ(streamed.size(), 1u);
  EXPECT_EQ(streamed[0]["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(streamed[0]["gemm_id"], "0");
  EXPECT_EQ(streamed[0]["request_id"], "refused-3");
  EXPECT_EQ(streamed[0]["traceparent"], trace);
  // The per-GEMM debug line of the call that ran.
  ASSERT_EQ(gemms.size(), 1u);
  EXPECT_EQ(gemms[0]["level"], "debug");
  EXPECT_EQ(gemms[0]["request_id"], "ok-1");
  EXPECT_EQ(gemms[0]["traceparent"], trace);
}

// Same host, the real binaries: hgemm_client --transport=shm over the server's Unix socket
// (--allow_shared_memory) sends A, B and C through one sealed memfd and checks C against the
// fp32 reference; over TCP the server refuses it (PERMISSION_DENIED) and the client fails.
class ShmProcessTest : public ServerProcessTest {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/hgemm_shm_process_XXXXXX";  // short: a socket path has 107 bytes at most
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    Launch({"--listen=unix:" + dir_ + "/hgemm.sock", "--unix_socket_mode=0600",
            "--allow_shared_memory"},
           {});
  }
  void TearDown() override {
    ServerProcessTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(ShmProcessTest, ClientMultipliesThroughSharedMemory) {
  struct stat socket_file;  // the server's own listener gave it --unix_socket_mode
  ASSERT_EQ(stat((dir_ + "/hgemm.sock").c_str(), &socket_file), 0);
  EXPECT_EQ(socket_file.st_mode & 0777, 0600u);
  const std::string unix_target = "--server=unix:" + dir_ + "/hgemm.sock";
  EXPECT_EQ(
      RunClient({unix_target, "--transport=shm", "--shape=67x33x129", "--check", "--repeat=2"}), 0);
  EXPECT_EQ(RunClient({unix_target, "--shape=67x33x129", "--check"}), 0);  // gRPC, same socket
  EXPECT_NE(RunClient({"--transport=shm", "--shape=8x8x8"}), 0);           // over TCP: refused
}

}  // namespace
}  // namespace hgemm
