// libFuzzer target: UploadMatrix message sequences through the session layer
// (session_harness.h: an UploadSession over a fake transport, as the UploadMatrix reactor
// drives it). Each input is a few uploads, each by a client of its own: headers with fuzzed
// fields, chunks of fuzzed sizes and contents, headers again, the idle timeout, early
// half-closes and cancellations.
// Besides "answered, no crash", the oracle: an upload that succeeds was exactly one header and
// then exactly rows·cols fp16 values, and reads back byte for byte; one that fails, or whose
// client cancelled, leaves its client no resident bytes once the call is over (its quota
// reservation and buffer are given back; a matrix its client never learned of is released).
#include <fuzzer/FuzzedDataProvider.h>

#include <string>

#include "server/fuzz/session_harness.h"

namespace hgemm {
namespace {

using fuzz::Services;

// Each upload is its own client, so that one upload's accounting can't hide in another's.
std::string NewClient() {
  static uint64_t uploads = 0;
  return "upload-fuzz-" + std::to_string(uploads++);
}

void Upload(FuzzedDataProvider& in) {
  const std::string client = NewClient();
  fuzz::FuzzUpload upload(client);
  const uint32_t rows = fuzz::Dim(in), cols = fuzz::Dim(in);
  const unsigned __int128 exact = fuzz::Bytes(rows, cols);
  int headers = 0;
  bool header_first = false, cancelled = false, expired = false;
  std::string sent;  // chunk bytes, in order
  const int messages = in.ConsumeIntegralInRange<int>(0, 10);
  for (int i = 0; i < messages && !cancelled; ++i) {
    v1::UploadMatrixRequest m;
    switch (in.ConsumeIntegralInRange<int>(0, 10)) {
      case 0:
      case 1: {
        v1::MatrixHeader* h = m.mutable_header();
        h->set_rows(rows);
        h->set_cols(cols);
        if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
          h->set_device_id(in.ConsumeIntegralInRange<int>(-2, 1));
        }
        h->set_ttl_seconds(in.ConsumeIntegralInRange<uint32_t>(0, 3600));
        if (in.ConsumeBool()) {
          h->set_label(std::string(in.ConsumeIntegralInRange<size_t>(0, 200), 'l'));
        }
        header_first = header_first || (i == 0);
        headers++;
        break;
      }
      case 2:
        cancelled = true;
        continue;
      case 3:  // no message came for longer than the idle timeout
        upload.session().ExpireIdle(Clock::now() + std::chrono::hours(1));
        expired = true;
        continue;
      default: {
        // Mostly what is left of the matrix, in one or a few pieces; sometimes any size.
        const size_t left = exact > sent.size()
                                ? size_t(std::min<unsigned __int128>(exact - sent.size(), 1 << 16))
                                : 0;
        size_t size = in.ConsumeBool() && left > 0 ? in.ConsumeIntegralInRange<size_t>(1, left)
                                                   : in.ConsumeIntegralInRange<size_t>(0, 4096);
        const char fill = char(in.ConsumeIntegral<uint8_t>() | 1);  // never all zeros
        std::string chunk(size, fill);
        for (size_t j = 0; j < chunk.size(); j += 97) chunk[j] = char(j);
        sent += chunk;
        m.set_chunk(std::move(chunk));
      }
    }
    if (!upload.Deliver(m)) break;
  }
  upload.Close(cancelled);
  ResidentMatrix matrix;
  const absl::Status s = upload.Outcome(&matrix);
  MatrixStore& store = Services().store;
  if (s.ok()) {
    if (cancelled || expired) fuzz::Fail("UploadMatrix accepted a cancelled or expired upload", "");
    if (headers != 1 || !header_first || exact != sent.size()) {
      fuzz::Fail("UploadMatrix accepted a malformed sequence", matrix.handle);
    }
    if (matrix.rows != rows || matrix.cols != cols || matrix.buffer->bytes != int64_t(exact)) {
      fuzz::Fail("UploadMatrix describes another matrix", matrix.handle);
    }
    std::string stored(sent.size(), '\0');
    if (!Services().backend->ReadResident(*matrix.buffer, stored.data()).ok() || stored != sent) {
      fuzz::Fail("the stored matrix differs from the upload", matrix.handle);
    }
    int64_t freed = 0;
    absl::Status released = store.Release(client, matrix.handle, &freed, /*admin=*/false);
    if (!released.ok()) fuzz::Fail("ReleaseMatrix of a fresh upload", released.ToString());
  }
  if (store.ClientBytes(client) != 0) {
    fuzz::Fail("resident bytes left after the call", s.ok() ? "after release" : s.ToString());
  }
}

}  // namespace
}  // namespace hgemm

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hgemm::fuzz::Services();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  for (int upload = 0; upload < 4 && in.remaining_bytes() > 0; ++upload) hgemm::Upload(in);
  return 0;
}
