// Memory pressure, on the CPU backend's budget for resident memory: a real
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
// Against another server (tools/gpu_e2e.sh pressure: hgemm_server --backend=cuda, LRU eviction
// off, then on): HGEMM_PRESSURE_TARGET=HOST:PORT, with HGEMM_PRESSURE_ROWS (rows of each
// resident matrix of 1024 columns) and HGEMM_PRESSURE_UPLOADS (per uploader) sized so that the
// uploads pass the device's memory. The instance whose LRU setting differs from the server's
// is skipped; a refusal must then name the bytes it asked for (its budget is unknown here).
// Prints one table row per run.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "server/backend/cpu_backend.h"
#include "server/backend/device_memory.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

constexpr int64_t kBudget = 4 << 20;  // of the test's own CPU server
constexpr uint32_t kCols = 1024;
constexpr double kTolerance = 1e-2;

// An environment variable's value, or `otherwise`.
std::string Env(const char* name, const std::string& otherwise = "") {
  const char* value = std::getenv(name);
  return value != nullptr ? value : otherwise;
}

// What the concurrent clients saw, by kind of call. A refusal must name `bytes` (the budget of
// the test's own server, else what was asked for: any of them).
struct Tally {
  std::mutex mu;
  int ok = 0, refused = 0;
  std::vector<std::string> unexpected;  // statuses that must not happen
  std::vector<std::string> held;        // handles of the uploads kept, oldest first

  void Add(const grpc::Status& s, grpc::StatusCode refusal, const std::string& what,
           const std::vector<int64_t>& bytes) {
    std::lock_guard<std::mutex> lock(mu);
    bool named = false;
    for (int64_t b : bytes) {
      named = named || s.error_message().find(std::to_string(b)) != std::string::npos;
    }
    if (s.ok()) {
      ok++;
    } else if (s.error_code() == refusal && named) {
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
    if (!target_.empty()) {
      client_ = std::make_unique<GemmClient>(target_);
      v1::ServerInfo info;
      grpc::Status s = client_->GetServerInfo(&info);
      ASSERT_TRUE(s.ok()) << target_ << ": " << s.error_message();
      if (info.limits().resident_lru_eviction() != GetParam()) {
        GTEST_SKIP() << "the server at " << target_ << " has LRU eviction "
                     << (GetParam() ? "off" : "on");
      }
      return;
    }
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.service.resident.lru_eviction = GetParam();
    options.service.stream_chunk_bytes = 64 << 10;
    server_ = HgemmServer::Start(options,
                                 MakeCpuBackend({.workers = 2, .resident_budget_bytes = kBudget}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>("127.0.0.1:" + std::to_string(server_->port()));
  }

  CallOptions As(const std::string& client) const {
    return {.timeout = std::chrono::seconds(60), .chunk_bytes = 64 << 10, .client_id = client};
  }

  std::string RandomMatrix(uint32_t rows, std::mt19937_64& rng) const {
    const std::vector<uint16_t> m = RandomHalfMatrix(int64_t(rows) * kCols, rng);
    return std::string(reinterpret_cast<const char*>(m.data()), 2 * m.size());
  }
  // A refusal names these bytes: the own server's budget, or any of `asked`, as asked or
  // rounded up to the CUDA backend's size class.
  std::vector<int64_t> Named(const std::vector<int64_t>& asked) const {
    if (target_.empty()) return {kBudget};
    std::vector<int64_t> named = asked;
    for (int64_t bytes : asked) named.push_back(DeviceMemory::SizeClass(bytes));
    return named;
  }

  const std::string target_ = Env("HGEMM_PRESSURE_TARGET");
  // One resident matrix: 512 KiB by default, 1/8 of the own server's budget.
  const uint32_t rows_ = uint32_t(std::stoul(Env("HGEMM_PRESSURE_ROWS", "256")));
  const int uploads_each_ = std::stoi(Env("HGEMM_PRESSURE_UPLOADS", "12"));
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_P(MemoryPressureTest, WhatDoesNotFitIsRefusedNamingTheBytesAndNothingElseFails) {
  const bool lru = GetParam();
  const int64_t matrix_bytes = 2 * int64_t(rows_) * kCols;
  const int total_uploads = 3 * uploads_each_;
  Tally uploads, kept_c, streamed, unrelated;
  std::vector<std::string> newest(3);  // each uploader's newest handle
  std::vector<std::string> contents(3);
  std::vector<std::thread> clients;
  // Three clients upload matrices (by default 12 of 512 KiB each: 18 MiB into a 4 MiB budget)
  // and keep them.
  for (int u = 0; u < 3; ++u) {
    clients.emplace_back([&, u] {
      std::mt19937_64 rng(100 + u);
      contents[u] = RandomMatrix(rows_, rng);
      for (int i = 0; i < uploads_each_; ++i) {
        v1::MatrixInfo info;
        grpc::Status s =
            client_->UploadMatrix(rows_, kCols, contents[u], &info, 0, "", As("holder"));
        uploads.Add(s, grpc::StatusCode::RESOURCE_EXHAUSTED, "upload", Named({matrix_bytes}));
        if (s.ok()) {
          std::lock_guard<std::mutex> lock(uploads.mu);
          uploads.held.push_back(info.handle());
          newest[u] = info.handle();
        }
      }
    });
  }
  // GEMMs whose C (the size of a resident matrix) stays resident, held to the end.
  clients.emplace_back([&] {
    std::mt19937_64 rng(200);
    for (int i = 0; i < 8; ++i) {
      v1::GemmRequest r = RandomRequest(rows_, kCols, 16, rng);
      r.set_keep_c_resident(true);
      v1::GemmResponse response;
      kept_c.Add(client_->Gemm(r, &response, As("keeper")), grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "keep_c", Named({matrix_bytes}));
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
      streamed.Add(results[0].status, grpc::StatusCode::UNAVAILABLE, "streamed",
                   Named({2 * 96 * 1024, 2 * 1024 * 80}));
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
      unrelated.Add(s, grpc::StatusCode::OK, "unrelated", {});
      if (s.ok() && !(RelativeErrorOfC(r, response.c()) < kTolerance)) {
        unrelated.Wrong("unrelated: a wrong C");
      }
    }
  });
  for (std::thread& t : clients) t.join();

  std::printf(
      "LRU %-3s | uploads of %lld bytes: %d ok, %d refused | keep_c: %d ok, %d refused | "
      "streamed: %d ok, %d refused | unrelated: %d ok of 24\n",
      lru ? "on" : "off", static_cast<long long>(matrix_bytes), uploads.ok, uploads.refused,
      kept_c.ok, kept_c.refused, streamed.ok, streamed.refused, unrelated.ok);
  for (Tally* t : {&uploads, &kept_c, &streamed, &unrelated}) {
    EXPECT_TRUE(t->unexpected.empty()) << t->unexpected.front();
  }
  EXPECT_EQ(unrelated.ok, 24);
  EXPECT_EQ(uploads.ok + uploads.refused, total_uploads);
  // The newest matrix of each uploader that kept one reads back exactly (unless evicted).
  for (int u = 0; u < 3; ++u) {
    if (newest[u].empty()) continue;
    std::string data;
    grpc::Status s = client_->DownloadMatrix(newest[u], &data, As("holder"));
    if (lru && s.error_code() == grpc::StatusCode::NOT_FOUND) continue;
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(data == contents[u]) << newest[u] << " differs from its upload";
  }
  const int fit = int(kBudget / matrix_bytes);  // in the own server's budget
  if (lru) {
    // Each upload, and each streamed GEMM's operands, evict the least recently used matrices
    // they need room for.
    EXPECT_EQ(uploads.refused, 0);
    EXPECT_EQ(streamed.refused, 0);
    int evicted = 0;
    for (const std::string& handle : uploads.held) {
      grpc::Status s = client_->ReleaseMatrix(handle, As("holder"));
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        evicted++;
      } else {
        EXPECT_TRUE(s.ok()) << s.error_message();
      }
    }
    EXPECT_GT(evicted, 0);
    if (target_.empty()) {
      EXPECT_GE(evicted, total_uploads - fit);
    }
  } else {
    EXPECT_GT(uploads.refused, 0) << "the uploads never passed the memory";
    if (target_.empty()) {
      EXPECT_LE(uploads.ok, fit);
    }
  }

  // Released, nothing stays held; on the own server the whole budget fits again.
  for (const char* client : {"holder", "keeper"}) {
    v1::ListMatricesResponse list;
    ASSERT_TRUE(client_->ListMatrices(&list, As(client)).ok());
    for (const v1::MatrixInfo& m : list.matrices()) {
      ASSERT_TRUE(client_->ReleaseMatrix(m.handle(), As(client)).ok());
    }
    ASSERT_TRUE(client_->ListMatrices(&list, As(client)).ok());
    EXPECT_EQ(list.client_bytes(), 0) << client;
  }
  if (!target_.empty()) return;
  std::mt19937_64 rng(500);
  const uint32_t budget_rows = uint32_t(kBudget / (2 * kCols));
  v1::MatrixInfo info;
  grpc::Status s = client_->UploadMatrix(budget_rows, kCols, RandomMatrix(budget_rows, rng), &info,
                                         0, "", As("holder"));
  EXPECT_TRUE(s.ok()) << "the budget did not come back: " << s.error_message();
}

INSTANTIATE_TEST_SUITE_P(Eviction, MemoryPressureTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "LruOn" : "LruOff";
                         });

}  // namespace
}  // namespace hgemm
