// hgemm_client's checks: the pure functions of client/cli, and the
// hgemm_client binary itself run as a child process against a real HgemmServer (CPU backend)
// on 127.0.0.1, with its address space capped so that a client that allocates what the shape
// asks for before checking it dies instead of passing.
#include "client/cli.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"

#if defined(__SANITIZE_ADDRESS__)
#define HGEMM_CLI_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HGEMM_CLI_TEST_ASAN 1
#endif
#endif

namespace hgemm::cli {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Cli, ParseGemmDimsKeepsDimensionsInTheUint32Range) {
  GemmDims d;
  ASSERT_EQ(ParseGemmDims("512x256x1024", &d), "");
  EXPECT_EQ(d.m, 512u);
  EXPECT_EQ(d.n, 256u);
  EXPECT_EQ(d.k, 1024u);
  ASSERT_EQ(ParseGemmDims("4294967295x1x4294967295", &d), "");
  EXPECT_EQ(d.m, 4294967295u);
  EXPECT_EQ(d.k, 4294967295u);

  std::string e = ParseGemmDims("4294967296x1x1", &d);
  EXPECT_TRUE(Contains(e, "m = 4294967296 is over 4294967295")) << e;
  e = ParseGemmDims("99999999999x1x1", &d);
  EXPECT_TRUE(Contains(e, "m = 99999999999")) << e;
  e = ParseGemmDims("1x1x999999999999999999999999999999", &d);  // past uint64 too
  EXPECT_TRUE(Contains(e, "k = 999999999999999999999999999999 is over")) << e;
  e = ParseGemmDims("1x0x1", &d);
  EXPECT_TRUE(Contains(e, "n must be at least 1")) << e;
  for (const char* bad : {"", "1x2", "1x2x", "x1x1", "1x2x3x4", "1x-2x3", "1x 2x3", "axbxc"}) {
    EXPECT_NE(ParseGemmDims(bad, &d), "") << bad;
  }
  EXPECT_EQ(d.m, 4294967295u);  // untouched by the failures
}

TEST(Cli, MatrixBytesIsCheckedArithmetic) {
  EXPECT_EQ(MatrixBytes(3, 5), 30u);
  EXPECT_EQ(MatrixBytes(UINT32_MAX, UINT32_MAX), std::nullopt);  // 2·(2^32−1)^2 > 2^64
  EXPECT_EQ(MatrixBytes(uint64_t{1} << 31, uint64_t{1} << 32), std::nullopt);
  EXPECT_EQ(MatrixBytes(uint64_t{1} << 31, uint64_t{1} << 31), uint64_t{1} << 63);
  EXPECT_EQ(CheckedAdd(uint64_t{1} << 63, uint64_t{1} << 63), std::nullopt);
  EXPECT_EQ(CheckedAdd(std::nullopt, 1), std::nullopt);
  EXPECT_EQ(CheckedAdd(2, 3), 5u);
}

v1::Limits ServerLimits() {
  v1::Limits l;
  l.set_max_elements_per_matrix(uint64_t{1} << 28);
  l.set_max_queued_bytes(uint64_t{16} << 30);
  l.set_max_message_bytes(uint64_t{1} << 30);
  l.set_resident_quota_bytes(uint64_t{1} << 30);
  return l;
}

TEST(Cli, CheckLimitsNamesTheOperandAndTheLimit) {
  const v1::Limits limits = ServerLimits();
  EXPECT_EQ(CheckLimits({.m = 1024, .n = 1024, .k = 1024}, limits, {.unary = true}), "");
  std::string e = CheckLimits({.m = 40000, .n = 40000, .k = 1}, limits, {});
  EXPECT_TRUE(Contains(e, "C (m x n) is 40000x40000 = 1600000000 elements")) << e;
  EXPECT_TRUE(Contains(e, "268435456 (max_elements_per_matrix)")) << e;
  e = CheckLimits({.m = 1, .n = 1, .k = 300000000}, limits, {});
  EXPECT_TRUE(Contains(e, "A (m x k)")) << e;
  e = CheckLimits({.m = 4294967295u, .n = 4294967295u, .k = 4294967295u}, limits, {});
  EXPECT_TRUE(Contains(e, "18446744065119617025 elements")) << e;  // (2^32−1)^2, not wrapped

  // Nothing but the byte budget: A + B + C past 2^64 says so instead of a wrapped number.
  v1::Limits bytes_only;
  bytes_only.set_max_queued_bytes(uint64_t{1} << 34);
  e = CheckLimits({.m = 4294967295u, .n = 4294967295u, .k = 4294967295u}, bytes_only, {});
  EXPECT_TRUE(Contains(e, "take more than 2^64 bytes")) << e;
  EXPECT_TRUE(Contains(e, "(max_queued_bytes)")) << e;
  e = CheckLimits({.m = 65536, .n = 65536, .k = 65536}, bytes_only, {});
  EXPECT_TRUE(Contains(e, "take 25769803776 bytes; the server takes at most 17179869184")) << e;
  EXPECT_EQ(CheckLimits({.m = 16384, .n = 16384, .k = 16384}, bytes_only, {}), "");

  // Unary: A + B must fit one message; resident operands do not travel.
  v1::Limits small_messages = limits;
  small_messages.set_max_message_bytes(4 << 20);
  e = CheckLimits({.m = 1024, .n = 1024, .k = 1024}, small_messages, {.unary = true});
  EXPECT_TRUE(Contains(e, "(max_message_bytes); use --mode=stream")) << e;
  EXPECT_EQ(CheckLimits({.m = 1024, .n = 1024, .k = 1024}, small_messages, {.unary = false}), "");
  EXPECT_EQ(CheckLimits({.m = 1024, .n = 1024, .k = 1024}, small_messages,
                        {.unary = true, .resident_b = true}),
            "");

  // Resident quota: each matrix, then all held at once (A, B, this C and the previous C).
  v1::Limits quota = limits;
  quota.set_resident_quota_bytes(8 << 20);
  e = CheckLimits({.m = 4096, .n = 64, .k = 2048}, quota, {.resident_a = true});
  EXPECT_TRUE(Contains(e, "resident A (m x k) takes 16777216 bytes")) << e;
  EXPECT_TRUE(Contains(e, "8388608 (resident_quota_bytes)")) << e;
  EXPECT_EQ(CheckLimits({.m = 4096, .n = 64, .k = 2048}, quota, {.resident_b = true}), "");
  e = CheckLimits({.m = 1024, .n = 1024, .k = 2048}, quota,
                  {.resident_a = true, .resident_b = true, .keep_c = true});
  EXPECT_TRUE(Contains(e, "take 10485760 bytes at once")) << e;
  e = CheckLimits({.m = 1024, .n = 1024, .k = 2048}, quota,
                  {.resident_a = true, .resident_b = true, .keep_c = true, .repeated = true});
  EXPECT_TRUE(Contains(e, "take 12582912 bytes at once")) << e;  // and the previous run's C
  EXPECT_EQ(CheckLimits({.m = 1024, .n = 1024, .k = 1024}, quota,
                        {.resident_a = true, .resident_b = true, .keep_c = true}),
            "");  // 2 + 2 + 2 MiB
  EXPECT_EQ(CheckLimits({.m = 1024, .n = 1024, .k = 1024}, quota,
                        {.resident_a = true, .resident_b = true, .keep_c = true, .repeated = true}),
            "");  // 2 + 2 + 2·2 MiB: exactly the quota

  EXPECT_EQ(CheckLimits({.m = 1024, .n = 1024, .k = 2048}, quota, {.resident_b = true}), "");
}

TEST(Cli, AKeptCDoesNotCountTowardsStreaming) {
  // 2048x2048 C is 8 MiB, over the 3 MiB unary limit; resident operands send nothing.
  v1::GemmRequest request;
  request.set_m(2048);
  request.set_n(2048);
  request.set_k(64);
  request.set_a_handle("a");
  request.set_b_handle("b");
  EXPECT_TRUE(GemmClient::ShouldStream(request, {}));
  request.set_keep_c_resident(true);
  EXPECT_FALSE(GemmClient::ShouldStream(request, {}));
  request.set_b(std::string(size_t{4} << 20, '\0'));  // 4 MiB of B bytes still stream
  EXPECT_TRUE(GemmClient::ShouldStream(request, {}));
}

// A batch's C comes back once per item (hgemm_client printed "0.5 MiB down" for 64 items of
// 512x512); C_in travels up; a C kept on the server or written into a region does not travel.
TEST(Cli, WireBytesCountEveryItemOfABatch) {
  v1::GemmRequest request;
  request.set_m(512);
  request.set_n(512);
  request.set_k(512);
  request.set_a(std::string(size_t{64} * 512 * 512 * 2, '\0'));
  request.set_b(std::string(size_t{64} * 512 * 512 * 2, '\0'));
  request.set_batch(64);
  WireBytes bytes = RequestWireBytes(request, 2);
  EXPECT_EQ(bytes.up, uint64_t{64} << 20);
  EXPECT_EQ(bytes.down, uint64_t{32} << 20);
  EXPECT_EQ(RequestWireBytes(request, 4).down, uint64_t{64} << 20);  // fp32 C
  request.set_c_in(std::string(size_t{64} * 512 * 512 * 2, '\0'));
  EXPECT_EQ(RequestWireBytes(request, 2).up, uint64_t{96} << 20);

  request.clear_batch();  // one GEMM: batch unset
  request.clear_c_in();
  request.set_a(std::string(size_t{512} * 512 * 2, '\0'));
  request.set_b(std::string(size_t{512} * 512 * 2, '\0'));
  bytes = RequestWireBytes(request, 2);
  EXPECT_EQ(bytes.up, uint64_t{1} << 20);
  EXPECT_EQ(bytes.down, uint64_t{1} << 19);
  request.set_keep_c_resident(true);
  EXPECT_EQ(RequestWireBytes(request, 2).down, 0u);
  request.set_keep_c_resident(false);
  request.mutable_c_region()->set_region("r");
  request.mutable_a_region()->set_region("r");  // A no longer inline
  bytes = RequestWireBytes(request, 2);
  EXPECT_EQ(bytes.up, uint64_t{1} << 19);
  EXPECT_EQ(bytes.down, 0u);
}

TEST(Cli, ParseHandleList) {
  std::vector<std::string> handles;
  ASSERT_EQ(ParseHandleList("abc,def", &handles), "");
  EXPECT_EQ(handles, (std::vector<std::string>{"abc", "def"}));
  EXPECT_NE(ParseHandleList("abc,,def", &handles), "");
  EXPECT_NE(ParseHandleList("abc,abc", &handles), "");
  EXPECT_NE(ParseHandleList(",", &handles), "");
}

TEST(Cli, ParseGroupNamesTheProblem) {
  std::vector<GemmDims> group;
  ASSERT_EQ(ParseGroup("64x32x16,1x2x3", &group), "");
  ASSERT_EQ(group.size(), 2u);
  EXPECT_EQ(group[1].Name(), "1x2x3");
  EXPECT_NE(ParseGroup("64x32x16,1x0x3", &group).find("problem 1 ('1x0x3')"), std::string::npos);
  EXPECT_NE(ParseGroup("64x32x16,", &group), "");
  EXPECT_NE(ParseGroup(",", &group), "");
  EXPECT_EQ(group.size(), 2u);  // untouched by the failures
}

TEST(Cli, CheckGroupLimitsSumsOverTheGroup) {
  v1::Limits limits;
  limits.set_max_elements_per_matrix(1000);
  limits.set_max_group_problems(3);
  const std::vector<GemmDims> group = {{.m = 20, .n = 10, .k = 30}, {.m = 10, .n = 10, .k = 30}};
  EXPECT_EQ(CheckGroupLimits(group, false, false, limits), "");
  const std::vector<GemmDims> over = {{.m = 20, .n = 10, .k = 30}, {.m = 20, .n = 10, .k = 30}};
  EXPECT_NE(
      CheckGroupLimits(over, false, false, limits).find("A matrices have 1200 elements together"),
      std::string::npos);
  EXPECT_NE(CheckGroupLimits({group[0], group[0], group[1], group[1]}, false, false, limits)
                .find("a group of 4 problems; the server takes at most 3"),
            std::string::npos);
  limits.set_max_message_bytes(2 * (600 + 300 + 300 + 300) + kUnaryOverheadBytes - 1);
  EXPECT_NE(CheckGroupLimits(group, false, false, limits).find("max_message_bytes"),
            std::string::npos);
  // Elements that wrap uint64 when summed are refused, not wrapped.
  limits.set_max_elements_per_matrix(0);
  limits.set_max_message_bytes(0);
  const GemmDims huge{.m = UINT32_MAX, .n = 1, .k = UINT32_MAX};
  limits.set_max_queued_bytes(UINT64_MAX);
  EXPECT_NE(CheckGroupLimits({huge, huge}, false, false, limits).find("more than 2^64"),
            std::string::npos);
  limits.set_max_group_problems(0);  // a server from before groups
  EXPECT_NE(CheckGroupLimits(group, false, false, limits).find("takes no grouped GEMMs"),
            std::string::npos);
}

TEST(Cli, FormatMatrixListShowsShapeBytesAndExpiry) {
  v1::ListMatricesResponse list;
  v1::MatrixInfo* m = list.add_matrices();
  m->set_handle("h1");
  m->set_rows(64);
  m->set_cols(32);
  m->set_bytes(4096);
  m->set_device_id(-1);
  m->set_age_seconds(12.5);
  m->set_idle_seconds(2.5);
  m->set_ttl_seconds(60);
  m->set_label("B");
  m = list.add_matrices();
  m->set_handle("h2");
  m->set_rows(1);
  m->set_cols(2);
  m->set_bytes(4);
  list.set_client_bytes(4100);
  list.set_quota_bytes(1 << 20);
  const std::string text = FormatMatrixList(list);
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u) << text;
  EXPECT_TRUE(Contains(lines[0], "expires_s")) << lines[0];
  EXPECT_TRUE(Contains(lines[1], "h1") && Contains(lines[1], "64x32") &&
              Contains(lines[1], "4096") && Contains(lines[1], "57.5") && Contains(lines[1], " B"))
      << lines[1];
  EXPECT_TRUE(Contains(lines[2], "h2") && Contains(lines[2], "never")) << lines[2];
  EXPECT_TRUE(Contains(lines[3], "2 matrices, 4100 bytes of this client's quota of 1048576"))
      << lines[3];
  EXPECT_FALSE(Contains(lines[0], "owner"));

  // An administrator's list: every matrix with its owner.
  list.mutable_matrices(0)->set_owner("alice");
  list.mutable_matrices(1)->set_owner("bob");
  const std::string admin = FormatMatrixList(list);
  EXPECT_EQ(admin.rfind("owner", 0), 0u) << admin;
  EXPECT_TRUE(Contains(admin, "\nalice ") && Contains(admin, "\nbob ")) << admin;
}

// ---------------------------------------------------------------------------------------------
// The binary against a real server.

struct ClientRun {
  int exit_code = -1;  // -1: did not exit normally (killed by a signal, e.g. abort on bad_alloc)
  int signal = 0;
  std::string out, err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Runs client/hgemm_client with `args`, its address space capped at `address_space_bytes`
// (not under ASan, whose shadow memory needs terabytes of address space).
ClientRun RunClient(const std::vector<std::string>& args, int64_t address_space_bytes) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  const std::string out_path = dir + "/client.out", err_path = dir + "/client.err";
  std::vector<std::string> argv_strings = {"client/hgemm_client"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
#ifndef HGEMM_CLI_TEST_ASAN
    rlimit limit{.rlim_cur = rlim_t(address_space_bytes), .rlim_max = rlim_t(address_space_bytes)};
    setrlimit(RLIMIT_AS, &limit);
#endif
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ClientRun run;
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return run;
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  run.out = ReadFile(out_path);
  run.err = ReadFile(err_path);
  return run;
}

std::string Describe(const ClientRun& r) {
  return "exit " + std::to_string(r.exit_code) + ", signal " + std::to_string(r.signal) +
         "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

// Enough for the client's own threads and libraries and a small GEMM, far below what the
// refused shapes would take (3 GB for 40000x40000x1, 24 GB for 4294967296x1x1).
constexpr int64_t kClientAddressSpace = int64_t{1536} << 20;

class HgemmClientBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    // A Unix socket too, for the same-host paths (--transport=ring); under /tmp, as
    // TEST_TMPDIR's paths run past a socket path's 107 bytes.
    char dir[] = "/tmp/hgemm_cli_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/hgemm.sock";
    options.more_listen_addresses = {"unix:" + socket_};
    options.service.regions.allow_shared_memory = true;
    options.service.rules.max_elements_per_matrix = int64_t{1} << 28;
    options.service.resident.default_ttl = std::chrono::seconds(0);
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
    client_ = std::make_unique<GemmClient>(Connect(target_));
  }

  ClientRun Run(std::vector<std::string> args) {
    args.insert(args.begin(), "--server=" + target_);
    return RunClient(args, kClientAddressSpace);
  }

  uint64_t AdmittedGemms() {
    v1::ServerInfo info;
    EXPECT_TRUE(client_->GetServerInfo(&info).ok());
    return info.load().admitted_total();
  }

  std::string Upload(uint32_t rows, uint32_t cols, const std::string& client_id, uint32_t ttl_s,
                     const std::string& label) {
    std::mt19937_64 rng(rows * 31 + cols);
    const std::vector<uint16_t> data = RandomHalfMatrix(int64_t(rows) * cols, rng);
    v1::MatrixInfo info;
    CallOptions call;
    call.client_id = client_id;
    grpc::Status s = client_->UploadMatrix(
        rows, cols, std::string(reinterpret_cast<const char*>(data.data()), 2 * data.size()), &info,
        ttl_s, label, call);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info.handle();
  }

  void TearDown() override {
    client_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<HgemmServer> server_;
  std::string dir_;
  std::string socket_;
  std::string target_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(HgemmClientBinaryTest, SmallGemmPassesItsCheck) {
  for (const char* mode : {"--mode=unary", "--mode=stream"}) {
    ClientRun r = Run({"--shape=64x48x40", "--check", mode});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    EXPECT_TRUE(Contains(r.out, "check: relative Frobenius error")) << Describe(r);
  }
}

// A C over the unary limit (4 MiB) would go by GemmStream; through the ring it is written in
// place: the table must not say "ring" for a GemmStream's time (170 ms against 1.6 on an H100).
// A ring completion names its kernel and device as a Gemm response does (it used to print
// " (fp32) @  stream 0").
TEST_F(HgemmClientBinaryTest, AllResidentRingRunsGoByTheRingWhateverCsSize) {
  std::vector<std::string> args = {
      "--server=unix:" + socket_, "--shape=1024x2048x16", "--resident=all",
      "--transport=ring",         "--repeat=2",           "--check"};
  ClientRun r = RunClient(args, kClientAddressSpace);
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(Contains(r.out, "via a submission ring")) << Describe(r);
  EXPECT_TRUE(Contains(r.out, "check: relative Frobenius error")) << Describe(r);
  EXPECT_TRUE(Contains(r.out, "openblas_sgemm")) << Describe(r);
  EXPECT_FALSE(Contains(r.out, "@  stream")) << Describe(r);
}

TEST_F(HgemmClientBinaryTest, ScaledBatchedGemmPassesItsCheck) {
  for (const char* mode : {"--mode=unary", "--mode=stream"}) {
    for (const char* c_dtype : {"--c_dtype=bf16", "--c_dtype=fp32"}) {
      ClientRun r = Run({"--shape=33x48x40", "--dtype=bf16", c_dtype, "--transpose_b",
                         "--alpha=0.5", "--beta=-1.5", "--batch=3", "--check", mode});
      EXPECT_EQ(r.exit_code, 0) << Describe(r);
      EXPECT_TRUE(Contains(r.out, "C = 0.5 op(A) op(B) + -1.5 C_in")) << Describe(r);
      EXPECT_TRUE(Contains(r.out, "a batch of 3 GEMMs")) << Describe(r);
      EXPECT_TRUE(Contains(r.out, ": OK")) << Describe(r);
    }
  }
}

TEST_F(HgemmClientBinaryTest, SummaryCountsEveryItemOfABatch) {
  // 64 items of 128x128x128 fp16: A and B 2 MiB each, C 2 MiB.
  ClientRun r = Run({"--shape=128x128x128", "--batch=64"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(Contains(r.out, "4.0 MiB up, 2.0 MiB down")) << Describe(r);
}

TEST_F(HgemmClientBinaryTest, GroupedGemmPassesItsCheck) {
  for (const char* c_dtype : {"--c_dtype=bf16", "--c_dtype=fp32"}) {
    ClientRun r = Run({"--group=33x48x40,1x7x130,64x1x9", "--dtype=bf16", c_dtype, "--transpose_b",
                       "--alpha=0.5", "--beta=-1.5", "--check", "--repeat=2"});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    EXPECT_TRUE(Contains(r.out, "grouped GEMM of 3 problems")) << Describe(r);
    EXPECT_TRUE(Contains(r.out, "check: 3 problems")) << Describe(r);
    EXPECT_TRUE(Contains(r.out, ": OK")) << Describe(r);
  }
}

TEST_F(HgemmClientBinaryTest, GroupsTheServerWouldRefuseAreRefusedBeforeSending) {
  ClientRun r = Run({"--group=20000x20000x1,1x1x1", "--check"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "refused before sending: the group's C matrices have 400000001"))
      << Describe(r);
  r = Run({"--group=2x2x2,2x0x2"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "--group: problem 1 ('2x0x2')")) << Describe(r);
  r = Run({"--group=2x2x2", "--batch=2"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "not with --shape")) << Describe(r);
  EXPECT_EQ(AdmittedGemms(), 0u);  // nothing was sent
}

// Shapes are range-checked before anything is allocated: unchecked, 4294967296 wraps through
// sscanf into an m·k of 2^32 elements (OOM-killed at 24 GB), 99999999999x1x1 aborts with
// std::bad_alloc, and 40000x40000x1 allocates C's 3 GB for the stream before the server refuses.
TEST_F(HgemmClientBinaryTest, OutOfRangeShapesAreRefusedBeforeAllocating) {
  struct Case {
    const char* shape;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"--shape=4294967296x1x1", {"m = 4294967296 is over 4294967295"}},
      {"--shape=99999999999x1x1", {"m = 99999999999 is over 4294967295"}},
      {"--shape=40000x40000x1",
       {"refused before sending", "C (m x n) is 40000x40000 = 1600000000 elements",
        "268435456 (max_elements_per_matrix)"}},
      {"--shape=4294967295x4294967295x4294967295", {"A (m x k)", "max_elements_per_matrix"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.shape);
    ClientRun r = Run({c.shape, "--check"});
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    for (const std::string& part : c.expected) EXPECT_TRUE(Contains(r.err, part)) << Describe(r);
  }
  EXPECT_EQ(AdmittedGemms(), 0u);  // nothing was sent
}

TEST_F(HgemmClientBinaryTest, NoServerIsAnErrorBeforeAllocating) {
  ClientRun r = RunClient({"--server=127.0.0.1:1", "--shape=40000x40000x1", "--timeout_s=5"},
                          kClientAddressSpace);
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "cannot read the server's limits")) << Describe(r);
}

// --list and --release: a client sees and frees only its own matrices.
TEST_F(HgemmClientBinaryTest, ListShowsOnlyThisClientsMatricesAndReleaseFreesThem) {
  const std::string a = Upload(64, 32, "cli-test", 0, "A");
  const std::string b = Upload(32, 16, "cli-test", 600, "B");
  const std::string other = Upload(8, 8, "someone-else", 0, "theirs");

  ClientRun r = Run({"--list", "--client_id=cli-test"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::string line_a, line_b;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (Contains(line, a)) line_a = line;
    if (Contains(line, b)) line_b = line;
  }
  EXPECT_TRUE(Contains(line_a, "64x32") && Contains(line_a, "4096") && Contains(line_a, "never"))
      << r.out;
  EXPECT_TRUE(Contains(line_b, "32x16") && Contains(line_b, "1024") && !Contains(line_b, "never"))
      << r.out;
  EXPECT_FALSE(Contains(r.out, other)) << r.out;
  EXPECT_TRUE(Contains(r.out, "2 matrices, 5120 bytes")) << r.out;

  r = Run({"--release=" + a + "," + b, "--client_id=cli-test"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(Contains(r.out, "released " + a + " (4096 bytes)")) << Describe(r);
  EXPECT_TRUE(Contains(r.out, "released " + b + " (1024 bytes)")) << Describe(r);
  v1::ListMatricesResponse left;
  CallOptions call;
  call.client_id = "cli-test";
  ASSERT_TRUE(client_->ListMatrices(&left, call).ok());
  EXPECT_EQ(left.matrices_size(), 0);
  call.client_id = "someone-else";
  ASSERT_TRUE(client_->ListMatrices(&left, call).ok());
  EXPECT_EQ(left.matrices_size(), 1);

  // Released already, and someone else's: both fail, each named; exit status 1.
  r = Run({"--release=" + a + "," + other, "--client_id=cli-test", "--list"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "release " + a)) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "release " + other)) << Describe(r);
  ASSERT_TRUE(client_->ListMatrices(&left, call).ok());
  EXPECT_EQ(left.matrices_size(), 1);  // still theirs

  r = Run({"--release=a,,b"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "empty handle")) << Describe(r);
}

}  // namespace
}  // namespace hgemm::cli
