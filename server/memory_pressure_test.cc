// Memory pressure (issue 30), on the CPU backend's budget for resident memory: a real
// HgemmServer on 127.0.0.1 whose backend holds at most kBudget bytes of resident matrices,
// arriving operands and kept C's, and clients that together want several times that at once
// (resident uploads held to the end, GEMMs keeping C, streamed GEMMs whose operands arrive into
// that memory) beside unrelated unary GEMMs. What must hold, with LRU eviction off and on:
// - every unrelated unary GEMM is answered OK with a right C;
// - what does not fit is refused, never anything else: RESOURCE_EXHAUSTED naming the budget's
//   bytes (an upload or a kept C), or, for a streamed GEMM whose operands find the memory busy,
//   UNAVAILABLE naming it (the client retries with backoff); what is accepted is right;
// - without eviction uploads past the budget are refused; with it uploads and streamed
//   operands evict the least recently used matrices instead (NOT_FOUND from then on), and the
//   newest matrices read back exactly (a kept C is allocated by the backend's run, which does
//   not evict: it may still be refused);
// - once everything is released the whole budget is free again.
// tools/gpu_e2e.sh pressure runs the same mix against the CUDA backend.
#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

constexpr int64_t kBudget = 4 << 20;
constexpr uint32_t kRows = 256, kCols = 1024;  // one resident matrix: 512 KiB, 1/8 of the budget
constexpr double kTolerance = 1e-2;

// What the concurrent clients saw, by kind of call.
struct Tally {
  std::mutex mu;
  int ok = 0, refused = 0;
  std::vector<std::string> unexpected;  // statuses that must not happen
  std::vector<std::string> held;        // handles of the uploads kept, oldest first

  void Add(const grpc::Status& s, grpc::StatusCode refusal, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (s.ok()) {
      ok++;
    } else if (s.error_code() == refusal &&
               s.error_message().find(std::to_string(kBudget) + " bytes") != std::string::npos) {
      refused++;
    } else {
      unexpected.push_back(what + ": " + std::to_string(s.error_code()) + " " + s.error_message());
    }
  }
  void Wrong(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    unexpected.push_back(what);
  }
};

class MemoryPressureTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.service.resident.lru_eviction = GetParam();
    options.service.stream_chunk_bytes = 64 << 10;
    server_ = HgemmServer::Start(
        options, MakeCpuBackend({.workers = 2, .resident_budget_bytes = kBudget}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>("127.0.0.1:" + std::to_string(server_->port()));
  }

  CallOptions As(const std::string& client) const {
    return {.timeout = std::chrono::seconds(60), .chunk_bytes = 64 << 10, .client_id = client};
  }

  std::string RandomMatrix(std::mt19937_64& rng) const {
    const std::vector<uint16_t> m = RandomHalfMatrix(int64_t(kRows) * kCols, rng);
    return std::string(reinterpret_cast<const char*>(m.data()), 2 * m.size());
  }

  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_P(MemoryPressureTest, WhatDoesNotFitIsRefusedNamingTheBudgetAndNothingElseFails) {
  const bool lru = GetParam();
  Tally uploads, kept_c, streamed, unrelated;
  std::vector<std::string> last_upload(3);  // each uploader's newest matrix, as sent
  std::vector<std::thread> clients;
  // Three clients upload 12 matrices each and keep them: 18 MiB into a 4 MiB budget.
  for (int u = 0; u < 3; ++u) {
    clients.emplace_back([&, u] {
      std::mt19937_64 rng(100 + u);
      for (int i = 0; i < 12; ++i) {
        const std::string data = RandomMatrix(rng);
        v1::MatrixInfo info;
        grpc::Status s = client_->UploadMatrix(kRows, kCols, data, &info, 0, "", As("holder"));
        uploads.Add(s, grpc::StatusCode::RESOURCE_EXHAUSTED, "upload");
        if (s.ok()) {
          std::lock_guard<std::mutex> lock(uploads.mu);
          uploads.held.push_back(info.handle());
          last_upload[u] = info.handle() + "\n" + data;
        }
      }
    });
  }
  // GEMMs whose 512 KiB C stays resident (held to the end).
  clients.emplace_back([&] {
    std::mt19937_64 rng(200);
    for (int i = 0; i < 8; ++i) {
      v1::GemmRequest r = RandomRequest(kRows, kCols, 16, rng);
      r.set_keep_c_resident(true);
      v1::GemmResponse response;
      kept_c.Add(client_->Gemm(r, &response, As("keeper")), grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "keep_c");
    }
  });
  // Streamed GEMMs: their operands arrive into the same memory, then are freed.
  clients.emplace_back([&] {
    std::mt19937_64 rng(300);
    for (int i = 0; i < 8; ++i) {
      const v1::GemmRequest r = RandomRequest(96, 80, 1024, rng);
      std::vector<StreamedGemm> results;
      grpc::Status s = client_->GemmStream({&r}, &results, As("streamer"));
      if (!s.ok()) {
        streamed.Wrong("stream: " + s.error_message());
        continue;
      }
      streamed.Add(results[0].status, grpc::StatusCode::UNAVAILABLE, "streamed");
      if (results[0].status.ok() && !(RelativeErrorOfC(r, results[0].response.c()) < kTolerance)) {
        streamed.Wrong("streamed: a wrong C");
      }
    }
  });
  // Unrelated unary GEMMs, inline operands: none may fail.
  clients.emplace_back([&] {
    std::mt19937_64 rng(400);
    for (int i = 0; i < 24; ++i) {
      const v1::GemmRequest r = RandomRequest(64 + i, 48, 200, rng);
      v1::GemmResponse response;
      grpc::Status s = client_->Gemm(r, &response, As("bystander"));
      unrelated.Add(s, grpc::StatusCode::OK, "unrelated");
      if (s.ok() && !(RelativeErrorOfC(r, response.c()) < kTolerance)) {
        unrelated.Wrong("unrelated: a wrong C");
      }
    }
  });
  for (std::thread& t : clients) t.join();

  std::printf("LRU %-3s | uploads %2d ok %2d refused | keep_c %d ok %d refused | streamed %d ok %d "
              "refused | unrelated %d ok\n",
              lru ? "on" : "off", uploads.ok, uploads.refused, kept_c.ok, kept_c.refused,
              streamed.ok, streamed.refused, unrelated.ok);
  for (Tally* t : {&uploads, &kept_c, &streamed, &unrelated}) {
    EXPECT_TRUE(t->unexpected.empty()) << t->unexpected.front();
  }
  EXPECT_EQ(unrelated.ok, 24);
  EXPECT_EQ(uploads.ok + uploads.refused, 36);
  if (lru) {
    // Each upload, and each streamed GEMM's operands, evict the least recently used matrices
    // they need room for.
    EXPECT_EQ(uploads.refused, 0);
    EXPECT_EQ(streamed.refused, 0);
    int evicted = 0;
    for (const std::string& handle : uploads.held) {
      std::string data;
      grpc::Status s = client_->DownloadMatrix(handle, &data, As("holder"));
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) evicted++;
      else EXPECT_TRUE(s.ok()) << s.error_message();
    }
    EXPECT_GE(evicted, 36 - int(kBudget / (2 * kRows * kCols)));
  } else {
    EXPECT_GT(uploads.refused, 0) << "the uploads never passed the budget";
    EXPECT_LE(uploads.ok, int(kBudget / (2 * kRows * kCols)));
  }
  // The newest matrix of each uploader that kept one reads back exactly (unless a later
  // upload of another client evicted it).
  for (const std::string& newest : last_upload) {
    if (newest.empty()) continue;
    const std::string handle = newest.substr(0, newest.find('\n'));
    std::string data;
    grpc::Status s = client_->DownloadMatrix(handle, &data, As("holder"));
    if (lru && s.error_code() == grpc::StatusCode::NOT_FOUND) continue;
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(data == newest.substr(newest.find('\n') + 1)) << handle << " differs";
  }

  // Released, the whole budget is free again: one matrix of exactly the budget fits.
  for (const char* client : {"holder", "keeper"}) {
    v1::ListMatricesResponse list;
    ASSERT_TRUE(client_->ListMatrices(&list, As(client)).ok());
    for (const v1::MatrixInfo& m : list.matrices()) {
      ASSERT_TRUE(client_->ReleaseMatrix(m.handle(), As(client)).ok());
    }
  }
  std::mt19937_64 rng(500);
  std::string whole;
  for (int i = 0; i < 8; ++i) whole += RandomMatrix(rng);
  ASSERT_EQ(int64_t(whole.size()), kBudget);
  v1::MatrixInfo info;
  grpc::Status s = client_->UploadMatrix(8 * kRows, kCols, whole, &info, 0, "", As("holder"));
  EXPECT_TRUE(s.ok()) << "the budget did not come back: " << s.error_message();
}

INSTANTIATE_TEST_SUITE_P(Eviction, MemoryPressureTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "LruOn" : "LruOff";
                         });

}  // namespace
}  // namespace hgemm
