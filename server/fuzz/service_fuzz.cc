// libFuzzer target: the whole service below its transport (session_harness.h). Each input is a
// sequence of up to 8 calls of two clients, made through the session layer as the gRPC
// handlers make them: unary Gemm (some with a passed deadline or a cancelled client),
// GemmStream (headers and chunks; the client half-closes or cancels; the idle timeout or a
// drain may strike), UploadMatrix (header and chunks; closes, cancels, idles out),
// Release/List/Download. Dimensions are biased to boundaries (fuzz_util.h), handles come from
// earlier calls of the input, "", or fuzz bytes.
// Oracle: no crash, every call ends (no hang), the transport contract and C's size hold
// (session_harness.h), no status shows a wrapped number, a download has the matrix's size,
// and once every matrix of the input is released its clients hold no resident bytes (nothing
// leaked a quota reservation). Inputs stay independent.
// The wire itself (protobuf, reactors, status mapping) is transport_fuzz's.
#include <fuzzer/FuzzedDataProvider.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/fuzz/fuzz_requests.h"
#include "server/fuzz/session_harness.h"

namespace hgemm {
namespace {

using fuzz::Services;
using fuzz::Handle;
using fuzz::StreamChunk;
using fuzz::StreamHeader;
using fuzz::UnaryRequest;
using fuzz::UploadMessage;

// Mostly a deadline the call meets; sometimes one already passed.
Clock::time_point Deadline(FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? Clock::now() - std::chrono::milliseconds(1)
                                                   : Clock::now() + fuzz::kCallDeadline;
}

void Unary(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  v1::GemmRequest r;
  UnaryRequest(in, handles, &r);
  const Clock::time_point deadline = Deadline(in);
  const bool cancelled = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  std::string c;
  ResidentMatrix kept;
  absl::Status s = fuzz::RunGemm(client, r, deadline, cancelled, &c, &kept);
  fuzz::CheckMessage(s);
  if (s.ok() && r.keep_c_resident()) handles.push_back(kept.handle);
}

void Stream(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  fuzz::FuzzStream stream(client, Deadline(in));
  const int messages = in.ConsumeIntegralInRange<int>(0, 12);
  uint64_t offsets[4][3] = {};
  for (int i = 0; i < messages; ++i) {
    v1::GemmStreamRequest m;
    const uint64_t id = in.ConsumeIntegralInRange<uint64_t>(0, 3);
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:  // every GEMM waiting for a chunk has waited too long
        stream.session().ExpireIdle(Clock::now() + std::chrono::hours(1));
        continue;
      case 1:
        stream.session().Drain();
        continue;
      case 2:
      case 3:
      case 4:
      case 5: {
        StreamHeader(in, id, handles, offsets[id], m.mutable_header());
        break;
      }
      default: {
        StreamChunk(in, id, offsets[id], m.mutable_chunk());
      }
    }
    if (!stream.Deliver(m)) break;
  }
  stream.Close(/*cancel=*/in.ConsumeIntegralInRange<int>(0, 7) == 0);
  stream.Outcome().IgnoreError();  // checked in Finish
  for (const fuzz::FuzzStream::Done& done : stream.answers()) {
    if (!done.kept_c.empty()) handles.push_back(done.kept_c);
  }
}

void Upload(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  fuzz::FuzzUpload upload(client);
  const int messages = in.ConsumeIntegralInRange<int>(0, 6);
  uint32_t rows = fuzz::Dim(in), cols = fuzz::Dim(in);
  for (int i = 0; i < messages; ++i) {
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      upload.session().ExpireIdle(Clock::now() + std::chrono::hours(1));
      continue;
    }
    v1::UploadMatrixRequest m;
    UploadMessage(in, i == 0, rows, cols, &m);
    if (!upload.Deliver(m)) break;
  }
  upload.Close(/*cancel=*/in.ConsumeIntegralInRange<int>(0, 7) == 0);
  ResidentMatrix matrix;
  if (upload.Outcome(&matrix).ok()) handles.push_back(matrix.handle);
}

void Others(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  MatrixStore& store = Services().store;
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      int64_t freed = 0;
      fuzz::CheckMessage(store.Release(client, Handle(in, handles), &freed, /*admin=*/false));
      break;
    }
    case 1:
      store.List(client);
      store.ClientBytes(client);
      break;
    default: {  // what the DownloadMatrix reactor reads
      ResidentMatrix m;
      absl::Status s = store.Lookup(client, Handle(in, handles), "handle", &m);
      fuzz::CheckMessage(s);
      if (!s.ok()) break;
      std::string data(size_t(m.buffer->bytes), '\0');
      fuzz::CheckMessage(Services().backend->ReadResident(*m.buffer, data.data()));
      if (m.buffer->bytes != MatrixBytes(m.rows, m.cols, m.dtype)) {
        fuzz::Fail("a resident matrix of the wrong size", m.handle);
      }
    }
  }
}

// Releases every matrix of `client`; then its resident bytes must come back to 0 (a GEMM's
// reservation is given back on a scheduler thread, just after its answer).
void ReleaseAll(const std::string& client) {
  MatrixStore& store = Services().store;
  for (const ResidentMatrix& m : store.List(client)) {
    int64_t freed = 0;
    store.Release(client, m.handle, &freed, /*admin=*/false).IgnoreError();  // bytes checked below
  }
  const auto give_up = std::chrono::steady_clock::now() + fuzz::kCallDeadline;
  while (store.ClientBytes(client) != 0) {
    if (std::chrono::steady_clock::now() > give_up) {
      fuzz::Fail("resident bytes left after every matrix was released", client);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace
}  // namespace hgemm

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hgemm::fuzz::Services();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hgemm;
  FuzzedDataProvider in(data, size);
  std::vector<std::string> handles;
  for (int call = 0; call < 8 && in.remaining_bytes() > 0; ++call) {
    const std::string client = in.ConsumeBool() ? "fuzz-a" : "fuzz-b";
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: Unary(in, client, handles); break;
      case 1: Stream(in, client, handles); break;
      case 2: Upload(in, client, handles); break;
      default: Others(in, client, handles);
    }
  }
  ReleaseAll("fuzz-a");
  ReleaseAll("fuzz-b");
  return 0;
}
