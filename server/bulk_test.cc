// The bulk channel end to end (proto/hgemm.proto, "Bulk channel"): a real HgemmServer on
// 127.0.0.1 (CPU backend) with --bulk_listen, GemmClient's parallel parts over it, and every
// door of it tried by a hostile peer: capabilities reused, guessed, expired or another
// principal's, broken hellos, silent and cut connections, too many of them. The server keeps
// serving through all of it.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "client/bulk_lane.h"
#include "client/gemm_client.h"
#include "client/metrics_scrape.h"
#include "proto/bulk_wire.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;

class BulkTest : public ::testing::Test {
 protected:
  void Start(bool bulk = true) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    if (bulk) options.bulk.address = "127.0.0.1:0";
    options.bulk.max_connections = 4;
    options.bulk.hello_timeout = 300ms;
    options.bulk.idle_timeout = 1000ms;
    options.bulk.chunk_bytes = 4096;  // many reads and writes per lane
    options.bulk_grants.max_lanes = 8;
    options.bulk_grants.lifetime = lifetime_;
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>(address());
    stub_ = v1::GemmService::NewStub(Connect(address()));
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  BulkEndpoint endpoint() const { return {"127.0.0.1", uint32_t(server_->bulk_port())}; }

  CallOptions As(const std::string& client_id) const {
    CallOptions options;
    options.client_id = client_id;
    options.parallel_parts = 3;
    options.parallel_min_bytes = 0;
    return options;
  }

  std::string RandomBytes(size_t n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = char(rng_() | 1);  // never all zeros
    return bytes;
  }

  // An upload of `client_id` (rows × cols fp16) waiting for its bytes.
  std::string NewUpload(const std::string& client_id, uint32_t rows, uint32_t cols) {
    v1::MatrixInfo info;
    grpc::Status s =
        client_->CreateUpload(rows, cols, v1::DATA_TYPE_FP16, false, &info, As(client_id));
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info.handle();
  }

  grpc::Status Open(const std::string& client_id, const std::string& handle,
                    v1::BulkDirection direction, uint64_t offset, uint64_t length, int lanes,
                    v1::BulkGrant* grant) {
    grpc::ClientContext context;
    context.AddMetadata("x-client-id", client_id);
    v1::BulkRequest request;
    request.set_handle(handle);
    request.set_direction(direction);
    request.set_offset(offset);
    request.set_length(length);
    request.set_lanes(lanes);
    return stub_->OpenBulk(&context, request, grant);
  }

  uint64_t Missing(const std::string& client_id, const std::string& handle) {
    v1::ListMatricesResponse list;
    EXPECT_TRUE(client_->ListMatrices(&list, As(client_id)).ok());
    for (const v1::MatrixInfo& m : list.matrices()) {
      if (m.handle() == handle) return m.missing_bytes();
    }
    ADD_FAILURE() << "no matrix " << handle;
    return 0;
  }

  double Metric(const std::string& series) {
    std::string body;
    EXPECT_EQ(HttpGet("127.0.0.1", server_->metrics_port(), "/metrics", &body), 200);
    const Scrape scrape = ParseExposition(body);
    return scrape.Has(series) ? scrape.Get(series) : 0;
  }

  // A raw connection to the bulk port.
  bulk::Connection Dial() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(uint16_t(server_->bulk_port()));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
    return bulk::Connection(fd);
  }

  // A raw connection that has presented `lane`'s capability; *frame: the server's answer.
  bulk::Connection Present(const v1::BulkLane& lane, bulk::Frame* frame) {
    bulk::Connection c = Dial();
    const std::string hello = bulk::Hello(lane.capability());
    EXPECT_TRUE(c.SendAll(hello.data(), hello.size()));
    EXPECT_TRUE(c.ReceiveFrame(frame));
    return c;
  }

  void ExpectStillServing() {
    v1::GemmRequest r = RandomRequest(40, 24, 56, rng_);
    v1::GemmResponse response;
    grpc::Status s = client_->Run(r, &response, As("carol"));
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc);
  }

  std::chrono::milliseconds lifetime_ = 30000ms;
  std::mt19937_64 rng_{2026120701};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
  std::unique_ptr<v1::GemmService::Stub> stub_;
};

TEST_F(BulkTest, RunSendsPartsOverTheBulkChannel) {
  Start();
  for (auto [m, n, k] : {std::tuple{301u, 257u, 199u}, {1u, 3u, 5u}, {64u, 1u, 129u}}) {
    v1::GemmRequest r = RandomRequest(m, n, k, rng_);
    v1::GemmResponse response;
    response.set_c(RandomBytes(2 * m * n));  // poison: every byte must be the server's
    grpc::Status s = client_->Run(r, &response, As("alice"));
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc);
  }
  EXPECT_TRUE(client_->OffersBulk(""));
  // The operands' and C's bytes went over bulk lanes, none by UploadPart or DownloadMatrix.
  const double operands = 2.0 * (301 * 199 + 199 * 257 + 1 * 5 + 5 * 3 + 64 * 129 + 129 * 1);
  const double results = 2.0 * (301 * 257 + 1 * 3 + 64 * 1);
  EXPECT_EQ(Metric("hgemm_transport_bytes_total{direction=\"received\",transport=\"bulk\"}"),
            operands);
  EXPECT_EQ(Metric("hgemm_transport_bytes_total{direction=\"sent\",transport=\"bulk\"}"), results);
  EXPECT_EQ(Metric("hgemm_received_bytes_total{rpc=\"UploadPart\"}"), 0);
  EXPECT_EQ(Metric("hgemm_sent_bytes_total{rpc=\"DownloadMatrix\"}"), 0);
  v1::ListMatricesResponse list;
  ASSERT_TRUE(client_->ListMatrices(&list, As("alice")).ok());
  EXPECT_EQ(list.client_bytes(), 0u);  // A, B and C released
}

TEST_F(BulkTest, PutThenGetRoundTripsEveryByte) {
  Start();
  const std::string handle = NewUpload("alice", 123, 77);
  const std::string bytes = RandomBytes(2 * 123 * 77);
  uint64_t missing = 1;
  // Two puts: the first half over 3 lanes, the rest over 5.
  const uint64_t half = bytes.size() / 2;
  grpc::Status s = client_->BulkPut(handle, 0, bytes.data(), half, 3, As("alice"), &missing);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(missing, bytes.size() - half);
  s = client_->BulkPut(handle, half, bytes.data() + half, bytes.size() - half, 5, As("alice"),
                       &missing);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(missing, 0u);
  std::string back = RandomBytes(bytes.size());
  s = client_->BulkGet(handle, 0, bytes.size(), back.data(), 4, As("alice"));
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(back, bytes);
  std::string range(1001, 'x');
  s = client_->BulkGet(handle, 999, range.size(), range.data(), 2, As("alice"));
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(range, bytes.substr(999, 1001));
  std::string by_grpc;
  ASSERT_TRUE(client_->DownloadMatrix(handle, &by_grpc, As("alice")).ok());
  EXPECT_EQ(by_grpc, bytes);
}

// The local port of a connected socket: which connection it is (a file descriptor number may
// be reused by the next socket).
int LocalPort(int fd) {
  sockaddr_in address{};
  socklen_t length = sizeof address;
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  return ntohs(address.sin_port);
}

// A connection whose lane ended whole carries the next lane (the same socket, no new
// connection); one the server closed between lanes (its hello timeout, 300 ms here) is dropped
// from the pool and the lane goes on a new one; a lane refused on a kept connection is not
// kept.
TEST_F(BulkTest, KeptConnectionsCarryTheNextLanes) {
  Start();
  const std::string handle = NewUpload("alice", 32, 32);
  const std::string bytes = RandomBytes(2 * 32 * 32);
  BulkEndpoint kept = endpoint();
  kept.pool = std::make_shared<BulkLanePool>();
  v1::BulkGrant grant;
  ASSERT_TRUE(Open("alice", handle, v1::BULK_PUT, 0, 1024, 1, &grant).ok());
  ASSERT_TRUE(PutOverLane(kept, grant.lanes(0), bytes.data(), 2000ms, nullptr).ok());
  bulk::Connection first;
  ASSERT_TRUE(kept.pool->Take(kept, &first));
  const int port = LocalPort(first.fd());
  kept.pool->Give(kept, std::move(first));
  ASSERT_TRUE(Open("alice", handle, v1::BULK_PUT, 1024, 1024, 1, &grant).ok());
  uint64_t missing = 1;
  ASSERT_TRUE(PutOverLane(kept, grant.lanes(0), bytes.data() + 1024, 2000ms, &missing).ok());
  EXPECT_EQ(missing, 0u);
  bulk::Connection second;
  ASSERT_TRUE(kept.pool->Take(kept, &second));
  EXPECT_EQ(LocalPort(second.fd()), port);  // the same connection carried both lanes
  kept.pool->Give(kept, std::move(second));
  std::string back(bytes.size(), '\0');
  ASSERT_TRUE(Open("alice", handle, v1::BULK_GET, 0, bytes.size(), 1, &grant).ok());
  ASSERT_TRUE(GetOverLane(kept, grant.lanes(0), back.data(), 2000ms).ok());
  EXPECT_EQ(back, bytes);
  // Idle past the server's hello timeout: it closed the connection, the pool drops it, and
  // the next lane connects anew.
  std::this_thread::sleep_for(600ms);
  bulk::Connection stale;
  EXPECT_FALSE(kept.pool->Take(kept, &stale));
  ASSERT_TRUE(Open("alice", handle, v1::BULK_GET, 0, bytes.size(), 1, &grant).ok());
  back.assign(bytes.size(), '\0');
  ASSERT_TRUE(GetOverLane(kept, grant.lanes(0), back.data(), 2000ms).ok());
  EXPECT_EQ(back, bytes);
  // A used capability on a kept connection: refused, and the connection is not kept.
  const grpc::Status reused = GetOverLane(kept, grant.lanes(0), back.data(), 2000ms);
  EXPECT_EQ(reused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << reused.error_message();
  EXPECT_FALSE(kept.pool->Take(kept, &stale));
  ExpectStillServing();
}

// Connections kept idle fill the server's bulk connections (4 here): a new connection is
// not turned away, an idle one is closed to make room, and a client that kept it connects
// again for its next lane.
TEST_F(BulkTest, IdleKeptConnectionsMakeRoomForNewOnes) {
  Start();
  const std::string handle = NewUpload("alice", 64, 64);
  const std::string bytes = RandomBytes(2 * 64 * 64);
  // Four clients' pools, one lane each: four connections, each kept by its own pool.
  std::vector<BulkEndpoint> clients(4, endpoint());
  v1::BulkGrant grant;
  for (int i = 0; i < 4; ++i) {
    clients[i].pool = std::make_shared<BulkLanePool>();
    const uint64_t share = bytes.size() / 4;
    ASSERT_TRUE(Open("alice", handle, v1::BULK_PUT, i * share, share, 1, &grant).ok());
    ASSERT_TRUE(
        PutOverLane(clients[i], grant.lanes(0), bytes.data() + i * share, 2000ms, nullptr).ok());
  }
  ASSERT_TRUE(Open("alice", handle, v1::BULK_GET, 0, 256, 1, &grant).ok());
  bulk::Frame frame;
  bulk::Connection fresh = Present(grant.lanes(0), &frame);
  EXPECT_EQ(frame.code, 0u) << frame.message;
  std::string got(256, '\0');
  ASSERT_EQ(fresh.ReceiveAll(got.data(), got.size()), got.size());
  EXPECT_EQ(got, bytes.substr(0, 256));
  for (BulkEndpoint& client : clients) {  // one of them lost its connection: it connects again
    std::string back(bytes.size(), '\0');
    ASSERT_TRUE(Open("alice", handle, v1::BULK_GET, 0, bytes.size(), 1, &grant).ok());
    const grpc::Status s = GetOverLane(client, grant.lanes(0), back.data(), 2000ms);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(back, bytes);
  }
}

TEST_F(BulkTest, ACapabilityServesOnceAndOnlyItsOwnersMatrix) {
  Start();
  const std::string handle = NewUpload("alice", 16, 16);
  const std::string bytes = RandomBytes(512);
  ASSERT_TRUE(client_->BulkPut(handle, 0, bytes.data(), bytes.size(), 1, As("alice")).ok());
  v1::BulkGrant grant;
  ASSERT_TRUE(Open("alice", handle, v1::BULK_GET, 0, 512, 1, &grant).ok());
  std::string back(512, '\0');
  ASSERT_TRUE(GetOverLane(endpoint(), grant.lanes(0), back.data(), 2000ms).ok());
  EXPECT_EQ(back, bytes);
  // Used: the same capability again is refused.
  grpc::Status again = GetOverLane(endpoint(), grant.lanes(0), back.data(), 2000ms);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::PERMISSION_DENIED) << again.error_message();
  // Another principal cannot read alice's matrix, nor write into her upload.
  grpc::Status read = Open("bob", handle, v1::BULK_GET, 0, 512, 1, &grant);
  EXPECT_EQ(read.error_code(), grpc::StatusCode::NOT_FOUND) << read.error_message();
  const std::string upload = NewUpload("alice", 8, 8);
  ASSERT_TRUE(Open("bob", upload, v1::BULK_PUT, 0, 128, 1, &grant).ok());
  const std::string evil = RandomBytes(128);
  grpc::Status write = PutOverLane(endpoint(), grant.lanes(0), evil.data(), 2000ms, nullptr);
  EXPECT_EQ(write.error_code(), grpc::StatusCode::NOT_FOUND) << write.error_message();
  EXPECT_EQ(Missing("alice", upload), 128u);
  ExpectStillServing();
}

TEST_F(BulkTest, GuessedAndExpiredCapabilitiesAreRefused) {
  lifetime_ = 200ms;
  Start();
  const std::string handle = NewUpload("alice", 8, 8);
  v1::BulkGrant grant;
  ASSERT_TRUE(Open("alice", handle, v1::BULK_PUT, 0, 128, 1, &grant).ok());
  v1::BulkLane guess = grant.lanes(0);
  guess.mutable_capability()->at(5) ^= 0x40;
  const std::string bytes = RandomBytes(128);
  grpc::Status guessed = PutOverLane(endpoint(), guess, bytes.data(), 2000ms, nullptr);
  EXPECT_EQ(guessed.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  std::this_thread::sleep_for(400ms);  // twice the lifetime
  grpc::Status expired = PutOverLane(endpoint(), grant.lanes(0), bytes.data(), 2000ms, nullptr);
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(guessed.error_message(), expired.error_message());
  EXPECT_EQ(Missing("alice", handle), 128u);
}

TEST_F(BulkTest, BrokenHellosAreAnsweredAndClosed) {
  Start();
  bulk::Frame frame;
  {  // The wrong magic.
    bulk::Connection c = Dial();
    const std::string hello = std::string("HTTP/1.1") + std::string(32, 'x');
    ASSERT_TRUE(c.SendAll(hello.data(), hello.size()));
    ASSERT_TRUE(c.ReceiveFrame(&frame));
    EXPECT_EQ(frame.code, uint32_t(grpc::StatusCode::INVALID_ARGUMENT)) << frame.message;
  }
  {  // Half a hello, then silence: the hello timeout.
    bulk::Connection c = Dial();
    ASSERT_TRUE(c.SendAll(bulk::kHelloMagic, 8));
    ASSERT_TRUE(c.ReceiveFrame(&frame));
    EXPECT_EQ(frame.code, uint32_t(grpc::StatusCode::DEADLINE_EXCEEDED)) << frame.message;
  }
  {  // Half a hello, then gone.
    bulk::Connection c = Dial();
    ASSERT_TRUE(c.SendAll(bulk::kHelloMagic, 5));
  }
  ExpectStillServing();
}

TEST_F(BulkTest, ACutLaneCountsNothingAndItsRangeCanBeSentAgain) {
  Start();
  const std::string handle = NewUpload("alice", 64, 64);  // 8 KiB
  const std::string bytes = RandomBytes(8192);
  v1::BulkGrant grant;
  ASSERT_TRUE(Open("alice", handle, v1::BULK_PUT, 0, 8192, 1, &grant).ok());
  bulk::Frame frame;
  bulk::Connection cut = Present(grant.lanes(0), &frame);
  ASSERT_EQ(frame.code, 0u) << frame.message;
  ASSERT_TRUE(cut.SendAll(bytes.data(), 5000));
  cut.ShutdownSend();  // the client is done after 5000 of 8192 bytes
  ASSERT_TRUE(cut.ReceiveFrame(&frame));
  EXPECT_EQ(frame.code, uint32_t(grpc::StatusCode::INVALID_ARGUMENT)) << frame.message;
  EXPECT_EQ(Missing("alice", handle), 8192u);
  // A stalled lane: the idle timeout ends it, and nothing of it counts either.
  ASSERT_TRUE(Open("alice", handle, v1::BULK_PUT, 0, 8192, 1, &grant).ok());
  bulk::Connection stalled = Present(grant.lanes(0), &frame);
  ASSERT_TRUE(stalled.SendAll(bytes.data(), 100));
  ASSERT_TRUE(stalled.ReceiveFrame(&frame));
  EXPECT_EQ(frame.code, uint32_t(grpc::StatusCode::DEADLINE_EXCEEDED)) << frame.message;
  EXPECT_EQ(Missing("alice", handle), 8192u);
  uint64_t missing = 1;
  grpc::Status s = client_->BulkPut(handle, 0, bytes.data(), 8192, 2, As("alice"), &missing);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(missing, 0u);
  std::string back;
  ASSERT_TRUE(client_->DownloadMatrix(handle, &back, As("alice")).ok());
  EXPECT_EQ(back, bytes);
}

TEST_F(BulkTest, ConnectionsPastTheLimitAreClosed) {
  Start();
  std::vector<bulk::Connection> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(Dial());  // max_connections, saying nothing
  std::this_thread::sleep_for(100ms);                  // all four accepted
  bulk::Connection extra = Dial();
  bulk::Frame frame;
  ASSERT_TRUE(extra.ReceiveFrame(&frame));  // refused at once, before any hello
  EXPECT_EQ(frame.code, uint32_t(grpc::StatusCode::UNAVAILABLE)) << frame.message;
  char byte;
  EXPECT_EQ(recv(extra.fd(), &byte, 1, 0), 0);  // and closed
  idle.clear();
  // Their lanes end (the connections closed, or the hello timeout): bulk works again.
  std::this_thread::sleep_for(500ms);
  ExpectStillServing();
  const std::string handle = NewUpload("alice", 8, 8);
  const std::string bytes = RandomBytes(128);
  grpc::Status s = client_->BulkPut(handle, 0, bytes.data(), 128, 1, As("alice"));
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(BulkTest, OpenBulkRefusesWhatItCannotGrant) {
  Start();
  const std::string handle = NewUpload("alice", 8, 8);
  const std::string bytes = RandomBytes(128);
  ASSERT_TRUE(client_->BulkPut(handle, 0, bytes.data(), 128, 1, As("alice")).ok());
  v1::BulkGrant grant;
  EXPECT_EQ(Open("alice", handle, v1::BULK_GET, 0, 128, 0, &grant).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Open("alice", handle, v1::BULK_GET, 0, 128, 9, &grant).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Open("alice", handle, v1::BULK_GET, 0, 0, 1, &grant).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Open("alice", handle, v1::BULK_DIRECTION_UNSPECIFIED, 0, 128, 1, &grant).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Open("alice", handle, v1::BULK_GET, 100, 29, 1, &grant).error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Open("alice", handle, v1::BULK_GET, ~uint64_t{0}, 1, 1, &grant).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Granted lanes not yet connected count against the caller's limit (8): past it a grant
  // has the lanes left, then none.
  ASSERT_TRUE(Open("alice", handle, v1::BULK_GET, 0, 128, 6, &grant).ok());
  ASSERT_TRUE(Open("alice", handle, v1::BULK_GET, 0, 128, 3, &grant).ok());
  EXPECT_EQ(grant.lanes_size(), 2);
  grpc::Status over = Open("alice", handle, v1::BULK_GET, 0, 128, 3, &grant);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over.error_message();
  EXPECT_TRUE(Open("bob", "m-nothing", v1::BULK_PUT, 0, 128, 3, &grant).ok());
}

// More GEMMs at once than the server has lanes (8 per client) and bulk connections (4) for:
// the lanes refused at OpenBulk and the connections turned away carry their bytes over gRPC
// instead, and every GEMM is right.
TEST_F(BulkTest, GemmsPastTheLanesAndConnectionsGoOverGrpc) {
  Start();
  constexpr int kThreads = 8, kGemmsEach = 4;
  std::vector<v1::GemmRequest> requests;
  for (int i = 0; i < kThreads; ++i) requests.push_back(RandomRequest(96, 80, 112, rng_));
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const GemmClient own(address());  // as separate processes: lanes are counted per client id
      for (int i = 0; i < kGemmsEach; ++i) {
        v1::GemmResponse response;
        response.set_c(std::string(2 * 96 * 80, '\x7f'));  // poison
        grpc::Status s = own.Run(requests[t], &response, As("alice"));
        if (!s.ok()) {
          failures[t] = s.error_message();
          return;
        }
        if (RelativeErrorOfC(requests[t], response.c()) >= kServiceTolerance.fp32_acc) {
          failures[t] = "C is wrong";
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& failure : failures) EXPECT_EQ(failure, "");
  EXPECT_GT(Metric("hgemm_transport_bytes_total{direction=\"received\",transport=\"bulk\"}"), 0);
  EXPECT_GT(Metric("hgemm_received_bytes_total{rpc=\"UploadPart\"}"), 0);
  ExpectStillServing();
}

TEST_F(BulkTest, WithoutABulkChannelRunUsesGrpcParts) {
  Start(/*bulk=*/false);
  v1::BulkGrant grant;
  grpc::Status s = Open("alice", "m-x", v1::BULK_GET, 0, 1, 1, &grant);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_FALSE(client_->OffersBulk(""));
  v1::GemmRequest r = RandomRequest(70, 50, 90, rng_);
  v1::GemmResponse response;
  ASSERT_TRUE(client_->Run(r, &response, As("alice")).ok());
  EXPECT_LT(RelativeErrorOfC(r, response.c()), kServiceTolerance.fp32_acc);
  EXPECT_GT(Metric("hgemm_received_bytes_total{rpc=\"UploadPart\"}"), 0);
}

TEST_F(BulkTest, ShutdownCutsALaneInProgress) {
  Start();
  const std::string handle = NewUpload("alice", 64, 64);
  v1::BulkGrant grant;
  ASSERT_TRUE(Open("alice", handle, v1::BULK_PUT, 0, 8192, 1, &grant).ok());
  bulk::Frame frame;
  bulk::Connection c = Present(grant.lanes(0), &frame);
  ASSERT_TRUE(c.SendAll("0123456789", 10));
  server_->Shutdown();  // returns: the lane does not hold it
  char byte;
  EXPECT_LE(recv(c.fd(), &byte, 1, 0), 1);  // answered or closed, never left hanging
}

TEST(BulkHost, OfTargets) {
  EXPECT_EQ(BulkHostOf("127.0.0.1:50051"), "127.0.0.1");
  EXPECT_EQ(BulkHostOf("ipv4:10.0.0.1:1,10.0.0.2:1"), "10.0.0.1");
  EXPECT_EQ(BulkHostOf("dns:///svc.ns:50051"), "svc.ns");
  EXPECT_EQ(BulkHostOf("[::1]:50051"), "::1");
  EXPECT_EQ(BulkHostOf("ipv6:[fe80::1]:5"), "fe80::1");
  EXPECT_EQ(BulkHostOf("unix:/run/hgemm.sock"), "");
  EXPECT_EQ(BulkHostOf(""), "");
}

}  // namespace
}  // namespace hgemm
