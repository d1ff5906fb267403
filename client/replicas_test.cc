// Resident matrices over several replicas: three hgemm_server processes on 127.0.0.1,
// each with --advertise_address, behind one multi-address target. Through the client library:
//   * handles name their replica, GetServerInfo says which replica answered, and balanced calls
//     reach all three;
//   * several threads each run 100 cycles of upload → Gemm by handle keeping C → chain C →
//     download → release, every result checked against an fp32 reference;
//   * a GEMM naming handles of two replicas is refused before it is sent, naming both;
//   * a killed replica fails the calls naming its handles (UNAVAILABLE, "upload them again")
//     and nothing else;
// and the hgemm_client binary's --resident=all --repeat=20 --check over the same target.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/testing/child_process.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;
using subprocess::ChildProcess;

constexpr int kReplicas = 3;
constexpr double kFp32Tolerance = kServiceTolerance.fp32_acc;  // fp32 accumulation, fp16 output

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ‖c − a·b‖ / ‖a·b‖ with the fp32-accumulated reference; a, b, c as fp16 bytes.
double ErrorOf(const std::string& c, const std::string& a, const std::string& b, int64_t m,
               int64_t n, int64_t k) {
  EXPECT_EQ(int64_t(c.size()), 2 * m * n);
  if (int64_t(c.size()) != 2 * m * n) return 1e9;
  const std::vector<float> reference =
      ReferenceGemm(reinterpret_cast<const uint16_t*>(a.data()),
                    reinterpret_cast<const uint16_t*>(b.data()), m, n, k);
  return RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()), reference.data(),
                                m * n);
}

class ReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < kReplicas; ++i) {
      const int port = subprocess::FreePort();
      addresses_.push_back("127.0.0.1:" + std::to_string(port));
      servers_.push_back(std::make_unique<subprocess::ServerProcess>(
          std::vector<std::string>{"--backend=cpu", "--cpu_workers=2",
                                   "--advertise_address=" + addresses_[i]},
          port));
      target_ += (i == 0 ? "ipv4:" : ",") + addresses_[i];
    }
    for (int i = 0; i < kReplicas; ++i) {
      ASSERT_TRUE(servers_[i]->WaitUntilListening())
          << "replica " << addresses_[i] << " did not come up:\n"
          << servers_[i]->process().Output();
    }
    client_ = std::make_unique<GemmClient>(target_);
  }

  // Uploads `values` (rows×cols) to `replica` ("" : balanced); returns its handle.
  std::string Upload(const std::string& replica, uint32_t rows, uint32_t cols,
                     const std::string& values, v1::MatrixInfo* info = nullptr) {
    CallOptions call;
    call.replica = replica;
    v1::MatrixInfo uploaded;
    grpc::Status s = client_->UploadMatrix(rows, cols, values, &uploaded, 0, "", call);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (info != nullptr) *info = uploaded;
    return uploaded.handle();
  }

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<subprocess::ServerProcess>> servers_;
  std::string target_;
  std::unique_ptr<GemmClient> client_;
};

// Which replicas answer `calls` balanced GetServerInfo calls.
std::set<std::string> Answering(const GemmClient& client, int calls) {
  std::set<std::string> answered;
  for (int i = 0; i < calls; ++i) {
    v1::ServerInfo info;
    EXPECT_TRUE(client.GetServerInfo(&info).ok());
    answered.insert(info.replica());
  }
  return answered;
}

TEST_F(ReplicasTest, HandlesAndServerInfoNameTheReplica) {
  const std::set<std::string> all(addresses_.begin(), addresses_.end());
  // round_robin balances over the replicas it has connected to, at first maybe fewer than all;
  // once all are connected, consecutive calls take turns.
  for (int i = 0; i < 1000 && Answering(*client_, kReplicas) != all; ++i) {
  }
  EXPECT_EQ(Answering(*client_, kReplicas), all);

  std::mt19937_64 rng(1);
  for (const std::string& replica : addresses_) {
    v1::MatrixInfo info;
    const std::string handle = Upload(replica, 4, 4, HalfBytes(RandomHalfMatrix(16, rng)), &info);
    EXPECT_EQ(info.replica(), replica);
    EXPECT_EQ(GemmClient::ReplicaOf(handle), replica);
    EXPECT_EQ(handle.substr(handle.size() - replica.size() - 1), "@" + replica);
    EXPECT_TRUE(client_->ReleaseMatrix(handle).ok());
  }
}

// The issue's cycle, from several threads at once, each cycle on fresh random inputs.
TEST_F(ReplicasTest, ConcurrentResidentCyclesAreCorrect) {
  constexpr int kThreads = 4, kCycles = 100;
  std::mutex mu;
  std::map<std::string, int> cycles_by_replica;  // guarded by mu
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      CallOptions call;
      call.client_id = "cycler-" + std::to_string(t);
      for (int cycle = 0; cycle < kCycles; ++cycle) {
        SCOPED_TRACE("thread " + std::to_string(t) + " cycle " + std::to_string(cycle));
        const uint32_t m = 8 + rng() % 40, k = 8 + rng() % 40, n = 8 + rng() % 40,
                       p = 8 + rng() % 40;
        const std::string a = HalfBytes(RandomHalfMatrix(int64_t(m) * k, rng));
        const std::string b = HalfBytes(RandomHalfMatrix(int64_t(k) * n, rng));
        const std::string b2 = HalfBytes(RandomHalfMatrix(int64_t(n) * p, rng));
        // A balanced, B onto A's replica.
        v1::MatrixInfo a_info, b_info;
        CallOptions upload = call;
        grpc::Status s = client_->UploadMatrix(m, k, a, &a_info, 0, "A", upload);
        ASSERT_TRUE(s.ok()) << s.error_message();
        upload.replica = a_info.replica();
        s = client_->UploadMatrix(k, n, b, &b_info, 0, "B", upload);
        ASSERT_TRUE(s.ok()) << s.error_message();
        ASSERT_EQ(b_info.replica(), a_info.replica());

        v1::GemmRequest keep;
        keep.set_m(m);
        keep.set_n(n);
        keep.set_k(k);
        keep.set_a_handle(a_info.handle());
        keep.set_b_handle(b_info.handle());
        keep.set_keep_c_resident(true);
        v1::GemmResponse kept;
        s = client_->Gemm(keep, &kept, call);
        ASSERT_TRUE(s.ok()) << s.error_message();
        const std::string c_handle = kept.c_matrix().handle();
        ASSERT_EQ(kept.c_matrix().replica(), a_info.replica());

        v1::GemmRequest chain;  // D = C·B2, C by handle
        chain.set_m(m);
        chain.set_n(p);
        chain.set_k(n);
        chain.set_a_handle(c_handle);
        chain.set_b(b2);
        v1::GemmResponse chained;
        s = client_->Gemm(chain, &chained, call);
        ASSERT_TRUE(s.ok()) << s.error_message();

        std::string c;
        s = client_->DownloadMatrix(c_handle, &c, call);
        ASSERT_TRUE(s.ok()) << s.error_message();
        EXPECT_LE(ErrorOf(c, a, b, m, n, k), kFp32Tolerance);
        EXPECT_LE(ErrorOf(chained.c(), c, b2, m, p, n), kFp32Tolerance);

        for (const std::string& handle : {a_info.handle(), b_info.handle(), c_handle}) {
          s = client_->ReleaseMatrix(handle, call);
          EXPECT_TRUE(s.ok()) << s.error_message();
        }
        std::lock_guard<std::mutex> lock(mu);
        ++cycles_by_replica[a_info.replica()];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The balanced uploads reached every replica.
  std::set<std::string> reached;
  for (const auto& [replica, count] : cycles_by_replica) reached.insert(replica);
  EXPECT_EQ(reached, std::set<std::string>(addresses_.begin(), addresses_.end()));
  // Nothing is left behind on any replica.
  for (int t = 0; t < kThreads; ++t) {
    for (const std::string& replica : addresses_) {
      CallOptions call;
      call.client_id = "cycler-" + std::to_string(t);
      call.replica = replica;
      v1::ListMatricesResponse list;
      ASSERT_TRUE(client_->ListMatrices(&list, call).ok());
      EXPECT_EQ(list.matrices_size(), 0) << replica;
    }
  }
}

// Run with parallel parts over the balanced target: A's and B's uploads are made at once and
// may land on two replicas; the GEMM must still run where both live, every C right. A resident
// B pins the upload of A to B's replica.
TEST_F(ReplicasTest, ParallelPartsLandBothUploadsOnOneReplica) {
  const std::set<std::string> all(addresses_.begin(), addresses_.end());
  for (int i = 0; i < 1000 && Answering(*client_, kReplicas) != all; ++i) {
  }
  ASSERT_EQ(Answering(*client_, kReplicas), all);  // balanced calls take turns from here
  std::mt19937_64 rng(7);
  CallOptions call;
  call.parallel_parts = 2;
  call.parallel_min_bytes = 0;
  // A fresh 24×16×40 GEMM, A and B sent (B's bytes also in `b`).
  std::string b;
  auto gemm = [&] {
    b = HalfBytes(RandomHalfMatrix(40 * 16, rng));
    v1::GemmRequest request;
    request.set_m(24);
    request.set_n(16);
    request.set_k(40);
    request.set_a(HalfBytes(RandomHalfMatrix(24 * 40, rng)));
    request.set_b(b);
    return request;
  };
  for (int i = 0; i < 12; ++i) {
    const v1::GemmRequest request = gemm();
    v1::GemmResponse response;
    grpc::Status s = client_->Run(request, &response, call);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(ErrorOf(response.c(), request.a(), b, 24, 16, 40), kFp32Tolerance);
  }
  for (const std::string& replica : addresses_) {
    v1::GemmRequest request = gemm();
    const std::string b_handle = Upload(replica, 40, 16, b);
    request.set_b_handle(b_handle);  // B resident there instead of sent
    v1::GemmResponse response;
    grpc::Status s = client_->Run(request, &response, call);
    ASSERT_TRUE(s.ok()) << replica << ": " << s.error_message();
    EXPECT_LT(ErrorOf(response.c(), request.a(), b, 24, 16, 40), kFp32Tolerance);
    EXPECT_TRUE(client_->ReleaseMatrix(b_handle).ok());
  }
  // With no resident operand the uploads go where CallOptions::replica says: a replica that
  // is gone fails the GEMM instead of it running elsewhere.
  servers_[2]->process().Kill(SIGKILL);
  // Balanced calls learn that it is gone and go to the two left (a run of answered calls).
  int answered_in_a_row = 0;
  for (int i = 0; i < 1000 && answered_in_a_row < 6; ++i) {
    v1::ServerInfo info;
    answered_in_a_row = client_->GetServerInfo(&info).ok() ? answered_in_a_row + 1 : 0;
  }
  ASSERT_EQ(answered_in_a_row, 6);
  CallOptions there = call;
  there.replica = addresses_[2];
  v1::GemmResponse response;
  EXPECT_EQ(client_->Run(gemm(), &response, there).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ReplicasTest, HandlesOfTwoReplicasInOneGemmAreRefusedBeforeSending) {
  std::mt19937_64 rng(2);
  const std::string a = HalfBytes(RandomHalfMatrix(8 * 8, rng)),
                    b = HalfBytes(RandomHalfMatrix(8 * 8, rng));
  const std::string a_handle = Upload(addresses_[0], 8, 8, a);
  const std::string b_handle = Upload(addresses_[1], 8, 8, b);
  const std::string b_with_a = Upload(addresses_[0], 8, 8, b);
  v1::GemmRequest mixed;
  mixed.set_m(8);
  mixed.set_n(8);
  mixed.set_k(8);
  mixed.set_a_handle(a_handle);
  mixed.set_b_handle(b_handle);
  v1::GemmResponse response;
  const grpc::Status s = client_->Gemm(mixed, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  for (const std::string& part : {a_handle, b_handle, addresses_[0], addresses_[1]}) {
    EXPECT_TRUE(Contains(s.error_message(), part)) << s.error_message();
  }
  // On a GemmStream the mixed GEMM fails alone; the one beside it runs on A's replica.
  v1::GemmRequest together = mixed;
  together.set_b_handle(b_with_a);
  std::vector<StreamedGemm> results;
  ASSERT_TRUE(client_->GemmStream({&mixed, &together}, &results).ok());
  EXPECT_EQ(results[0].status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(results[1].status.ok()) << results[1].status.error_message();
  EXPECT_LE(ErrorOf(results[1].response.c(), a, b, 8, 8, 8), kFp32Tolerance);
  // The servers saw no GEMM naming the mixed pair.
  uint64_t admitted = 0;
  for (const std::string& replica : addresses_) {
    CallOptions call;
    call.replica = replica;
    v1::ServerInfo info;
    ASSERT_TRUE(client_->GetServerInfo(&info, call).ok());
    admitted += info.load().admitted_total();
  }
  EXPECT_EQ(admitted, 1u);
}

TEST_F(ReplicasTest, AGoneReplicaFailsOnlyTheCallsNamingItsHandles) {
  std::mt19937_64 rng(3);
  const std::string a = HalfBytes(RandomHalfMatrix(16 * 16, rng)),
                    b = HalfBytes(RandomHalfMatrix(16 * 16, rng));
  std::vector<std::string> handles;
  for (const std::string& replica : addresses_) handles.push_back(Upload(replica, 16, 16, a));
  auto gemm_with = [&](const std::string& handle, v1::GemmResponse* response) {
    v1::GemmRequest r;
    r.set_m(16);
    r.set_n(16);
    r.set_k(16);
    r.set_a_handle(handle);
    r.set_b(b);
    return client_->Gemm(r, response);
  };
  v1::GemmResponse response;
  ASSERT_TRUE(gemm_with(handles[1], &response).ok());  // its channel is open and ready

  servers_[1]->process().Kill(SIGKILL);

  auto expect_gone = [&](const grpc::Status& s, const char* call) {
    SCOPED_TRACE(call);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_TRUE(Contains(s.error_message(), "replica " + addresses_[1] + " cannot be reached"))
        << s.error_message();
    EXPECT_TRUE(Contains(s.error_message(), "upload them again")) << s.error_message();
  };
  expect_gone(gemm_with(handles[1], &response), "Gemm");
  std::string downloaded;
  expect_gone(client_->DownloadMatrix(handles[1], &downloaded), "DownloadMatrix");
  expect_gone(client_->ReleaseMatrix(handles[1]), "ReleaseMatrix");
  v1::GemmRequest streamed;
  streamed.set_m(16);
  streamed.set_n(16);
  streamed.set_k(16);
  streamed.set_a_handle(handles[1]);
  streamed.set_b(b);
  std::vector<StreamedGemm> results;
  expect_gone(client_->GemmStream({&streamed}, &results), "GemmStream");

  // Everything else goes on: the other replicas' handles, and balanced calls.
  for (int i : {0, 2}) {
    ASSERT_TRUE(gemm_with(handles[i], &response).ok());
    EXPECT_LE(ErrorOf(response.c(), a, b, 16, 16, 16), kFp32Tolerance);
    EXPECT_TRUE(client_->ReleaseMatrix(handles[i]).ok());
  }
  std::set<std::string> answered;
  for (int i = 0; i < 20; ++i) {  // three balanced calls a round: both replicas answer some
    v1::GemmRequest r;
    r.set_m(16);
    r.set_n(16);
    r.set_k(16);
    r.set_a(a);
    r.set_b(b);
    grpc::Status s = client_->Gemm(r, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LE(ErrorOf(response.c(), a, b, 16, 16, 16), kFp32Tolerance);
    v1::MatrixInfo info;
    s = client_->UploadMatrix(16, 16, a, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    answered.insert(info.replica());
    EXPECT_TRUE(client_->ReleaseMatrix(info.handle()).ok());
    v1::ServerInfo server_info;
    ASSERT_TRUE(client_->GetServerInfo(&server_info).ok());
    answered.insert(server_info.replica());
  }
  EXPECT_EQ(answered, (std::set<std::string>{addresses_[0], addresses_[2]}));
}

// The issue's done-when, as a test: the CLI over three replicas keeps a GEMM's matrices together.
TEST_F(ReplicasTest, HgemmClientResidentAllOverThreeReplicas) {
  ChildProcess cli(subprocess::RunfilePath("client/hgemm_client"),
                   {"--server=" + target_, "--resident=all", "--repeat=20", "--check",
                    "--shape=64x48x40", "--timeout_s=60"});
  ASSERT_EQ(cli.Wait(), 0) << cli.Output();
  EXPECT_TRUE(Contains(cli.Output(), "uploaded A and B once to replica ")) << cli.Output();
  EXPECT_TRUE(Contains(cli.Output(), "(tolerance 1e-03): OK")) << cli.Output();
}

}  // namespace
}  // namespace hgemm
